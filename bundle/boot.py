"""akm's zipapp runtime (`_akm_boot.py` inside dist/akm; bundle/build.py fills in the constants).

Why not shiv's bootstrap: it extracted and byte-compiled the whole site-packages on first start
(seconds, tens of MB) and could only ever load the native extensions of one interpreter. Here pure
Python is imported straight from the archive (packages sit at its root), its compiled bytecode cached per interpreter in a
per-user cache (zipimport itself never caches and ignores __pycache__), and a native extension is
unpacked only when the running interpreter imports it (`_akm_unpack`, kept out of this module so a
warm start compiles as little as possible: this file is compiled from source on every start).
"""

import _imp
import marshal
import os
import sys
from zipimport import zipimporter

# --- build constants (replaced by bundle/build.py) ---
BUILD_ID = "0" * 64
TARGET = "linux-x86_64"
SYS_PLATFORM = "linux"
MACHINES = ("x86_64",)
PYTHONS = ("3.11",)
SUFFIXES = frozenset({".cpython-311-x86_64-linux-gnu.so"})
NATIVE = {}
# --- end of build constants ---

EXIT_CONFIG = 78  # akm.errors.EXIT_CONFIG: the environment, not a bug
ARCHIVE = os.path.dirname(os.path.abspath(__file__))
SUFFIX = _imp.extension_suffixes()[0]
MAGIC = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
CACHE_NAME = "akm-" + BUILD_ID[:16]
PYC_DIR = "pyc" + os.sep + sys.implementation.cache_tag + (".opt-%d" % sys.flags.optimize if sys.flags.optimize else "")


def fail(code, message):
    """Print a one-line error the way akm's CLI does and exit: never a traceback."""
    sys.stderr.write("error[%s]: %s\n" % (code, message))
    sys.stderr.flush()
    raise SystemExit(EXIT_CONFIG)


def check_interpreter():
    """Refuse an interpreter whose native extensions this file does not carry, before importing any."""
    machine = os.uname().machine
    if sys.platform != SYS_PLATFORM or machine not in MACHINES:
        fail("UNSUPPORTED_PLATFORM", "this akm was built for %s; this machine is %s %s (build one with "
             "./build.sh --platform)" % (TARGET, sys.platform, machine))
    if sys.implementation.name != "cpython" or SUFFIX not in SUFFIXES:
        fail("UNSUPPORTED_PYTHON", "akm runs on CPython %s-%s (%s); this is %s %d.%d (extension suffix %s) at %s"
             % (PYTHONS[0], PYTHONS[-1], TARGET, sys.implementation.name, sys.version_info[0],
                sys.version_info[1], SUFFIX, sys.executable))


def cache_roots():
    """Where this build's cache may live, best first, as (root, shared): SHIV_ROOT, else the XDG cache,
    else a private directory in the shared temp dir."""
    explicit = os.environ.get("SHIV_ROOT")
    if explicit:
        return [(os.path.abspath(os.path.expanduser(explicit)), False)]
    roots = []
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        roots.append((os.path.join(xdg, "akm"), False))
    else:
        home = os.path.expanduser("~")
        if os.path.isabs(home):
            sub = ("Library", "Caches") if sys.platform == "darwin" else (".cache",)
            roots.append((os.path.join(home, *sub, "akm"), False))
    roots.append((os.path.join(os.environ.get("TMPDIR") or "/tmp", "akm-%d" % os.getuid()), True))
    return roots


def is_private(root):
    """A root in the shared temp dir is used only if it is ours and nobody else can write to it
    (it holds code we load)."""
    try:
        st = os.lstat(root)
    except OSError:
        return False
    return st.st_uid == os.getuid() and (st.st_mode & 0o170022) == 0o040000  # a directory, not group/world-writable


_cache_dir = None  # this build's cache directory once found ("" while none exists)
_unwritable = False  # creating one failed: stop trying for bytecode, which works without a cache


def cache_dir():
    """This build's cache directory if one exists already (the warm path: one stat), else ""."""
    global _cache_dir
    if _cache_dir is None:
        _cache_dir = ""
        for root, shared in cache_roots():
            path = os.path.join(root, CACHE_NAME)
            if os.path.isdir(path) and (not shared or is_private(root)):
                _cache_dir = path
                break
    return _cache_dir


def writable_cache_dir(soft=False):
    """Create this build's cache directory on first need. Native code cannot load without one, so
    then (soft=False) no writable place is a clear error; bytecode (soft=True) just goes uncached."""
    global _cache_dir, _unwritable
    if cache_dir() or (soft and _unwritable):
        return _cache_dir
    import _akm_unpack

    path, problems = _akm_unpack.make_cache_dir(cache_roots(), CACHE_NAME)
    if path:
        _cache_dir = path
    elif soft:
        _unwritable = True
    else:
        fail("NO_CACHE_DIR", "akm needs a writable directory to unpack its native code for this Python; "
             "tried %s. Set SHIV_ROOT to a writable directory." % "; ".join(problems))
    return _cache_dir


def write_atomically(path, data):
    """Write a cache file so a concurrent reader sees the old file or the whole new one, never a part."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


class BundleImporter(zipimporter):
    """zipimport for the archive, plus a bytecode cache outside it.

    Also answers get_filename without compiling: zipimport's own get_filename compiles the module
    only to throw the code away, and the import system calls it for every module it finds.
    """

    def _source(self, fullname):
        base = self.prefix + fullname.rpartition(".")[2]
        return base + (os.sep + "__init__.py" if self.is_package(fullname) else ".py")

    def get_filename(self, fullname):
        return self.archive + os.sep + self._source(fullname)

    def get_code(self, fullname):
        if fullname.startswith("_akm_"):  # the runtime itself: cold paths, and they create the cache
            return super().get_code(fullname)
        rel = self._source(fullname)
        origin = self.archive + os.sep + rel
        cached = cache_dir()
        pyc = os.path.join(cached, PYC_DIR, rel + "c") if cached else None
        if pyc:
            try:
                with open(pyc, "rb") as f:
                    data = f.read()
                if data[:4] == MAGIC:
                    return marshal.loads(memoryview(data)[16:])
            except (OSError, ValueError, EOFError, TypeError):
                pass
        try:
            source = self.get_data(origin)
        except OSError:
            return super().get_code(fullname)
        code = compile(source, origin, "exec", dont_inherit=True)
        # PYTHONDONTWRITEBYTECODE is not consulted: this is akm's cache of its own archive (as shiv's
        # extraction was), and without it every start would compile everything it imports again.
        cached = cached or writable_cache_dir(soft=True)
        if cached:
            pyc = os.path.join(cached, PYC_DIR, rel + "c")
            write_atomically(pyc, MAGIC + b"\0" * 12 + marshal.dumps(code))
        return code


def path_hook(path):
    if path == ARCHIVE or path.startswith(ARCHIVE + os.sep):
        return BundleImporter(path)
    raise ImportError("not in akm's bundle")


class NativeFinder:
    """Finds the bundled native extensions of the running interpreter, unpacking one on first import."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        abi3 = NATIVE.get(fullname)
        if abi3 is None:
            return None
        rel = fullname.replace(".", os.sep) + (".abi3.so" if abi3 else SUFFIX)
        cached = cache_dir()
        file = os.path.join(cached, "native", rel) if cached else ""
        if not file or not os.path.exists(file):
            import _akm_unpack

            file = _akm_unpack.unpack_native(writable_cache_dir(), rel)
        from importlib.machinery import ExtensionFileLoader, ModuleSpec

        spec = ModuleSpec(fullname, ExtensionFileLoader(fullname, file), origin=file)
        spec.has_location = True
        return spec


def isolated(path):
    """Drop what `site` appended (site-packages, .pth entries): akm runs on its bundled libraries only,
    so a package installed on the machine can neither shadow nor stand in for a bundled one."""
    for i, entry in enumerate(path):
        if os.path.basename(entry) == "lib-dynload":
            return path[: i + 1]
    return path


def main():
    check_interpreter()
    sys.path[:] = [ARCHIVE] + isolated([p for p in sys.path if p != ARCHIVE])
    sys.path_hooks.insert(0, path_hook)
    sys.path_importer_cache[ARCHIVE] = BundleImporter(ARCHIVE)
    sys.meta_path.insert(0, NativeFinder)
    script = os.environ.get("AKM_BUNDLE_EXEC")
    if script:  # hidden hook for tests and debugging: run a script on the bundled libraries
        import runpy

        sys.argv[:] = [script] + sys.argv[1:]
        runpy.run_path(script, run_name="__main__")
        return
    from akm.cli import main as cli_main

    sys.exit(cli_main())
