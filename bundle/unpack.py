"""Cold paths of akm's zipapp runtime (`_akm_unpack.py` inside dist/akm; bundle/build.py fills in MEMBERS).

Imported only when this build has no cache directory yet or a native extension of the running
interpreter is not unpacked yet. Native extensions travel as xz streams (`_akm_natives/*.xz`): one
stream per extension holding every interpreter's build of it back to back, since builds of one
extension for different CPython versions are mostly alike and compress to about half together.
"""

import hashlib
import os
import sys

import _akm_boot

# --- build constants (replaced by bundle/build.py) ---
# relative path of an unpacked extension -> (stream in _akm_natives/, offset and size in the
# decompressed stream, sha256 of the file)
MEMBERS = {}
# --- end of build constants ---


def make_cache_dir(roots, name):
    """Create `name` under the first usable root; returns (path, []) or ("", what went wrong where)."""
    problems = []
    for root, shared in roots:
        path = os.path.join(root, name)
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            if shared and not _is_private(root):
                problems.append("%s: not a private directory of this user" % root)
                continue
            os.makedirs(path, mode=0o700, exist_ok=True)
            if not os.access(path, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as exc:
            problems.append("%s: %s" % (path, exc.strerror or exc))
            continue
        return path, []
    return "", problems


def _is_private(root):
    """The shared temp dir's root must be this user's and not writable by others: it holds code we load."""
    st = os.lstat(root)
    return st.st_uid == os.getuid() and (st.st_mode & 0o170022) == 0o040000


def unpack_native(cache, rel):
    """Write the running interpreter's build of one extension into the cache; returns its path."""
    stream, offset, size, sha256 = MEMBERS[rel]
    try:
        import lzma
    except ImportError:
        _akm_boot.fail("NO_LZMA", "akm needs Python's lzma module to unpack its native code, and %s was built "
                       "without it (liblzma missing when Python was compiled)" % sys.executable)
    try:
        blob = _akm_boot.ZIP.get_data("_akm_natives/" + stream)
        data = _slice(lzma.LZMADecompressor(format=lzma.FORMAT_XZ), blob, offset, size)
    except (OSError, ImportError, lzma.LZMAError, EOFError) as exc:
        _akm_boot.damaged("native code for %s cannot be unpacked (%s)" % (rel, exc))
    if hashlib.sha256(data).hexdigest() != sha256:
        _akm_boot.damaged("native code for %s does not match its checksum" % rel)
    path = os.path.join(cache, "native", rel)
    _akm_boot.write_atomically(path, data)
    if os.path.exists(path):
        return path
    # The cache found at start-up exists but takes no new file (a read-only mount, another user's, filled
    # by another interpreter): a later root may still serve, as it would have had that one been absent.
    problems = ["%s: cannot write there" % path]
    name = os.path.basename(cache)
    later = [i for i, (root, _shared) in enumerate(_akm_boot.ROOTS) if os.path.join(root, name) == cache]
    if later:
        fallback, more = make_cache_dir(_akm_boot.ROOTS[later[0] + 1:], name)
        problems += more
        if fallback:
            _akm_boot.CACHE = fallback
            path = os.path.join(fallback, "native", rel)
            _akm_boot.write_atomically(path, data)
            if os.path.exists(path):
                return path
            problems.append("%s: cannot write there" % path)
    _akm_boot.fail("NO_CACHE_DIR", "akm needs a writable directory to unpack its native code for this Python; "
                   "tried %s. Set AKM_CACHE_DIR to a writable directory." % "; ".join(problems))


def prune(root, keep):
    """Remove the cache directories of other builds under `root` that no process is using: every akm
    process holds a shared lock on its build's `lock` file, so an exclusive one means none runs.
    Under that lock the directory is renamed away (a process of that build starting now sees it gone
    and makes it again), then deleted. A directory without a lock file is from a runtime older than
    pruning; it is removed too (such a process still running makes again what it misses). While one
    is in use, `prune-pending` in this build's directory makes every start try again."""
    import fcntl
    import shutil

    try:
        names = os.listdir(root)
    except OSError:
        return
    busy = 0
    for name in names:
        path = os.path.join(root, name)
        if name.startswith(".akm-") and name.endswith(".trash"):  # left by a pruner that was killed
            shutil.rmtree(path, ignore_errors=True)
            continue
        if name == keep or not _is_build_dir(name) or not os.path.isdir(path) or os.path.islink(path):
            continue
        fd = None
        try:
            fd = os.open(os.path.join(path, "lock"), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        except OSError:
            continue
        trash = os.path.join(root, ".%s.%d.trash" % (name, os.getpid()))
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(path, trash)
        except BlockingIOError:  # a process of that build runs
            busy += 1
            continue
        except OSError:  # not ours to remove (e.g. a read-only root): not retried either
            continue
        finally:
            if fd is not None:
                os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
    pending = os.path.join(root, keep, "prune-pending")
    if busy:
        _akm_boot.write_atomically(pending, b"")
    elif os.path.exists(pending):
        try:
            os.unlink(pending)
        except OSError:
            pass


def _is_build_dir(name):
    tail = name[4:]
    return name.startswith("akm-") and len(tail) == 16 and all(c in "0123456789abcdef" for c in tail)


def materialize(rel):
    """A bundled file or directory (with everything under it) as real files in this build's cache,
    written once; its path, or None when there is no cache to write to."""
    import pathlib

    cache = _akm_boot.writable_cache(soft=True)
    if not cache:
        return None
    if _akm_boot.INDEX.get(rel):
        files = [rel]
    else:  # each file checked: a process killed while writing a directory leaves it partly written
        files = [k for k, v in _akm_boot.INDEX.items() if v and k.startswith(rel + "/")]
    for key in files:
        dest = os.path.join(cache, "files", key)
        if not os.path.exists(dest):
            _akm_boot.write_atomically(dest, _akm_boot.read(key))
    target = os.path.join(cache, "files", rel)
    return pathlib.Path(target) if os.path.exists(target) else None  # None: a cache that takes no new file


def _slice(decompressor, blob, offset, size):
    """Bytes [offset, offset + size) of a decompressed stream, decoding no further than needed."""
    out = bytearray()
    pos, end, data = 0, offset + size, blob
    while pos < end:
        chunk = decompressor.decompress(data, max_length=1 << 20)  # small steps: little decoded past the end
        data = b""
        if not chunk and (decompressor.eof or decompressor.needs_input):
            break
        lo, hi = max(offset - pos, 0), min(end - pos, len(chunk))
        if hi > lo:
            out += chunk[lo:hi]
        pos += len(chunk)
    return bytes(out)
