"""Supervise one child process: spawn, capture, time out, cancel, kill the group.

Exec units and agent CLIs both run through `run_process`; what differs between
them (how the argv and environment are built, what the output means, which
failure reason a unit gets) stays in their own modules. What is shared is
everything that is easy to get wrong with real processes:

* **No shell, own process group.** The argv goes straight to execve and the
  child gets its own session, so timeout, cancel and the post-exit sweep reach
  every descendant, not just the direct child. A bare program name is resolved
  on the CHILD's `PATH` (cached per name and PATH).
* **Timeout and cancel.** SIGTERM to the group, SIGKILL `KILL_GRACE_S` later.
  Cancel wins over the deadline when both are due.
* **Post-exit drain (D9).** When the leader exits but a background descendant
  still holds the pipes, the pipes get `DRAIN_GRACE_S`, then the group is
  killed and `capture_error` says which stream did not finish — the capture is
  incomplete, and callers must not promote it.
* **Bounded capture.** stdout keeps its first `capture_limit` bytes and stderr
  its last `stderr_limit` bytes (the end of stderr is where the error is); the
  rest is drained and counted, so the child never blocks on a full pipe and its
  exit status stays real. Only `MEMORY_BUFFER_BYTES` of stdout stay in memory
  while the child runs; the rest of the kept bytes spill to an unlinked temp
  file, and turning kept bytes back into text is limited process-wide
  (`MATERIALIZE_BUDGET_BYTES`), so a wide fan-out of chatty commands costs a
  small buffer per running child, not its cap.
* **The guardian.** Every child carries this engine's guard token (akm.dispatch.guard),
  so it dies with a `kill -9`'d engine instead of running on unsupervised.
* **Watching lines as they come.** An optional `on_line(stream, line)` sees each
  complete line of stdout and stderr while the child runs (agent CLIs stream
  their events; akm reads retries, auth refusals and progress from them). When
  it returns a reason, the group is stopped as on cancel and `stopped` says why.
* **Redaction at every cut.** stdout and stderr come back already redacted
  against `sensitive_values`, including a secret cut in half by the capture
  limit (stdout's end, stderr's kept tail's start): see `redact_text`.

Nothing here raises for anything the child can do; a program that cannot be
started is reported in `spawn_error`.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import subprocess
import threading
import time
from collections import deque
from typing import IO, Any, Callable, Mapping, Protocol, Sequence

from akm.dispatch import guard
from akm.dispatch.redact import redact_text
from akm.record import dataclass

# Grace between SIGTERM and SIGKILL of the process group on timeout / cancel.
KILL_GRACE_S = 5.0
# How long the pipes may stay open after the main process exited (D9).
DRAIN_GRACE_S = 2.0
# After killing the group, how long to wait for the readers to see EOF before
# giving up on a descendant that escaped the group (setsid) and still holds a pipe.
POST_KILL_DRAIN_S = 1.0
# Supervisor polling interval (cancel flag, deadline, leader exit).
POLL_INTERVAL_S = 0.02

# Default caps (callers may pass their own).
DEFAULT_CAPTURE_LIMIT = 1024 * 1024
DEFAULT_STDERR_LIMIT = 64 * 1024
# stdout bytes held in memory while a child runs; the rest of what is kept spills to a temp file.
MEMORY_BUFFER_BYTES = 64 * 1024
# Kept stdout being turned into text at once, across every supervised process (one
# capture larger than the budget still proceeds, alone).
MATERIALIZE_BUDGET_BYTES = 16 * 1024 * 1024

_READ_CHUNK = 65536
_SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)


class CancelFlag(Protocol):
    def is_set(self) -> bool: ...


@dataclass
class ProcessResult:
    """What happened to one supervised process (text already redacted).

    exit_code        -- the leader's exit status; None when it was killed by a signal or never started.
    signal           -- the signal number that ended the leader, if any.
    stdout           -- the kept part of stdout (its beginning, or its end with stdout_keep="tail"),
                        decoded as UTF-8 (invalid bytes replaced; a character split by the cap is
                        dropped), redacted.
    stderr           -- the kept tail of stderr, decoded and redacted the same way.
    stdout_truncated -- stdout was longer than `capture_limit`: `stdout` is only part of it.
    stderr_truncated -- stderr was longer than `stderr_limit`: `stderr` is only its end.
    stdout_bytes / stderr_bytes -- how many bytes the child wrote to each stream in all.
    timed_out        -- the deadline passed and the group was terminated.
    cancelled        -- `cancel` was set while it ran (or before it started) and the group was terminated.
    stopped          -- what `on_line` answered when it asked for the group to be stopped (None: it never did).
    spawn_error      -- the program could not be started (nothing ran); everything else is empty.
    capture_error    -- a stream did not reach EOF (a descendant kept it open, or a read failed): the
                        capture is incomplete even if the leader exited 0.
    """

    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    timed_out: bool = False
    cancelled: bool = False
    stopped: str | None = None
    spawn_error: str | None = None
    capture_error: str | None = None

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated


# --------------------------------------------------------------------------- executable lookup


@functools.lru_cache(maxsize=256)
def _lookup_executable(name: str, path: str) -> str | None:
    return _which(name, path)


def _which(cmd: str, path: str) -> str | None:
    """`shutil.which(cmd, path=path)` on POSIX, without importing shutil (with lzma, bz2: ~3 ms of a start)."""
    if os.name != "posix":
        import shutil

        return shutil.which(cmd, path=path)

    def usable(fn: str) -> bool:
        return os.path.exists(fn) and os.access(fn, os.F_OK | os.X_OK) and not os.path.isdir(fn)

    if os.path.dirname(cmd):
        return cmd if usable(cmd) else None
    seen: set[str] = set()
    for directory in path.split(os.pathsep):
        if directory not in seen:
            seen.add(directory)
            name = os.path.join(directory, cmd)
            if usable(name):
                return name
    return None


def resolve_executable(name: str, path: str) -> str | None:
    """The program a bare `argv[0]` names, found on the CHILD's PATH (as execvp would).

    Resolved once per (name, PATH) instead of Popen probing every PATH entry per
    process; a path with a separator (`./run.sh`, `/bin/x`) is left to the OS as
    written, and a name not found is left to Popen, which then reports it. A
    cached program that has since gone away makes its spawn fail: `run_process`
    then forgets the cache and tries once more.
    """
    if os.sep in name or (os.altsep and os.altsep in name):
        return None
    return _lookup_executable(name, path)


# --------------------------------------------------------------------------- capture


class HeadCapture:
    """stdout: the first `cap` bytes (memory up to `mem`, then an unlinked temp file), and a count."""

    def __init__(self, fd: int, label: str, cap: int, mem: int) -> None:
        self.fd, self.label, self.cap, self.mem = fd, label, cap, mem
        self.buf = bytearray()
        self.spill: IO[bytes] | None = None
        self.kept = 0
        self.total = 0
        self.error: BaseException | None = None
        self.eof = False

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - self.kept
        if room <= 0:
            return
        part = chunk[:room]
        self.kept += len(part)
        in_mem = max(0, self.mem - len(self.buf))
        if in_mem:
            self.buf += part[:in_mem]
            part = part[in_mem:]
        if part:
            if self.spill is None:
                import tempfile  # only output past the in-memory cap spills

                self.spill = tempfile.TemporaryFile(prefix="akm-capture-")
            self.spill.write(part)

    @property
    def overflowed(self) -> bool:
        return self.total > self.cap

    def data(self) -> bytes:
        if self.spill is None:
            return bytes(self.buf)
        self.spill.seek(0)
        return bytes(self.buf) + self.spill.read()

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()
            self.spill = None


class TailCapture:
    """stderr (or an agent's stdout): the last `cap` bytes, and a count.

    Held in memory as a queue of read chunks, at most `cap` plus one chunk.
    """

    def __init__(self, fd: int, label: str, cap: int) -> None:
        self.fd, self.label, self.cap = fd, label, cap
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.total = 0
        self.error: BaseException | None = None
        self.eof = False

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.chunks.append(chunk)
        self.size += len(chunk)
        while self.chunks and self.size - len(self.chunks[0]) >= self.cap:
            self.size -= len(self.chunks.popleft())

    @property
    def overflowed(self) -> bool:
        return self.total > self.cap

    @property
    def kept(self) -> int:
        return min(self.size, self.cap)

    def data(self) -> bytes:
        if not self.cap:
            return b""
        data = b"".join(self.chunks)
        return data[-self.cap :] if len(data) > self.cap else data

    def close(self) -> None:
        self.chunks.clear()


class _StdinWriter:
    """Feeds `stdin_text` through the selector, so a big prompt never deadlocks against full output pipes."""

    def __init__(self, fd: int, data: bytes) -> None:
        self.fd, self.data, self.pos = fd, data, 0
        os.set_blocking(fd, False)

    def write_some(self) -> bool:
        """Write what the pipe takes now; True when done (all written, or the child closed its end)."""
        try:
            self.pos += os.write(self.fd, self.data[self.pos : self.pos + _READ_CHUNK])
        except BlockingIOError:
            return False
        except OSError:  # EPIPE: the child does not read its stdin; that is its business
            return True
        return self.pos >= len(self.data)


# The longest line `on_line` is shown; a longer one is cut there (its rest is not a line of its own).
MAX_WATCHED_LINE = 256 * 1024

LineWatcher = Callable[[str, str], "str | None"]


class _LineTap:
    """Splits what a stream delivers into lines for a watcher; remembers the first stop reason it gave."""

    def __init__(self, label: str, watch: LineWatcher, stop: list[str]) -> None:
        self.label, self.watch, self.stop = label, watch, stop
        self.partial = bytearray()
        self.skipping = False  # inside a line longer than MAX_WATCHED_LINE, already shown cut

    def feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end == -1:
                if not self.skipping:
                    self.partial += chunk[start:]
                    if len(self.partial) > MAX_WATCHED_LINE:
                        self._emit(bytes(self.partial[:MAX_WATCHED_LINE]))
                        self.skipping = True
                return
            if self.skipping:
                self.skipping = False
                self.partial.clear()
            else:
                self.partial += chunk[start:end]
                self._emit(bytes(self.partial[:MAX_WATCHED_LINE]))
            start = end + 1

    def close(self) -> None:
        if self.partial and not self.skipping:
            self._emit(bytes(self.partial))

    def _emit(self, data: bytes) -> None:
        self.partial.clear()
        line = data.decode("utf-8", errors="replace").rstrip("\r")
        if not line.strip():
            return
        reason = self.watch(self.label, line)
        if reason and not self.stop:
            self.stop.append(reason)


class _Tapped:
    """A capture that also shows each chunk to a line tap (same `feed` as a capture)."""

    def __init__(self, capture: Any, tap: _LineTap) -> None:
        self.capture, self.tap = capture, tap

    def feed(self, chunk: bytes) -> None:
        self.capture.feed(chunk)
        try:
            self.tap.feed(chunk)
        except Exception as exc:  # a watcher bug must not break supervision; it is reported as a stop
            if not self.tap.stop:
                self.tap.stop.append(f"the output watcher failed: {type(exc).__name__}: {exc}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.capture, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("capture", "tap"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.capture, name, value)


_EXITED = object()  # the poll target of the leader's pidfd
_POLLIN = getattr(select, "POLLIN", 1)
_POLLOUT = getattr(select, "POLLOUT", 4)


class _Streams:
    """The child's pipes (and its pidfd) under one `select.poll` object.

    A plain poll object rather than `selectors`: registering costs no system
    call and no per-key bookkeeping, and this runs once per unit of a fan-out.
    """

    def __init__(self) -> None:
        self.poller = select.poll()
        self.targets: dict[int, Any] = {}

    def add(self, fd: int, mask: int, target: Any) -> None:
        self.poller.register(fd, mask)
        self.targets[fd] = target

    def drop(self, fd: int) -> None:
        self.poller.unregister(fd)
        del self.targets[fd]

    def open_streams(self) -> bool:
        """Any pipe (not the pidfd) still being served."""
        return any(t is not _EXITED for t in self.targets.values())

    def pump(self, timeout: float) -> bool:
        """Serve whatever is ready, waiting at most `timeout` s; True when the pidfd said the leader exited."""
        if not self.targets:
            if timeout > 0:
                time.sleep(timeout)
            return False
        exited = False
        for fd, _ in self.poller.poll(max(0.0, timeout) * 1000.0):
            target = self.targets.get(fd)
            if target is None:
                continue
            if target is _EXITED:
                self.drop(fd)
                exited = True
                continue
            if isinstance(target, _StdinWriter):
                if target.write_some():
                    self.drop(fd)
                    os.close(fd)
                continue
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except OSError as exc:
                target.error = exc
                self.drop(fd)
                continue
            if chunk:
                target.feed(chunk)
            else:
                target.eof = True
                self.drop(fd)
        return exited

    def pump_until(self, until: float) -> None:
        """Serve the pipes until they all reach EOF or `until` (monotonic) passes."""
        while self.open_streams():
            left = until - time.monotonic()
            if left <= 0:
                return
            self.pump(min(POLL_INTERVAL_S * 5, left))


def _cut_utf8_end(data: bytes) -> bytes:
    """Drop a multi-byte UTF-8 character the end of a kept prefix split in half."""
    end = len(data)
    i = end - 1
    while i >= 0 and end - i <= 4 and (data[i] & 0xC0) == 0x80:
        i -= 1
    if i < 0:
        return data
    lead = data[i]
    if lead < 0x80:
        need = 1
    elif lead >> 5 == 0b110:
        need = 2
    elif lead >> 4 == 0b1110:
        need = 3
    elif lead >> 3 == 0b11110:
        need = 4
    else:
        return data  # invalid lead byte; leave it to errors="replace"
    return data if end - i >= need else data[:i]


def _cut_utf8_start(data: bytes) -> bytes:
    """Drop the continuation bytes of a character the start of a kept tail split in half."""
    i = 0
    while i < len(data) and i < 3 and (data[i] & 0xC0) == 0x80:
        i += 1
    return data[i:]


def head_text(head: HeadCapture, values: Sequence[str]) -> str:
    """The kept beginning of a stream as redacted text (a secret cut by the cap included)."""
    if not head.total:
        return ""
    data = head.data()
    if head.overflowed:
        data = _cut_utf8_end(data)
    return redact_text(data.decode("utf-8", errors="replace"), values, cut_after=head.overflowed)


def tail_text(tail: TailCapture, values: Sequence[str]) -> str:
    """The kept end of a stream as redacted text (a secret cut at the start of the tail included)."""
    if not tail.total:
        return ""
    data = tail.data()
    if tail.overflowed:
        data = _cut_utf8_start(data)
    return redact_text(data.decode("utf-8", errors="replace"), values, cut_before=tail.overflowed)


class _ByteBudget:
    """A process-wide budget of bytes being materialized at once (see MATERIALIZE_BUDGET_BYTES)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.cond = threading.Condition()

    def acquire(self, n: int) -> int:
        n = min(n, self.limit)  # one capture over the whole budget waits for an empty budget, then runs
        with self.cond:
            while self.used and self.used + n > self.limit:
                self.cond.wait()
            self.used += n
        return n

    def release(self, n: int) -> None:
        with self.cond:
            self.used -= n
            self.cond.notify_all()


_MATERIALIZE = _ByteBudget(MATERIALIZE_BUDGET_BYTES)


# --------------------------------------------------------------------------- process control


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the whole process group, falling back to the direct child."""
    if hasattr(os, "killpg"):
        try:
            os.killpg(proc.pid, sig)
            return
        except ProcessLookupError:
            return
        except OSError:
            pass
    try:
        if proc.poll() is None:
            proc.send_signal(sig)
    except OSError:
        pass


_HAVE_PIDFD = hasattr(os, "pidfd_open")
_devnull_lock = threading.Lock()
_devnull_fd: int | None = None


def _devnull() -> int:
    """One read-only /dev/null descriptor for every child's stdin (close-on-exec here; dup2'd in the child)."""
    global _devnull_fd
    if _devnull_fd is None:
        with _devnull_lock:
            if _devnull_fd is None:
                _devnull_fd = os.open(os.devnull, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    return _devnull_fd


@dataclass
class _Child:
    """A started child and our ends of its pipes (`stdin` only when it is fed text)."""

    proc: subprocess.Popen[bytes]
    stdout: int
    stderr: int
    stdin: int | None


def _spawn(argv: list[str], cwd: str, env: dict[str, str], with_stdin: bool) -> _Child | str:
    """Start the child in its own session with piped output; the reason as a string when it cannot start.

    The pipes are ours (raw descriptors, no file objects) and stdin is a shared /dev/null
    descriptor: per spawn that saves Popen opening /dev/null and wrapping each pipe in a
    buffered file only for us to read it by descriptor.
    """
    path = env.get("PATH", os.defpath)
    executable = resolve_executable(argv[0], path)
    child_ends: list[int] = []  # closed here once the child holds its copies (or never started)
    ours: list[int] = []  # handed to the caller on success, closed here otherwise
    try:
        out_r, out_w = os.pipe()  # close-on-exec on our side (PEP 446); the child gets dup2'd copies
        ours.append(out_r)
        child_ends.append(out_w)
        err_r, err_w = os.pipe()
        ours.append(err_r)
        child_ends.append(err_w)
        in_w: int | None = None
        if with_stdin:
            in_r, in_w = os.pipe()
            ours.append(in_w)
            child_ends.append(in_r)
        else:
            in_r = _devnull()
        for attempt in (1, 2):
            try:
                proc = subprocess.Popen(
                    argv,
                    executable=executable,
                    cwd=cwd,
                    env=env,
                    stdin=in_r,
                    stdout=out_w,
                    stderr=err_w,
                    start_new_session=True,
                    close_fds=True,
                )
                ours = []
                return _Child(proc, out_r, err_r, in_w)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                if attempt == 1 and executable is not None and isinstance(exc, OSError):
                    # The cached lookup may be stale (the program moved or lost its x bit): look again.
                    _lookup_executable.cache_clear()
                    fresh = resolve_executable(argv[0], path)
                    if fresh != executable:
                        executable = fresh
                        continue
                return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AssertionError("unreachable")  # pragma: no cover
    except OSError as exc:  # no pipe (out of descriptors): nothing was started
        return exc.strerror or str(exc)
    finally:
        for fd in child_ends + ours:
            os.close(fd)


def run_process(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    stdin_text: str | None = None,
    timeout_ms: int | None = None,
    cancel: CancelFlag | None = None,
    capture_limit: int = DEFAULT_CAPTURE_LIMIT,
    stderr_limit: int = DEFAULT_STDERR_LIMIT,
    stdout_keep: str = "head",
    sensitive_values: Sequence[str] = (),
    on_line: LineWatcher | None = None,
) -> ProcessResult:
    """Run `argv` in `cwd` with exactly `env` (plus the guard token) and supervise it to the end.

    `stdin_text` is written to the child's stdin (UTF-8) and then closed; None gives it /dev/null.
    `timeout_ms` None means no deadline. `cancel` is polled (`is_set()`) while the child runs.
    `capture_limit` bounds the stdout kept: its beginning (`stdout_keep="head"`, an exec unit's
    artifact; memory-bounded by spilling) or its end (`"tail"`, for agent CLIs that print their
    answer last; held in memory). `stderr_limit` bounds the stderr kept (always its end).
    `on_line(stream, line)` ("stdout"/"stderr", one unredacted line without its newline) is called
    for each line as it arrives, in this thread; a non-empty answer stops the group as a cancel
    does and is returned as `stopped`.
    Everything returned is redacted against `sensitive_values`. Never raises for what the child does.
    """
    if stdout_keep not in ("head", "tail"):
        raise ValueError(f"stdout_keep must be 'head' or 'tail', not {stdout_keep!r}")
    argv = list(argv)
    if not argv:
        return ProcessResult(spawn_error="the command is empty")
    if cancel is not None and cancel.is_set():
        return ProcessResult(cancelled=True)
    child = _spawn(argv, cwd, _child_env(env), stdin_text is not None)
    if isinstance(child, str):
        return ProcessResult(spawn_error=child)
    proc = child.proc

    out: HeadCapture | TailCapture = (
        HeadCapture(child.stdout, "stdout", max(0, capture_limit), MEMORY_BUFFER_BYTES)
        if stdout_keep == "head"
        else TailCapture(child.stdout, "stdout", max(0, capture_limit))
    )
    err = TailCapture(child.stderr, "stderr", max(0, stderr_limit))
    readers: tuple[HeadCapture | TailCapture, ...] = (out, err)
    stop: list[str] = []
    streams, taps = _wired_streams(readers, on_line, stop)
    _feed_stdin(streams, child, stdin_text)
    pidfd = _exit_watch(streams, proc)
    deadline = time.monotonic() + timeout_ms / 1000.0 if timeout_ms is not None else None
    watch = _Supervisor(proc, streams, pidfd, cancel, stop, deadline)
    drain_timed_out: list[str] = []
    try:
        watch.until_exit()
        drain_timed_out = watch.drain(readers)
    finally:
        _close_our_ends(streams, pidfd, child)

    _close_taps(taps)
    causes = _capture_causes(readers, drain_timed_out)
    values = list(sensitive_values)
    stdout = _stdout_text(out, values)
    stderr = tail_text(err, values)

    rc = proc.returncode
    return ProcessResult(
        exit_code=rc if rc is not None and rc >= 0 else None,
        signal=-rc if rc is not None and rc < 0 else None,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=out.overflowed,
        stderr_truncated=err.overflowed,
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        timed_out=watch.timed_out,
        cancelled=watch.cancelled,
        stopped=stop[0] if watch.stopped else None,
        capture_error="; ".join(causes) or None,
    )


def _child_env(env: Mapping[str, str]) -> dict[str, str]:
    """Exactly `env`, plus the guard token: the child dies with this engine if the engine is killed."""
    child_env = dict(env)
    token = guard.token()
    if token:
        child_env[guard.ENV_NAME] = token
    return child_env


def _feed_stdin(streams: _Streams, child: _Child, stdin_text: str | None) -> None:
    """Queue `stdin_text` for the child's stdin (written as it drains), or close it at once: the child's EOF."""
    if child.stdin is None:
        return
    data = (stdin_text or "").encode("utf-8")
    if data:
        streams.add(child.stdin, _POLLOUT, _StdinWriter(child.stdin, data))
    else:
        os.close(child.stdin)


def _wired_streams(
    readers: tuple[HeadCapture | TailCapture, ...], on_line: LineWatcher | None, stop: list[str]
) -> tuple[_Streams, list[_LineTap]]:
    """The poll set over the child's stdout and stderr, each read through a line tap when `on_line` watches."""
    taps: list[_LineTap] = []
    streams = _Streams()
    for r in readers:
        if on_line is not None:
            tap = _LineTap(r.label, on_line, stop)
            taps.append(tap)
            streams.add(r.fd, _POLLIN, _Tapped(r, tap))
        else:
            streams.add(r.fd, _POLLIN, r)
    return streams, taps


def _exit_watch(streams: _Streams, proc: subprocess.Popen[bytes]) -> int | None:
    """On Linux a pidfd wakes the poll the moment the leader exits, and until it does there is no need to
    ask the kernel; elsewhere (None) we poll for the exit status."""
    if not _HAVE_PIDFD:
        return None
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        return None
    streams.add(pidfd, _POLLIN, _EXITED)
    return pidfd


class _Supervisor:
    """The watch over a running child group: it pumps the pipes until the leader exits, and on a cancel, a
    stop asked by a line watcher or the deadline sends SIGTERM, then SIGKILL after the grace."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        streams: _Streams,
        pidfd: int | None,
        cancel: CancelFlag | None,
        stop: list[str],
        deadline: float | None,
    ) -> None:
        self.proc, self.streams, self.pidfd = proc, streams, pidfd
        self.cancel, self.stop, self.deadline = cancel, stop, deadline
        self.cancelled = self.timed_out = self.killed = self.stopped = False
        self.term_at: float | None = None

    def until_exit(self) -> None:
        exited = self.pidfd is None
        while True:
            if exited and self.proc.poll() is not None:
                break
            self._escalate()
            exited = self._wait() or exited

    def _escalate(self) -> None:
        """Terminate the group once a reason appears; kill it once the grace has passed."""
        if self.term_at is None:
            if self.cancel is not None and self.cancel.is_set():
                self.cancelled = True
            elif self.stop:
                self.stopped = True
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                self.timed_out = True
            if self.cancelled or self.timed_out or self.stopped:
                self.term_at = time.monotonic()
                signal_group(self.proc, signal.SIGTERM)
        elif not self.killed and time.monotonic() - self.term_at >= KILL_GRACE_S:
            self.killed = True
            signal_group(self.proc, _SIGKILL)

    def _wait(self) -> bool:
        """Wait a little for output or the exit; whether the leader may have exited."""
        wait = POLL_INTERVAL_S * 5
        if self.deadline is not None and self.term_at is None:
            wait = min(wait, max(0.0, self.deadline - time.monotonic()))
        streams, pidfd = self.streams, self.pidfd
        if streams.targets:
            # wake for output and the exit, and often enough to notice cancel/timeout promptly
            return bool(streams.pump(wait) or pidfd is None or pidfd not in streams.targets)
        try:
            self.proc.wait(max(0.001, wait))
        except subprocess.TimeoutExpired:
            pass
        return True

    def drain(self, readers: tuple[HeadCapture | TailCapture, ...]) -> list[str]:
        """Read what is left in the pipes after the exit; they should close now, and if a descendant holds
        them the group is killed (D9). The streams whose drain timed out, as capture-error causes."""
        streams, pidfd, proc = self.streams, self.pidfd, self.proc
        if pidfd is not None and pidfd in streams.targets:
            streams.drop(pidfd)
        if self.term_at is not None:
            if streams.targets:
                streams.pump_until(max(self.term_at + KILL_GRACE_S, time.monotonic()))
            signal_group(proc, _SIGKILL)  # we are terminating anyway: sweep anything left in the group
            streams.pump_until(time.monotonic() + POST_KILL_DRAIN_S)
        elif streams.targets:
            streams.pump_until(time.monotonic() + DRAIN_GRACE_S)
            if any(not r.eof and r.error is None for r in readers):
                timed_out = [f"{r.label} drain timed out" for r in readers if not r.eof and r.error is None]
                signal_group(proc, _SIGKILL)
                streams.pump_until(time.monotonic() + POST_KILL_DRAIN_S)
                return timed_out
        return []


def _close_our_ends(streams: _Streams, pidfd: int | None, child: _Child) -> None:
    for fd, target in streams.targets.items():
        if isinstance(target, _StdinWriter):
            os.close(fd)
    if pidfd is not None:
        os.close(pidfd)
    for fd in (child.stdout, child.stderr):
        try:
            os.close(fd)
        except OSError:
            pass


def _close_taps(taps: list[_LineTap]) -> None:
    """Flush each line tap: a last line without a newline still reaches the watcher (whose errors are its own)."""
    for tap in taps:
        try:
            tap.close()
        except Exception:
            pass


def _capture_causes(readers: tuple[HeadCapture | TailCapture, ...], drain_timed_out: list[str]) -> list[str]:
    """Why the capture may be incomplete: a drain that timed out, a read that failed, a pipe never closed."""
    causes = list(drain_timed_out)
    for r in readers:
        if r.error is not None:
            causes.append(f"{r.label} read failed: {r.error}")
        elif not r.eof and f"{r.label} drain timed out" not in causes:
            causes.append(f"{r.label} drain timed out")
    return causes


def _stdout_text(out: HeadCapture | TailCapture, values: list[str]) -> str:
    """The stdout kept, decoded and redacted; a large one waits for its share of the materialization budget."""
    try:
        granted = _MATERIALIZE.acquire(out.kept) if out.kept else 0
        try:
            return head_text(out, values) if isinstance(out, HeadCapture) else tail_text(out, values)
        finally:
            if granted:
                _MATERIALIZE.release(granted)
    finally:
        out.close()
