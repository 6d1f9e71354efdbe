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

# Fast start: once this build's site-packages are extracted (first run), go straight to
# akm.cli instead of through shiv's bootstrap, which imports compileall, multiprocessing
# and friends on every start (~15 ms). Anything unusual falls back to shiv's own path.
"$PYTHON" - dist/akm.tmp <<'PY'
import json, sys, zipfile

path = sys.argv[1]
raw = open(path, "rb").read()
shebang, _, body = raw.partition(b"\n")
src = zipfile.ZipFile(path)
build_id = json.loads(src.read("environment.json"))["build_id"]
launcher = f"""# akm launcher (written by build.sh): fast path once extracted, else shiv's bootstrap.
import os, sys


def _fast():
    if any(os.environ.get(k) for k in ("SHIV_FORCE_EXTRACT", "SHIV_INTERPRETER", "SHIV_ENTRY_POINT",
                                       "SHIV_MODULE", "SHIV_CONSOLE_SCRIPT", "SHIV_PREPEND_PYTHONPATH")):
        return False
    root = os.path.expanduser(os.environ.get("SHIV_ROOT") or "~/.shiv")
    name = os.path.basename(os.path.realpath(sys.argv[0]))
    site_packages = os.path.join(root, name + "_{build_id}", "site-packages")
    if not os.path.isdir(site_packages):
        return False
    import site
    before = len(sys.path)
    site.addsitedir(site_packages)
    sys.path[:] = sys.path[before:] + sys.path[:before]  # ours first, like shiv
    from akm.cli import main
    sys.exit(main())


if not _fast():
    import _bootstrap
    _bootstrap.bootstrap()
"""
out_path = path + ".fast"
with zipfile.ZipFile(out_path + ".zip", "w") as out:
    for info in src.infolist():
        data = launcher.encode() if info.filename == "__main__.py" else src.read(info.filename)
        out.writestr(info, data, compress_type=info.compress_type)
src.close()
with open(out_path, "wb") as f:
    f.write(shebang + b"\n" + open(out_path + ".zip", "rb").read())
import os
os.remove(out_path + ".zip")
os.replace(out_path, path)
PY
chmod +x dist/akm.tmp
mv dist/akm.tmp dist/akm
rm -rf build ./*.egg-info
echo "built dist/akm ($(du -h dist/akm | cut -f1))"
