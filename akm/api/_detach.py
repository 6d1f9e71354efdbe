"""Start a run's driver as a background process (`workflow run --detach`).

The detached driver is just `akm workflow run RUN_ID --verbose` in a new session (so the shell's Ctrl-C and
hang-up do not reach it), reading nothing, writing its progress lines and final status to a log file under
the data directory. It takes the run lease like any driver: a second driver gets LEASE_HELD, a kill -9 of
it is detected at once by the next `workflow run RUN` on this host, and only its in-flight units run again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from akm import paths


def self_command() -> list[str]:
    """How to run this akm again: the zipapp file it was started from, or this interpreter's `-m akm`."""
    boot = sys.modules.get("_akm_boot")
    archive = getattr(boot, "ARCHIVE", "") if boot is not None else ""
    if archive:
        return [sys.executable, archive]
    return [sys.executable, "-m", "akm"]


def log_path(run_id: str) -> Path:
    """Where a detached driver of `run_id` logs: `<data dir>/logs/<run id>.log` (appended to by each one)."""
    return paths.data_dir() / "logs" / f"{run_id}.log"


def spawn_driver(run_id: str, *, cwd: Path, extra: list[str]) -> tuple[int, Path]:
    """Start `akm workflow run RUN_ID --verbose [extra]` detached; returns (pid, log file).

    The child is reaped by a daemon thread, so a long-lived parent (tests, an embedding program) never keeps
    a zombie whose pid would look like a live lease holder; a parent that exits leaves it to init.
    """
    log = log_path(run_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [*self_command(), "workflow", "run", run_id, "--verbose", *extra],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            cwd=str(cwd),
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
    threading.Thread(target=proc.wait, name=f"akm-reap-{proc.pid}", daemon=True).start()
    return proc.pid, log
