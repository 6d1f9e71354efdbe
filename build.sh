#!/usr/bin/env bash
# Build dist/akm: one self-contained executable (a shiv zipapp) holding akm and
# its dependencies. Needs only python3 (>= 3.11) with pip: shiv itself is
# installed into a throwaway directory (no venv module needed). The zipapp runs
# on the CPython minor version it was built with. Byte-reproducible for the
# same interpreter and dependency versions.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "akm needs Python 3.11 or newer")'

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$work/shiv" "shiv>=1.0.4"

mkdir -p dist
# Reproducible: fixed timestamps inside the archive; the build id is derived from the content.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1767225600}"
PYTHONPATH="$work/shiv" "$PYTHON" -m shiv \
  --compressed \
  --reproducible \
  --compile-pyc \
  --python '/usr/bin/env python3' \
  --entry-point akm.cli:main \
  --output-file dist/akm.tmp \
  --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore --quiet \
  .
chmod +x dist/akm.tmp
mv dist/akm.tmp dist/akm
rm -rf build ./*.egg-info
echo "built dist/akm ($(du -h dist/akm | cut -f1))"
