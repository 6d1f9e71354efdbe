"""akm.dispatch.process: supervising one real child process (shared by exec units and agent CLIs)."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akm.dispatch import guard, process
from akm.dispatch.process import HeadCapture, TailCapture, head_text, run_process, tail_text
from akm.dispatch.redact import REDACTED, sensitive_values_from

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX process groups")

PY = sys.executable


def env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], **extra}


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def gone(pid: int, within: float = 60.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


# ------------------------------------------------------------------ basics


def test_exit_code_streams_cwd_and_exact_environment(tmp_path):
    code = "import json,os,sys; print(json.dumps([os.getcwd(), sorted(os.environ)])); sys.stderr.write('warn'); sys.exit(4)"
    res = run_process(py(code), cwd=str(tmp_path), env=env(ONLY="1"))
    assert res.exit_code == 4 and res.signal is None and res.spawn_error is None
    cwd, names = json.loads(res.stdout)
    assert cwd == os.path.realpath(tmp_path)
    assert set(names) - {"LC_CTYPE"} == {"PATH", "ONLY"} | ({guard.ENV_NAME} if guard.token() else set())
    assert res.stderr == "warn" and not res.truncated


def test_killed_by_a_signal(tmp_path):
    res = run_process(py("import os,signal; os.kill(os.getpid(), signal.SIGKILL)"), cwd=str(tmp_path), env=env())
    assert res.exit_code is None and res.signal == 9


def test_a_program_that_does_not_exist_is_a_spawn_error(tmp_path):
    res = run_process(["akm-no-such-program-xyz"], cwd=str(tmp_path), env=env())
    assert res.spawn_error and "No such file" in res.spawn_error
    assert res.exit_code is None and res.stdout == ""


def test_stdin_text_is_delivered_while_big_output_flows(tmp_path):
    """2 MiB in while 2 MiB comes out: the writer goes through the selector, so neither side blocks."""
    data = "".join(f"line {i} é\n" for i in range(200_000))
    res = run_process(
        py("import sys; sys.stdout.write(sys.stdin.read())"),
        cwd=str(tmp_path),
        env=env(),
        stdin_text=data,
        capture_limit=8 * 1024 * 1024,
        timeout_ms=120_000,
    )
    assert res.exit_code == 0 and res.stdout == data and not res.stdout_truncated


def test_a_child_that_never_reads_its_stdin_does_not_hang(tmp_path):
    res = run_process(
        py("print('ignored stdin')"), cwd=str(tmp_path), env=env(), stdin_text="x" * 5_000_000, timeout_ms=120_000
    )
    assert res.exit_code == 0 and res.stdout == "ignored stdin\n" and not res.timed_out


def test_without_stdin_text_stdin_is_empty(tmp_path):
    res = run_process(py("import sys; print(repr(sys.stdin.read()))"), cwd=str(tmp_path), env=env())
    assert res.stdout == "''\n"


def test_timeout_terminates_the_group(tmp_path):
    pidfile = tmp_path / "grandchild"
    script = f"sleep 300 & echo $! > {pidfile}; echo started; wait"
    res = run_process(["sh", "-c", script], cwd=str(tmp_path), env=env(), timeout_ms=300)
    assert res.timed_out and not res.cancelled and res.stdout == "started\n"
    assert gone(int(pidfile.read_text()))


def test_cancel_terminates_the_group(tmp_path):
    cancel = threading.Event()
    started = tmp_path / "started"
    pidfile = tmp_path / "grandchild"
    script = f"sleep 300 & echo $! > {pidfile}; touch {started}; wait"

    def trip_when_started() -> None:
        end = time.monotonic() + 60
        while not started.exists() and time.monotonic() < end:
            time.sleep(0.02)
        cancel.set()

    threading.Thread(target=trip_when_started, daemon=True).start()
    res = run_process(["sh", "-c", script], cwd=str(tmp_path), env=env(), cancel=cancel)
    assert res.cancelled and not res.timed_out
    assert gone(int(pidfile.read_text()))


def test_cancel_before_start_runs_nothing(tmp_path):
    cancel = threading.Event()
    cancel.set()
    res = run_process(["touch", str(tmp_path / "ran")], cwd=str(tmp_path), env=env(), cancel=cancel)
    assert res.cancelled and not (tmp_path / "ran").exists()


def test_a_leftover_holding_the_pipes_is_a_capture_error(tmp_path):
    pidfile = tmp_path / "bg"
    res = run_process(
        ["sh", "-c", f"echo partial; sleep 300 & echo $! > {pidfile}; exit 0"],
        cwd=str(tmp_path),
        env=env(),
        timeout_ms=120_000,
    )
    assert res.exit_code == 0 and res.capture_error and "stdout drain timed out" in res.capture_error
    assert gone(int(pidfile.read_text()))


# ------------------------------------------------------------------ watching lines as they come


def test_on_line_sees_every_line_of_both_streams_in_order_and_a_last_line_without_newline(tmp_path):
    seen: list[tuple[str, str]] = []
    code = (
        "import sys,time\n"
        "sys.stdout.write('one\\ntw'); sys.stdout.flush(); time.sleep(0.05)\n"
        "sys.stdout.write('o\\n\\n  \\nthree'); sys.stdout.flush()\n"
        "sys.stderr.write('warn\\r\\n')\n"
    )
    res = run_process(py(code), cwd=str(tmp_path), env=env(), on_line=lambda s, line: seen.append((s, line)))
    assert res.exit_code == 0 and res.stopped is None
    assert [line for s, line in seen if s == "stdout"] == ["one", "two", "three"]  # blank lines are not shown
    assert [line for s, line in seen if s == "stderr"] == ["warn"]
    assert res.stdout == "one\ntwo\n\n  \nthree"  # the capture is untouched by the watch


def test_a_stop_reason_from_on_line_ends_the_group_at_once(tmp_path):
    pidfile = tmp_path / "grandchild"
    script = f"sleep 300 & echo $! > {pidfile}; echo 'retry 1'; echo 'FATAL key refused' >&2; sleep 300"
    started = time.monotonic()
    res = run_process(
        ["sh", "-c", script],
        cwd=str(tmp_path),
        env=env(),
        timeout_ms=300_000,
        on_line=lambda s, line: "refused" if "FATAL" in line else None,
    )
    assert res.stopped == "refused" and not res.timed_out and not res.cancelled
    assert time.monotonic() - started < 60  # a generous bound: far below the 300 s the child would take
    assert gone(int(pidfile.read_text()))
    assert "FATAL key refused" in res.stderr


def test_a_huge_line_is_shown_cut_and_a_watcher_bug_stops_the_child(tmp_path):
    seen: list[int] = []
    code = "import sys; sys.stdout.write('x' * (600 * 1024) + '\\nnext\\n')"
    res = run_process(py(code), cwd=str(tmp_path), env=env(), on_line=lambda s, line: seen.append(len(line)))
    assert res.exit_code == 0 and seen == [process.MAX_WATCHED_LINE, 4]

    def broken(stream: str, line: str) -> str | None:
        raise KeyError("oops")

    res = run_process(["sh", "-c", "echo hi; sleep 300"], cwd=str(tmp_path), env=env(), on_line=broken)
    assert res.stopped is not None and "watcher failed" in res.stopped and "KeyError" in res.stopped


# ------------------------------------------------------------------ bounded capture


def test_stdout_keeps_its_beginning_and_stderr_its_end(tmp_path):
    code = "import sys\nsys.stdout.write('A' * 1000 + 'B' * 1000)\nsys.stderr.write('C' * 1000 + 'D' * 1000)\n"
    res = run_process(py(code), cwd=str(tmp_path), env=env(), capture_limit=1000, stderr_limit=1000)
    assert res.stdout == "A" * 1000 and res.stdout_truncated and res.stdout_bytes == 2000
    assert res.stderr == "D" * 1000 and res.stderr_truncated and res.stderr_bytes == 2000


def test_stdout_beyond_the_memory_buffer_spills_to_a_file():
    head = HeadCapture(-1, "stdout", cap=300_000, mem=4096)
    payload = bytes(range(256)) * 2000  # 512,000 bytes
    for i in range(0, len(payload), 7000):
        head.feed(payload[i : i + 7000])
    try:
        assert len(head.buf) == 4096 and head.spill is not None
        assert head.data() == payload[:300_000] and head.total == len(payload) and head.overflowed
    finally:
        head.close()


def test_the_materialize_budget_lets_one_oversized_capture_through_alone():
    budget = process._ByteBudget(100)
    first = budget.acquire(60)
    waiting = threading.Event()
    done = threading.Event()

    def second() -> None:
        waiting.set()
        n = budget.acquire(60)  # 60 + 60 > 100: waits for the first
        done.set()
        budget.release(n)

    t = threading.Thread(target=second)
    t.start()
    assert waiting.wait(60)
    assert not done.wait(0.2)
    budget.release(first)
    assert done.wait(60)
    t.join(60)
    assert budget.acquire(1000) == 100  # larger than the budget: granted once the budget is empty
    budget.release(100)


# ------------------------------------------------------------------ redaction at every cut

SECRET_ALPHABET = "abcdef0123456789"
FILLER = st.text(alphabet="xyz .\né€", max_size=40)
SECRETS = st.text(alphabet=SECRET_ALPHABET, min_size=4, max_size=40)


def _leaked(text: str) -> str:
    """Secret characters left once every [REDACTED] is taken out (secrets use an alphabet of their own)."""
    return "".join(ch for ch in text.replace(REDACTED, "") if ch in SECRET_ALPHABET)


def _feed(capture, data: bytes, chunk: int) -> None:
    for i in range(0, len(data), chunk):
        capture.feed(data[i : i + chunk])


@settings(max_examples=400, deadline=None)
@given(
    secrets=st.lists(SECRETS, min_size=1, max_size=2),
    fillers=st.lists(FILLER, min_size=3, max_size=3),
    cap=st.integers(min_value=0, max_value=200),
    mem=st.integers(min_value=0, max_value=64),
    chunk=st.integers(min_value=1, max_value=50),
)
def test_no_secret_character_survives_any_stdout_cut(secrets, fillers, cap, mem, chunk):
    stream = (fillers[0] + secrets[0] + fillers[1] + secrets[-1] + fillers[2]).encode()
    head = HeadCapture(-1, "stdout", cap=cap, mem=mem)
    _feed(head, stream, chunk)
    try:
        text = head_text(head, sensitive_values_from({f"K{i}": s for i, s in enumerate(secrets)}))
    finally:
        head.close()
    assert _leaked(text) == "", (stream, cap, text)


@settings(max_examples=400, deadline=None)
@given(
    secrets=st.lists(SECRETS, min_size=1, max_size=2),
    fillers=st.lists(FILLER, min_size=3, max_size=3),
    cap=st.integers(min_value=0, max_value=200),
    chunk=st.integers(min_value=1, max_value=50),
)
def test_no_secret_character_survives_any_stderr_cut(secrets, fillers, cap, chunk):
    stream = (fillers[0] + secrets[0] + fillers[1] + secrets[-1] + fillers[2]).encode()
    tail = TailCapture(-1, "stderr", cap=cap)
    _feed(tail, stream, chunk)
    text = tail_text(tail, sensitive_values_from({f"K{i}": s for i, s in enumerate(secrets)}))
    assert _leaked(text) == "", (stream, cap, text)


def test_a_secret_straddling_the_stdout_cap_of_a_real_process(tmp_path):
    secret = "0123456789abcdef0123"
    for kept_part in (1, 3, 10, 19):
        code = f"import sys; sys.stdout.write('x' * {1000 - kept_part} + {secret!r} + 'y' * 50)"
        res = run_process(
            py(code),
            cwd=str(tmp_path),
            env=env(),
            capture_limit=1000,
            sensitive_values=sensitive_values_from({"TOKEN": secret}),
        )
        assert res.stdout_truncated
        assert res.stdout == "x" * (1000 - kept_part) + REDACTED, kept_part


def test_a_secret_straddling_the_start_of_the_stderr_tail_of_a_real_process(tmp_path):
    secret = "0123456789abcdef0123"
    code = f"import sys; sys.stderr.write('x' * 50 + {secret!r} + 'y' * 30)"
    res = run_process(
        py(code),
        cwd=str(tmp_path),
        env=env(),
        stderr_limit=35,
        sensitive_values=sensitive_values_from({"TOKEN": secret}),
    )
    assert res.stderr_truncated and res.stderr == REDACTED + "y" * 30
    assert not re.search("[0-9a-f]", res.stderr.replace(REDACTED, ""))
