"""A watchdog that takes a unit's processes down with the engine.

Exec units run in their own process groups, so nothing kills them when the
engine dies abruptly (`kill -9`, OOM killer, a closed terminal): they would
keep running with no timeout enforced, and the run's next driver — which may
start at once (D16) — would dispatch the same unit a second time while the
orphan still runs.

One small guardian process per engine process holds the read end of a pipe.
The engine writes `+<pgid>` when it spawns a unit and `-<pgid>` when the unit's
group is done. When the pipe reaches EOF without a final `bye` (the engine is
gone), the guardian sends SIGTERM to every group still registered, then SIGKILL
after a grace. A clean engine exit writes `bye`, and the guardian leaves alone
anything a unit deliberately left running. Cost per unit: two pipe writes.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading

_GUARDIAN = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
groups, buf, clean = set(), b"", False
fd = sys.stdin.fileno()
while True:
    try:
        chunk = os.read(fd, 65536)
    except InterruptedError:
        continue
    except OSError:
        chunk = b""
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\n")
    for line in lines:
        if line == b"bye":
            clean = True
        elif line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
if not clean and groups:
    for sig, pause in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0)):
        for pgid in list(groups):
            try:
                os.killpg(pgid, sig)
            except OSError:
                groups.discard(pgid)
        if groups and pause:
            time.sleep(pause)
"""

_lock = threading.Lock()
_proc: subprocess.Popen | None = None
_pid_owner: int | None = None


def _start() -> subprocess.Popen | None:
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _GUARDIAN],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )
    except OSError:
        return None  # no guardian: units still run, they just do not die with a crashed engine
    atexit.register(_goodbye)
    return proc


def _send(line: str) -> None:
    global _proc, _pid_owner
    with _lock:
        if _proc is None or _pid_owner != os.getpid():
            _proc, _pid_owner = _start(), os.getpid()
        if _proc is None or _proc.stdin is None:
            return
        try:
            _proc.stdin.write(line.encode() + b"\n")
            _proc.stdin.flush()
        except (OSError, ValueError):
            _proc = None  # it died; the next unit starts a fresh one


def register(pgid: int) -> None:
    """The engine spawned a unit whose process group is `pgid`."""
    _send(f"+{pgid}")


def unregister(pgid: int) -> None:
    """The unit's group is finished (or was killed by the engine itself)."""
    _send(f"-{pgid}")


def _goodbye() -> None:
    global _proc
    with _lock:
        if _proc is not None and _pid_owner == os.getpid() and _proc.stdin is not None:
            try:
                _proc.stdin.write(b"bye\n")
                _proc.stdin.close()
            except (OSError, ValueError):
                pass
            _proc = None
