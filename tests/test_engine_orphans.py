"""exec units outlive a kill -9'd engine, and the immediate takeover (D16) runs them twice at once."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); treat it as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_unit_process_does_not_outlive_a_killed_engine(akm, project):
    pids = project / "pids.txt"
    (project / "o.md").write_text(
        "---\nsteps:\n  - id: slow\n    unit:\n      timeout: 2s\n      exec:\n        command: "
        + json.dumps(
            [PY, "-c", f"import os,time; open({str(pids)!r},'a').write(str(os.getpid())+'\\n'); time.sleep(600)"]
        )
        + "\n---\n\n## slow\n\nx\n",
        encoding="utf-8",
    )
    proc = akm.popen("workflow", "run", "o.md")
    deadline = time.time() + 60
    while time.time() < deadline and not (pids.exists() and pids.read_text().strip()):
        time.sleep(0.05)
    assert pids.exists(), proc.communicate(timeout=5)
    first = int(pids.read_text().split()[0])
    proc.kill()
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    try:
        # The engine that enforced the unit's 2 s timeout is gone; its guardian must take the unit
        # down. Wait for that (generously: CI is loaded); without the guardian it would sleep 600 s.
        deadline = time.time() + 60
        while time.time() < deadline and _alive(first):
            time.sleep(0.1)
        assert not _alive(first), f"unit pid {first} is still running 60 s after its engine was killed"
    finally:
        if _alive(first):
            os.killpg(first, signal.SIGKILL)


def test_clean_exit_leaves_a_deliberately_detached_process_alone(akm, project):
    """The guardian only acts when the engine dies without saying goodbye."""
    pidfile = project / "daemon.pid"
    daemon = (
        f"import os,subprocess,time; p=subprocess.Popen([{PY!r},'-c','import time; time.sleep(30)'],"
        f"stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL,start_new_session=True);"
        f"open({str(pidfile)!r},'w').write(str(p.pid))"
    )
    (project / "d.md").write_text(
        "---\nsteps:\n  - id: start\n    unit:\n      exec:\n        command: "
        + json.dumps([PY, "-c", daemon])
        + "\n---\n\n## start\n\nx\n",
        encoding="utf-8",
    )
    akm("workflow", "run", "d.md", check=0)
    pid = int(pidfile.read_text())
    try:
        time.sleep(1.0)
        assert _alive(pid), "a process a unit deliberately detached was killed after a clean exit"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
