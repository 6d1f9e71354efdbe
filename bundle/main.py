# akm launcher, the zipapp's __main__.py (bundle/build.py fills in BUILD). Compiled from source on
# every start, so it is kept this small; it must parse on old Pythons (no f-strings or annotations).
# It refuses an old interpreter, finds this build's cache ($AKM_CACHE_DIR or its old name $SHIV_ROOT,
# else the XDG cache, else a private dir in the temp dir) and runs the runtime _akm_boot from its
# cached bytecode there, compiling it only when that is missing. A multiprocessing child (spawn,
# forkserver) runs this file again as __mp_main__: the runtime then only installs the bundle.
import sys

if sys.version_info < (3, 11):
    sys.stderr.write("error[UNSUPPORTED_PYTHON]: akm needs Python 3.11+; this is %d.%d at %s\n"
                     % (sys.version_info[0], sys.version_info[1], sys.executable or "(unknown interpreter)"))
    sys.exit(78)

import marshal
import os

# --- build constants (replaced by bundle/build.py) ---
BUILD = "0000000000000000"
# --- end of build constants ---


def run(env=os.environ, join=os.path.join):
    archive = os.path.dirname(os.path.abspath(__file__))
    magic = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
    pyc = join("pyc", sys.implementation.cache_tag + (".opt-%d" % sys.flags.optimize if sys.flags.optimize else ""))
    home = os.path.expanduser("~")
    xdg = env.get("XDG_CACHE_HOME", "")
    tmp = os.path.abspath(join(env.get("TMPDIR") or "/tmp", "akm-%d" % os.getuid()))
    chosen = env.get("AKM_CACHE_DIR") or env.get("SHIV_ROOT")
    if chosen:
        roots = [(os.path.abspath(os.path.expanduser(chosen)), False)]
    elif os.path.isabs(xdg) or os.path.isabs(home):
        user = join(xdg, "akm") if os.path.isabs(xdg) else join(home, "Library/Caches/akm" if sys.platform == "darwin"
                                                                 else ".cache/akm")
        roots = [(user, False), (tmp, True)]
    else:
        roots = [(tmp, True)]
    cache = code = None
    for root, shared in roots:
        path = join(root, "akm-" + BUILD)
        if os.path.isdir(path):
            st = os.lstat(root)  # the temp dir is shared: only a private dir of ours holds code we load
            if not shared or (st.st_uid == os.getuid() and st.st_mode & 0o170022 == 0o040000):
                cache = path
            break
    if cache:
        try:
            with open(join(cache, pyc, "_akm_boot.pyc"), "rb") as f:
                data = f.read()
            if data[:4] == magic:
                code = marshal.loads(memoryview(data)[16:])
        except (OSError, ValueError, EOFError, TypeError):
            pass
    boot = type(sys)("_akm_boot")
    boot.__file__ = join(archive, "_akm_boot.py")
    # The archive's members are read by name: the zipimporter knows the archive by the path Python was
    # given (e.g. /w/./dist/akm for `./dist/akm`), which need not match the normalized `archive`.
    fresh = None if code else compile(__loader__.get_data("_akm_boot.py"), boot.__file__, "exec", dont_inherit=True)
    sys.modules["_akm_boot"] = boot
    exec(code or fresh, boot.__dict__)
    return boot.main(ARCHIVE=archive, CACHE=cache or "", ROOTS=roots, BUILD=BUILD, MAGIC=magic, PYC=pyc,
                     ZIP=__loader__, BOOT_CODE=fresh, NAME=__name__)


globals().update(run() or ())  # as __mp_main__: the names of the script a child re-runs (AKM_BUNDLE_EXEC)
