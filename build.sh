#!/usr/bin/env bash
# Build dist/akm: one executable zipapp that runs on CPython 3.11+ (every minor version whose wheels
# exist, see bundle/pins.txt) on this machine's platform, or another with --platform. Needs python3
# (>= 3.11) with pip; wheels come from the configured package index into ~/.cache/akm-build
# (AKM_BUILD_CACHE), so a rebuild with unchanged pins needs no network. Byte-reproducible.
# Options: --platform linux-x86_64|linux-aarch64|macos-x86_64|macos-arm64, --relock, --output FILE.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "build.sh needs Python 3.11+ to run (the file it builds runs on 3.11+)")'
exec "$PYTHON" bundle/build.py "$@"
