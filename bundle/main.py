# akm launcher (the zipapp's __main__.py, written by bundle/build.py).
# Any Python that finds this file on PATH may run it, so it must parse on old ones:
# no f-strings, no annotations, nothing newer than Python 2.7 / 3.0 syntax.
import sys

if sys.version_info < (3, 11):
    sys.stderr.write(
        "error[UNSUPPORTED_PYTHON]: akm needs Python 3.11+; this is %d.%d at %s\n"
        % (sys.version_info[0], sys.version_info[1], sys.executable or "(unknown interpreter)")
    )
    sys.exit(78)

import _akm_boot

_akm_boot.main()
