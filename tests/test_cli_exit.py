"""How the `akm` process leaves (`akm.cli.run`): without the interpreter's teardown, yet losing nothing.

Each case is a real interpreter running the real entry (`python -m akm`, or `akm.cli.run()` after a
test hook is installed), so what is checked is what a user's shell sees: the exit status, every byte
of output through a pipe, the atexit handlers (the orphan guard's goodbye is one), and a thread that
is still working when the command returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from akm.errors import EXIT_FAILED, EXIT_OUTPUT, EXIT_USAGE
from tests.helpers import ROOT


def _python(code: str, env_extra: dict[str, str], cwd, *, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**env_extra, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, timeout=timeout
    )


def _env(tmp_path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_")}
    env.update(AKM_DATA_DIR=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return env


def test_status_output_and_atexit_handlers_survive_the_fast_exit(tmp_path):
    proc = _python(
        """
        import atexit, sys
        import akm.cli
        atexit.register(lambda: sys.stdout.write("atexit ran\\n"))  # written after main: flushed by run()
        sys.argv = ["akm", "--version"]
        akm.cli.run()
        """,
        _env(tmp_path),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert lines[0].startswith("akm ") and lines[-1] == "atexit ran"


def test_a_failing_command_keeps_its_exit_status_and_message(akm, project):
    proc = akm("workflow", "status", "00000000-0000-4000-8000-000000000000")
    assert proc.returncode == EXIT_FAILED, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("error[RUN_NOT_FOUND]") and "Traceback" not in proc.stderr
    proc = akm("workflow", "status")  # argparse's own exit (SystemExit out of main) is untouched
    assert proc.returncode == EXIT_USAGE, (proc.returncode, proc.stderr)


def test_a_thread_still_working_is_joined_by_the_normal_exit(tmp_path):
    proc = _python(
        """
        import sys, threading, time
        import akm.cli

        def late():
            time.sleep(0.3)
            print("thread finished", flush=True)

        threading.Thread(target=late).start()  # not a daemon: the process must wait for it
        sys.argv = ["akm", "--version"]
        akm.cli.run()
        """,
        _env(tmp_path),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines()[-1] == "thread finished"


def test_large_json_output_reaches_a_pipe_whole(akm, project):
    """A `workflow run` whose result is ~1 MB of JSON: every byte arrives, then the exit status."""
    (project / "big.md").write_text(
        "---\nparams:\n  xs: { type: array, default: "
        + json.dumps(list(range(300)))
        + " }\nsteps:\n  - id: fan\n    map:\n      over: params.xs\n      concurrency: 4\n      unit:\n"
        "        exec: { command: ['"
        + sys.executable
        + '\', \'-c\', \'print("[" + ",".join(["1234567"] * 400) + "]")\'] }\n'
        "        output: { type: array }\n---\n\n## fan\n\nx\n",
        encoding="utf-8",
    )
    proc = akm("workflow", "run", "big.md", "--format", "json", check=0)
    out = json.loads(proc.stdout)
    assert out["run"]["status"] == "completed"
    assert len(proc.stdout) > 300 * 400 * 7


def test_output_that_cannot_be_written_is_a_failure_but_a_closed_pipe_is_not(tmp_path):
    env = {**_env(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONUNBUFFERED", None)  # the output waits in the buffer for the flush at exit, as in a user's shell
    with open("/dev/full", "wb") as full:  # every write fails: No space left on device
        proc = subprocess.run(
            [sys.executable, "-m", "akm", "--version"], stdout=full, stderr=subprocess.PIPE, env=env, timeout=120
        )
    assert proc.returncode == EXIT_OUTPUT, proc.stderr
    assert proc.stderr.decode().startswith("error[OUTPUT_FAILED]: ") and b"Traceback" not in proc.stderr

    reader_gone = subprocess.Popen(
        [sys.executable, "-m", "akm", "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert reader_gone.stdout is not None
    reader_gone.stdout.close()  # before (or, on a slow machine, after) it writes: either way not a failure
    _, err = reader_gone.communicate(timeout=120)
    assert reader_gone.returncode == 0, err
    assert b"Traceback" not in err and b"Exception ignored" not in err


@pytest.mark.parametrize("closed", ["<&-", ">&-"])
def test_akm_mcp_with_a_closed_stdin_or_stdout_says_so(tmp_path, closed):
    env = {**_env(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["sh", "-c", f'exec "$0" -m akm mcp {closed}', sys.executable],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL if closed == "<&-" else None,
        env=env,
        timeout=120,
    )
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.decode().startswith("error[MCP_NO_STDIO]: ") and b"Traceback" not in proc.stderr
