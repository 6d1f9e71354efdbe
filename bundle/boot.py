"""akm's zipapp runtime: `_akm_boot.py` in dist/akm, run by its __main__.py (bundle/main.py), which
calls main() with ARCHIVE, CACHE (this build's cache dir, "" until it exists), ROOTS (where it may be created,
best first, as (root, is the shared temp dir)), BUILD, MAGIC, PYC (bytecode dir for this interpreter),
ZIP (the archive's zipimporter), BOOT_CODE (this module's code when it was compiled, to cache) and NAME
(__main__, or __mp_main__ in a multiprocessing child that runs the archive again).

Why not shiv's bootstrap: it extracted and byte-compiled the whole site-packages on first start
(seconds, tens of MB) and only ever had one interpreter's native extensions. Here:
- pure Python is read straight from the archive: the packages sit in an inner zip (`_akm_lib.zip`,
  stored) that only this module indexes (`_akm_index.bin`), so Python's own start-up reads a
  central directory of a handful of entries, not a thousand (that alone cost as much as starting
  Python); their compiled bytecode is cached per interpreter in this build's cache directory;
- a native extension is unpacked into the cache only when the running interpreter imports it
  (`_akm_unpack`, which holds every cold path);
- the packages' metadata and data files are served from the archive too (importlib.metadata entry
  points, importlib.resources files; a file that must be a real path, e.g. certifi's CA bundle through
  importlib.resources.as_file, is written once into the cache);
- pkgutil lists the bundled modules (a path hook for the archive's directories), and multiprocessing
  children (spawn, forkserver) run the archive again, which installs the bundle in them;
- every process holds a shared lock on its build's cache directory, so the first start of a new build
  can remove the caches of other builds that no process is using.
"""

import _imp
import marshal
import os
import sys

# --- build constants (replaced by bundle/build.py) ---
TARGET = "linux-x86_64"
SYS_PLATFORM = "linux"
MACHINES = ("x86_64",)
PYTHONS = ("3.11",)
SUFFIXES = frozenset({".cpython-311-x86_64-linux-gnu.so"})
NATIVE = {}
# --- end of build constants ---

# Set by main() from what __main__ found (see the module docstring).
ARCHIVE = CACHE = BUILD = PYC = NAME = ""
ROOTS = []
MAGIC = b""
ZIP = BOOT_CODE = None

EXIT_CONFIG = 78  # akm.errors.EXIT_CONFIG: the environment, not a bug
SUFFIX = _imp.extension_suffixes()[0]
ModuleSpec = sys.modules["_frozen_importlib"].ModuleSpec
INDEX = {}  # path in the library -> (offset in the archive, stored size, size, zip method, crc32); directories -> None
_fd = None
_unwritable = False
_tree = None
_dist_class = None
_lock = None  # the open lock file of this build's cache directory, held while the process lives


def fail(code, message):
    """Print a one-line error the way akm's CLI does and exit: never a traceback."""
    sys.stderr.write("error[%s]: %s\n" % (code, message))
    sys.stderr.flush()
    raise SystemExit(EXIT_CONFIG)


def damaged(what):
    """The archive is not what the build wrote (cut short by a download, a bit flipped on disk)."""
    fail("CORRUPT_BUNDLE", "%s is damaged: %s; download or build it again" % (ARCHIVE, what))


def check_interpreter():
    """Refuse an interpreter whose native extensions this file does not carry, before importing any."""
    machine = os.uname().machine
    if sys.platform != SYS_PLATFORM or machine not in MACHINES:
        fail("UNSUPPORTED_PLATFORM", "this akm was built for %s; this machine is %s %s (build one for it with "
             "./build.sh --platform)" % (TARGET, sys.platform, machine))
    if sys.implementation.name != "cpython" or SUFFIX not in SUFFIXES:
        fail("UNSUPPORTED_PYTHON", "akm runs on CPython %s-%s (%s); this is %s %d.%d (extension suffix %s) at %s"
             % (PYTHONS[0], PYTHONS[-1], TARGET, sys.implementation.name, sys.version_info[0],
                sys.version_info[1], SUFFIX, sys.executable))


def writable_cache(soft):
    """This build's cache directory, created on first need. Native code cannot load without one, so
    then (soft=False) no writable place is a clear error; bytecode (soft=True) just goes uncached."""
    global CACHE, _unwritable
    if CACHE or (soft and _unwritable):
        return CACHE
    import _akm_unpack

    path, problems = _akm_unpack.make_cache_dir(ROOTS, "akm-" + BUILD)
    if path:
        CACHE = path
        if hold(path):
            _akm_unpack.prune(os.path.dirname(path), os.path.basename(path))
        if BOOT_CODE is not None:
            write_code(os.path.join(path, PYC, "_akm_boot.pyc"), BOOT_CODE)
    elif soft:
        _unwritable = True
    else:
        fail("NO_CACHE_DIR", "akm needs a writable directory to unpack its native code for this Python; tried "
             "%s. Set AKM_CACHE_DIR to a writable directory." % "; ".join(problems))
    return CACHE


def hold(cache):
    """Take a shared lock on the cache directory's `lock` file for the life of this process (children
    forked from it share it): a pruner takes it exclusively, so it never removes a cache in use.
    False when the directory is being removed right now, or was since it was found: then it is not
    ours to use (it is made again on first need)."""
    global _lock
    import fcntl

    lock = os.path.join(cache, "lock")
    try:
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return os.path.isdir(cache)  # a cache that takes no file (read-only): no pruner can remove it either
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(lock)):  # not renamed away before we locked it
            if _lock is not None:
                os.close(_lock)
            _lock = fd
            return True
    except OSError:
        pass
    os.close(fd)
    return False


def write_atomically(path, data):
    """A reader sees the old file or the whole new one, never a part; failure leaves nothing behind."""
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


def write_code(path, code):
    write_atomically(path, MAGIC + b"\0" * 12 + marshal.dumps(code))


def read(rel):
    """A file of the library, from the archive."""
    global _fd
    offset, stored, _size, method, crc = INDEX[rel]
    if _fd is None:
        _fd = os.open(ARCHIVE, os.O_RDONLY)
    data = os.pread(_fd, stored, offset)
    import zlib

    try:
        if method:
            data = zlib.decompress(data, -15)
    except zlib.error as exc:
        damaged("%s cannot be decompressed (%s)" % (rel, exc))
    # Checked, unlike zipimport: compiled code is cached per build, so damaged source that still
    # compiles would outlive the damaged file.
    if zlib.crc32(data) != crc:
        damaged("%s does not match its checksum" % rel)
    return data


def locate(fullname):
    """(path of the module's source in the library, is a package), or None."""
    base = fullname.replace(".", "/")
    if base + "/__init__.py" in INDEX:
        return base + "/__init__.py", True
    if base + ".py" in INDEX:
        return base + ".py", False
    return None


def children(rel):
    global _tree
    if _tree is None:
        tree = {}
        for key in INDEX:
            parent, _, name = key.rstrip("/").rpartition("/")
            tree.setdefault(parent, set()).add(name)
        _tree = tree
    return sorted(_tree.get(rel, ()))


class NativeLoader(sys.modules["_frozen_importlib_external"].ExtensionFileLoader):
    """Loads an unpacked extension; a failure to load one is the machine's, so it says which and why."""

    def create_module(self, spec):
        try:
            return super().create_module(spec)
        except ImportError as exc:
            fail("NATIVE_LOAD_FAILED", "cannot load %s (%s); if its directory is on a filesystem mounted noexec, "
                 "set AKM_CACHE_DIR to one that is not" % (self.path, exc))


class Bundle:
    """The meta-path finder and loader of everything bundled: native extensions of the running
    interpreter (unpacked on first import) and the pure-Python library."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        abi3 = NATIVE.get(fullname)
        if abi3 is not None:
            return cls.native_spec(fullname, abi3)
        found = locate(fullname)
        if found is None:
            base = fullname.replace(".", "/")
            if base + "/" in INDEX:  # a namespace package (no __init__.py), e.g. opentelemetry
                spec = ModuleSpec(fullname, None, is_package=True)
                spec.submodule_search_locations = [os.path.join(ARCHIVE, base)]
                return spec
            return None
        rel, package = found
        spec = ModuleSpec(fullname, cls, origin=os.path.join(ARCHIVE, rel), is_package=package)
        spec.has_location = True
        if package:
            spec.submodule_search_locations = [os.path.join(ARCHIVE, rel.rpartition("/")[0])]
        return spec

    @staticmethod
    def native_spec(fullname, abi3):
        rel = fullname.replace(".", "/") + (".abi3.so" if abi3 else SUFFIX)
        file = os.path.join(CACHE, "native", rel) if CACHE else ""
        if not file or not os.path.exists(file):
            import _akm_unpack

            file = _akm_unpack.unpack_native(writable_cache(soft=False), rel)
        spec = ModuleSpec(fullname, NativeLoader(fullname, file), origin=file)
        spec.has_location = True
        return spec

    @staticmethod
    def create_module(spec):
        return None

    @classmethod
    def exec_module(cls, module):
        exec(cls.get_code(module.__spec__.name), module.__dict__)

    @staticmethod
    def get_code(fullname):
        rel = locate(fullname)[0]
        pyc = os.path.join(CACHE, PYC, rel + "c") if CACHE else ""
        if pyc:
            try:
                with open(pyc, "rb") as f:
                    data = f.read()
                if data[:4] == MAGIC:
                    return marshal.loads(memoryview(data)[16:])
            except (OSError, ValueError, EOFError, TypeError):
                pass
        code = compile(read(rel), os.path.join(ARCHIVE, rel), "exec", dont_inherit=True)
        # PYTHONDONTWRITEBYTECODE is not consulted: this is akm's cache of its own archive (as shiv's
        # extraction was), and without it every start would compile everything it imports again.
        if writable_cache(soft=True):
            write_code(os.path.join(CACHE, PYC, rel + "c"), code)
        return code

    @staticmethod
    def get_source(fullname):
        found = locate(fullname)
        return read(found[0]).decode("utf-8") if found else None

    @staticmethod
    def is_package(fullname):
        found = locate(fullname)
        if found is None:
            raise ImportError("no module named %r in akm's bundle" % fullname, name=fullname)
        return found[1]

    @staticmethod
    def get_filename(fullname):
        return os.path.join(ARCHIVE, locate(fullname)[0])

    @staticmethod
    def get_data(path):
        rel = os.path.relpath(path, ARCHIVE) if os.path.isabs(path) else path
        if INDEX.get(rel):
            return read(rel)
        with open(path, "rb") as f:
            return f.read()

    @staticmethod
    def get_resource_reader(fullname):
        found = locate(fullname)
        return Resources(found[0].rpartition("/")[0]) if found and found[1] else None

    @staticmethod
    def find_distributions(context=None):
        """importlib.metadata's hook: the bundled distributions' dist-info, e.g. for entry points."""
        global _dist_class
        if _dist_class is None:
            import importlib.metadata

            class BundledDistribution(importlib.metadata.Distribution):
                def __init__(self, info):
                    self.info = info

                def read_text(self, filename):
                    rel = self.info + "/" + str(filename)
                    return read(rel).decode("utf-8") if INDEX.get(rel) else None

                def locate_file(self, path):
                    return os.path.join(ARCHIVE, str(path))

            _dist_class = BundledDistribution
        wanted = getattr(context, "name", None)
        wanted = normalize(wanted) if wanted else None
        for key in children(""):
            if key.endswith(".dist-info") and (wanted is None or normalize(key.partition("-")[0]) == wanted):
                yield _dist_class(key)


def normalize(name):
    out, sep = [], False
    for ch in name.lower():
        if ch in "-_.":
            sep = True
        else:
            if sep and out:
                out.append("_")
            out.append(ch)
            sep = False
    return "".join(out)


class Resources:
    """importlib.resources' reader for a bundled package."""

    def __init__(self, rel):
        self.rel = rel

    def files(self):
        global _as_file
        if _as_file is None:  # importlib.resources is imported by now: it is what calls files()
            _as_file = getattr(sys.modules.get("importlib.resources"), "as_file", None)
            if hasattr(_as_file, "register"):  # a functools.singledispatch function (3.11+)
                _as_file.register(Entry, entry_as_file)
        return Entry(self.rel)


_as_file = None


def entry_as_file(entry):
    """importlib.resources.as_file for a bundled file or directory: its copy in this build's cache,
    written once (rather than a temporary copy per process, which a killed process leaves behind,
    e.g. for every certifi.where()). Without a cache, importlib's temporary copy."""
    import contextlib

    import _akm_unpack

    path = _akm_unpack.materialize(entry.rel)
    if path is None:
        return _as_file.dispatch(object)(entry)
    return contextlib.nullcontext(path)


class Entry:
    """A file or directory of the library, as importlib.resources.abc.Traversable."""

    def __init__(self, rel):
        self.rel = rel.strip("/")

    @property
    def name(self):
        return self.rel.rpartition("/")[2]

    def is_dir(self):
        return self.rel + "/" in INDEX

    def is_file(self):
        return bool(INDEX.get(self.rel))

    def iterdir(self):
        return iter([Entry(self.rel + "/" + name) for name in children(self.rel)])

    def joinpath(self, *descendants):
        parts = [self.rel] + [p for d in descendants for p in str(d).split("/") if p]
        return Entry("/".join(parts))

    def __truediv__(self, child):
        return self.joinpath(child)

    def read_bytes(self):
        if not self.is_file():
            raise FileNotFoundError(os.path.join(ARCHIVE, self.rel))
        return read(self.rel)

    def read_text(self, encoding=None, errors=None):
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def open(self, mode="r", *args, **kwargs):
        import io

        stream = io.BytesIO(self.read_bytes())
        return stream if "b" in mode else io.TextIOWrapper(stream, *args, **kwargs)

    def __str__(self):
        return os.path.join(ARCHIVE, self.rel)

    def __repr__(self):
        return "<akm bundle entry %s>" % self.rel


class Directory:
    """The path-entry finder of a directory of the library (sys.path_hooks), for what walks `__path__`
    rather than importing: pkgutil.iter_modules / walk_packages list its modules as they would list
    an installed package's; importing still goes through Bundle, first on sys.meta_path."""

    def __init__(self, path):
        path = os.path.abspath(path)
        rel = os.path.relpath(path, ARCHIVE) if path == ARCHIVE or path.startswith(ARCHIVE + os.sep) else None
        if rel is None or (rel != "." and rel + "/" not in INDEX):
            raise ImportError("not a directory of akm's bundle", path=path)
        self.path, self.rel = path, "" if rel == "." else rel

    def find_spec(self, fullname, target=None):
        spec = Bundle.find_spec(fullname)
        if spec is not None and fullname.rpartition(".")[0].replace(".", "/") == self.rel:
            return spec
        if not self.rel:  # the archive itself also holds the runtime's own modules (_akm_unpack)
            return ZIP.find_spec(fullname, target)
        return None

    @staticmethod
    def invalidate_caches():
        pass

    def iter_modules(self, prefix=""):
        """(name, is a package) of each module in this directory, as pkgutil wants them."""
        found = {}
        for name in children(self.rel):
            rel = self.rel + "/" + name if self.rel else name
            if name.endswith(".py") and name != "__init__.py":
                found[name[:-3]] = False
            elif rel + "/__init__.py" in INDEX:
                found[name] = True
        for module in NATIVE:
            parent, _, leaf = module.rpartition(".")
            if parent.replace(".", "/") == self.rel:
                found[leaf] = False
        for name, package in sorted(found.items()):
            if name.isidentifier():
                yield prefix + name, package


def isolated(path):
    """Drop what `site` appended (site-packages, .pth entries): akm runs on its bundled libraries only,
    so a package installed on the machine can neither shadow nor stand in for a bundled one."""
    for i, entry in enumerate(path):
        if os.path.basename(entry) == "lib-dynload":
            return path[: i + 1]
    return path


def evict_installed():
    """Forget bundled packages that a `.pth` file imported from site-packages before we ran (e.g. a
    certifi patched at start-up): the bundle's copy must serve, as for every other import."""
    prefix = ARCHIVE + os.sep
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        if top + "/" in INDEX or top + ".py" in INDEX:
            where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or ()), "")
            if not str(where).startswith(prefix):  # (a namespace package of ours has only a __path__)
                del sys.modules[name]


def run_script(script, name):
    """Run a script on the bundled libraries (AKM_BUNDLE_EXEC) as module `name`; returns its namespace.
    Its `__file__` is the archive: multiprocessing re-runs `__main__.__file__` in a spawned child,
    and the archive is what installs the bundle there before running the script again."""
    try:
        with open(script, "rb") as f:
            code = compile(f.read(), script, "exec", dont_inherit=True)
    except OSError as exc:
        fail("NO_SCRIPT", "cannot read AKM_BUNDLE_EXEC script %s (%s)" % (script, exc.strerror or exc))
    module = type(sys)(name)
    module.__file__, module.__spec__, module.__loader__ = ARCHIVE, None, None
    if name == "__main__":
        sys.modules["__main__"] = module
    exec(code, module.__dict__)
    return module.__dict__


def main(**found):
    global CACHE
    globals().update(found)
    check_interpreter()
    try:  # members by name, not path: ZIP knows the archive by the path Python was given (see main.py)
        INDEX.update(marshal.loads(ZIP.get_data("_akm_index.bin")))
    except (OSError, ImportError, ValueError, EOFError, TypeError) as exc:
        damaged("its index of bundled files cannot be read (%s)" % exc)
    sys.path[:] = isolated(sys.path)
    evict_installed()
    ours = lambda hook: getattr(hook, "__module__", None) == "_akm_boot"  # noqa: E731 (also an earlier run's)
    sys.meta_path[:] = [Bundle] + [f for f in sys.meta_path if not ours(f)]
    sys.path_hooks[:] = [Directory] + [h for h in sys.path_hooks if not ours(h)]
    for entry in sys.path:
        if entry == ARCHIVE or os.path.abspath(entry) == ARCHIVE:  # also as given, e.g. /w/./dist/akm
            sys.path_importer_cache[entry] = Directory(ARCHIVE)
    if CACHE and not hold(CACHE):
        CACHE = ""
    if CACHE and os.path.exists(os.path.join(CACHE, "prune-pending")):  # another build's cache was in use
        import _akm_unpack

        _akm_unpack.prune(os.path.dirname(CACHE), os.path.basename(CACHE))
    if BOOT_CODE is not None and CACHE:
        write_code(os.path.join(CACHE, PYC, "_akm_boot.pyc"), BOOT_CODE)
    script = os.environ.get("AKM_BUNDLE_EXEC")
    if NAME == "__mp_main__":  # a spawned multiprocessing child: the bundle is installed, that is all
        return {k: v for k, v in run_script(script, NAME).items() if not k.startswith("__")} if script else None
    # Children re-run `__main__.__file__` (spawn, forkserver): as for `python script.py`, that is the archive.
    main_module = sys.modules["__main__"]
    main_module.__spec__, main_module.__file__ = None, ARCHIVE
    if script:  # hidden hook for tests and debugging: run a script on the bundled libraries
        sys.argv[:] = [script] + sys.argv[1:]
        run_script(script, "__main__")
        return None
    from akm.cli import run as cli_run

    cli_run()
