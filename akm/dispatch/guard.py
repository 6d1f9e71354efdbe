"""A watchdog that takes a unit's processes down with the engine.

Exec units run in their own process groups, so nothing kills them when the
engine dies abruptly (`kill -9`, the OOM killer): they would keep running with
no timeout enforced, and the run's next driver — which may start at once (D16)
— would dispatch the same unit again while the orphan still runs.

Each engine process starts one small guardian process that holds the read end
of a pipe, and every unit it spawns carries the guardian's token in its
environment (`AKM_GUARD`). When the pipe reaches EOF without a final `bye`
(the engine is gone), the guardian finds the processes carrying its token
(via /proc) and terminates them and their groups: SIGTERM, then SIGKILL after a
grace. A clean exit says `bye` and leaves alone anything a unit deliberately
left running. Nothing is sent per unit, so the guard costs a fan-out nothing.

Linux only (it needs /proc); elsewhere units simply do not carry a token.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading

ENV_NAME = "AKM_GUARD"

# Its start-up is on the critical path of a short run (the first spawn starts it, and a clean exit
# waits for it to leave): it imports only built-in modules (`signal` and `os` would pull in enum,
# functools and collections, several times the cost of the interpreter's own start).
_GUARDIAN = r"""
import _signal, posix, sys, time
_signal.signal(_signal.SIGINT, _signal.SIG_IGN)
_signal.signal(_signal.SIGHUP, _signal.SIG_IGN)
needle = b"\0AKM_GUARD=" + sys.argv[1].encode() + b"\0"
data = b""
while True:
    try:
        chunk = posix.read(0, 4096)
    except InterruptedError:
        continue
    except OSError:
        chunk = b""
    if not chunk:
        break
    data = (data + chunk)[-16:]
if data.endswith(b"bye\n"):
    posix._exit(0)  # nothing to flush: skipping the interpreter's teardown is what the engine's exit waits for

def tagged():
    found = []
    for name in posix.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    found.append(int(name))
        except OSError:
            pass
    return found

for sig, pause in ((_signal.SIGTERM, 2.0), (_signal.SIGKILL, 0)):
    pids = tagged()
    for pid in pids:
        try:
            if posix.getpgid(pid) == pid:
                posix.killpg(pid, sig)
            else:
                posix.kill(pid, sig)
        except OSError:
            pass
    if not pids:
        break
    if pause:
        time.sleep(pause)
"""

_lock = threading.Lock()
_proc: subprocess.Popen[bytes] | None = None
_token: str | None = None
_owner: int | None = None


def token() -> str | None:
    """This engine process's guard token (starting the guardian on first use), or None."""
    global _proc, _token, _owner
    if _owner == os.getpid():  # every spawn asks: answer without a lock or a stat once started
        return _token
    if not os.path.isdir("/proc"):
        return None
    with _lock:
        if _owner != os.getpid():  # first use, or we are a forked child: our own guardian
            pid = os.getpid()
            _proc, _token = None, None
            from akm.ids import uuid4

            candidate = uuid4().replace("-", "")
            try:
                _proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _GUARDIAN, candidate],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
                _token = candidate
                atexit.register(_goodbye)
            except OSError:
                _proc = None  # no guardian: units still run, they just do not die with a crashed engine
            _owner = pid  # last: the unlocked fast path above must never see a half-started guardian
        return _token


def _goodbye() -> None:
    global _proc
    with _lock:
        if _proc is not None and _owner == os.getpid() and _proc.stdin is not None:
            try:
                _proc.stdin.write(b"bye\n")
                _proc.stdin.close()
                # It exits at once on `bye`: reap it, so the interpreter does not warn about a child
                # still running at shutdown. A slow guardian is not worth delaying our exit for.
                _until_exited(_proc.pid, 0.5)
                _proc.wait(timeout=0.5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
            _proc = None


def _until_exited(pid: int, timeout_s: float) -> None:
    """Wait (at most `timeout_s`) until `pid` exits, woken by its pidfd where there is one: `Popen.wait`
    with a timeout polls with sleeps that double from 1 ms, most of a short run's goodbye."""
    if not hasattr(os, "pidfd_open"):
        return
    import select

    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(timeout_s * 1000)
    finally:
        os.close(fd)
