"""The exec unit runner against real subprocesses (spec-exec-and-deltas §1, D9)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from akm.dispatch.exec import (
    DEFAULT_EXEC_TIMEOUT_MS,
    EXEC_ENV_ALLOWLIST,
    STDERR_CAPTURE_BYTES,
    STDOUT_CAPTURE_BYTES,
    ExecRequest,
    build_exec_context,
    run_exec_unit,
)
from akm.dispatch.redact import REDACTED, sensitive_values_from
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX process groups")

PY = sys.executable


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def req(tmp_path: Path, command: list[str], **kw) -> ExecRequest:
    kw.setdefault("context", {"AKM_UNIT_ID": "work:solo"})
    return ExecRequest(command=command, base_dir=str(tmp_path), **kw)


def run_with_schema(r: ExecRequest, schema: dict | None = None):
    """An exec unit with an output schema: the engine's structured loop over the exec dispatcher."""
    from akm.dispatch.base import UnitRequest
    from akm.dispatch.exec import ExecDispatcher
    from akm.engine.structured import run_structured
    from akm.plan.model import ExecSpec

    request = UnitRequest(
        run_id="r",
        step_id="work",
        unit_id="work:solo",
        attempt_id="work:solo",
        kind="exec",
        cwd=r.base_dir,
        output_schema={} if schema is None else schema,
        timeout_ms=r.timeout_ms,
        exec_spec=ExecSpec(command=r.command, cwd=r.cwd),
        exec_context=r.context,
        env_bindings=r.env_bindings,
        sensitive_values=r.sensitive_values,
    )
    return run_structured(ExecDispatcher(), request, threading.Event())


def pid_gone(pid: int) -> bool:
    """Dead, or a zombie nobody reaped yet (PID 1 in a container may not reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_gone(pid: int, within: float = 60.0) -> bool:
    """True once `pid` is gone; the deadline is generous (a loaded CI box), a pass returns at once."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if pid_gone(pid):
            return True
        time.sleep(0.02)
    return pid_gone(pid)


def child_env(tmp_path: Path, **kw) -> dict:
    res = run_exec_unit(req(tmp_path, py("import os,json;print(json.dumps(dict(os.environ)))"), **kw))
    assert res.ok, res.error
    return json.loads(res.text)


# --------------------------------------------------------------------------- basics


def test_constants():
    assert DEFAULT_EXEC_TIMEOUT_MS == 600_000
    assert STDOUT_CAPTURE_BYTES == 1024 * 1024 and STDERR_CAPTURE_BYTES == 64 * 1024
    assert len(EXEC_ENV_ALLOWLIST) == 26
    assert EXEC_ENV_ALLOWLIST[0] == "PATH" and EXEC_ENV_ALLOWLIST[-1] == "AKM_EVENT_SOURCE"


def test_success_strips_trailing_newlines_only(tmp_path):
    res = run_exec_unit(req(tmp_path, ["printf", "built ok\n\n"]))
    assert res.ok and res.text == "built ok" and res.failure_reason is None and not res.has_result
    res = run_exec_unit(req(tmp_path, ["printf", "a\r\n\r\n"]))
    assert res.text == "a"
    res = run_exec_unit(req(tmp_path, ["printf", "\n a \n \n"]))
    assert res.text == "\n a \n "


def test_empty_stdout_is_no_text(tmp_path):
    res = run_exec_unit(req(tmp_path, ["true"]))
    assert res.ok and res.text is None and res.error is None


def test_argv_reaches_child_literally_no_shell(tmp_path):
    evil = "; touch pwned && echo $(whoami) `id` * > out.txt | cat"
    res = run_exec_unit(req(tmp_path, ["printf", "%s", evil]))
    assert res.ok and res.text == evil
    assert list(tmp_path.iterdir()) == []


def test_invalid_utf8_is_replaced(tmp_path):
    res = run_exec_unit(req(tmp_path, py("import sys;sys.stdout.buffer.write(b'ok\\xff!')")))
    assert res.ok and res.text == "ok\ufffd!"


def test_stdin_is_devnull(tmp_path):
    res = run_exec_unit(req(tmp_path, py("import sys;print(repr(sys.stdin.read()))"), timeout_ms=5000))
    assert res.ok and res.text == "''"


def test_runs_in_base_dir_and_relative_cwd(tmp_path):
    (tmp_path / "packages" / "core").mkdir(parents=True)
    res = run_exec_unit(req(tmp_path, ["pwd", "-P"]))
    assert res.text == os.path.realpath(tmp_path)
    res = run_exec_unit(req(tmp_path, ["pwd", "-P"], cwd="packages/core"))
    assert res.ok and res.text == os.path.realpath(tmp_path / "packages" / "core")


# --------------------------------------------------------------------------- failures


def test_non_zero_exit_with_stderr(tmp_path):
    res = run_exec_unit(req(tmp_path, ["sh", "-c", "printf X; echo boom >&2; exit 3"]))
    assert not res.ok and res.failure_reason == "non_zero_exit"
    assert "exited 3" in res.error and "boom" in res.error
    assert '"work:solo"' in res.error
    assert res.text == "X"  # stdout travels as text; stderr never does
    assert "boom" not in res.text


def test_stderr_only_failure_keeps_diagnostic(tmp_path):
    res = run_exec_unit(req(tmp_path, ["sh", "-c", "echo 'cannot find config' >&2; exit 7"]))
    assert res.failure_reason == "non_zero_exit" and res.text is None
    assert "exited 7" in res.error and ". stderr:\ncannot find config" in res.error


def test_long_stderr_tail_is_clipped(tmp_path):
    res = run_exec_unit(req(tmp_path, py("import sys;sys.stderr.write('e'*5000+'THE-END');sys.exit(1)")))
    assert "stderr (last 1500 chars):\n…" in res.error
    assert res.error.endswith("THE-END")
    assert len(res.error) <= 2001


def test_missing_binary_is_spawn_failed(tmp_path):
    res = run_exec_unit(req(tmp_path, ["akm-no-such-binary-xyz", "a", "b"]))
    assert not res.ok and res.failure_reason == "spawn_failed"
    assert 'could not start "akm-no-such-binary-xyz" (2 arguments)' in res.error
    assert res.text is None


def test_missing_cwd_is_spawn_failed_nothing_spawned(tmp_path):
    marker = tmp_path / "ran"
    res = run_exec_unit(req(tmp_path, ["touch", str(marker)], cwd="nope/missing"))
    assert res.failure_reason == "spawn_failed" and "working directory" in res.error
    assert not marker.exists()


def test_a_working_directory_removed_between_units_is_still_named(tmp_path):
    # Directory checks are cached for a fan-out's units; one that disappears later is still
    # reported as the working directory (not as an obscure spawn error), before any other check.
    work = tmp_path / "work"
    work.mkdir()
    assert run_exec_unit(req(tmp_path, ["true"], cwd="work")).ok
    work.rmdir()
    res = run_exec_unit(req(tmp_path, ["true"], cwd="work"))
    assert res.failure_reason == "spawn_failed" and "working directory" in res.error and "missing" in res.error
    res = run_exec_unit(req(tmp_path, ["true"], cwd="work", context={"AKM_INPUTS": "x" * 98_305}))
    assert res.failure_reason == "spawn_failed" and "working directory" in res.error


def test_a_program_that_moved_is_found_again_on_path(tmp_path):
    # Lookups are cached per (name, PATH); a cached program that is gone is looked up once more.
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    for d, word in ((first, "one"), (second, "two")):
        tool = d / "akm-moving-tool"
        tool.write_text(f"#!/bin/sh\necho {word}\n")
        tool.chmod(0o755)
    path = {"PATH": f"{first}{os.pathsep}{second}{os.pathsep}{os.environ['PATH']}"}
    assert run_exec_unit(req(tmp_path, ["akm-moving-tool"], env_bindings=path)).text == "one"
    (first / "akm-moving-tool").unlink()
    assert run_exec_unit(req(tmp_path, ["akm-moving-tool"], env_bindings=path)).text == "two"
    (second / "akm-moving-tool").unlink()
    res = run_exec_unit(req(tmp_path, ["akm-moving-tool"], env_bindings=path))
    assert res.failure_reason == "spawn_failed"


def test_cwd_escape_via_symlink_nothing_spawned(tmp_path):
    base = tmp_path / "base"
    outside = tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    (base / "reports").symlink_to(outside, target_is_directory=True)
    marker = tmp_path / "ran"
    res = run_exec_unit(ExecRequest(command=["touch", str(marker)], base_dir=str(base), cwd="reports"))
    assert res.failure_reason == "exec_cwd_escape"
    assert '"reports"' in res.error and str(outside.resolve()) in res.error
    assert not marker.exists()
    res = run_exec_unit(ExecRequest(command=["touch", str(marker)], base_dir=str(base), cwd="../outside"))
    assert res.failure_reason == "exec_cwd_escape" and not marker.exists()
    # a missing tail under an escaping symlink is still an escape, not "missing dir"
    res = run_exec_unit(ExecRequest(command=["true"], base_dir=str(base), cwd="reports/not/yet"))
    assert res.failure_reason == "exec_cwd_escape"


def test_base_dir_reached_through_symlink_is_fine(tmp_path):
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    res = run_exec_unit(ExecRequest(command=["pwd", "-P"], base_dir=str(link), cwd="sub"))
    assert res.ok and res.text == str((real / "sub").resolve())


def test_signal_killed_command_is_non_zero_exit(tmp_path):
    res = run_exec_unit(req(tmp_path, ["sh", "-c", "echo dying >&2; kill -KILL $$"]))
    assert res.failure_reason == "non_zero_exit"
    assert "SIGKILL" in res.error and "dying" in res.error


# --------------------------------------------------------------------------- timeout / cancel


def test_timeout_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "gc.pid"
    shell_pid = tmp_path / "sh.pid"
    marker = tmp_path / "late"
    # The timeout must leave the shell time to write its pids and say "started" (a busy CI box can take a
    # second to start `sh`): 3 s, far below the 300 s the group would live without the kill.
    script = f"sleep 300 & echo $! > {pidfile}; echo $$ > {shell_pid}; echo started; sleep 300; touch {marker}"
    t0 = time.monotonic()
    res = run_exec_unit(req(tmp_path, ["sh", "-c", script], timeout_ms=3000))
    elapsed = time.monotonic() - t0
    assert res.failure_reason == "timeout" and not res.ok
    assert "timed out after 3000 ms" in res.error and "process group was terminated" in res.error
    assert res.text == "started"
    assert elapsed < 150  # not the 300 s the group would live without the kill (generous: CI is loaded)
    grandchild = int(pidfile.read_text())
    assert wait_gone(grandchild)
    assert wait_gone(int(shell_pid.read_text()))  # the shell itself, not only its background child
    assert not marker.exists()


def test_timeout_escalates_to_kill_when_term_is_ignored(tmp_path):
    # the only test that pays the full 5 s TERM->KILL grace
    pidfile = tmp_path / "child.pid"
    # The TERM must come after `trap '' TERM` ran: a timeout of 3 s, not a window a loaded box's `sh` can miss.
    t0 = time.monotonic()
    res = run_exec_unit(
        req(tmp_path, ["sh", "-c", f"trap '' TERM; sleep 300 & echo $! > {pidfile}; wait"], timeout_ms=3000)
    )
    elapsed = time.monotonic() - t0
    assert res.failure_reason == "timeout"
    assert 3 + 4.5 < elapsed < 150  # the 5 s grace is honoured, and KILL comes long before `sleep 300` ends
    assert wait_gone(int(pidfile.read_text()))


def test_cancel_while_running_is_aborted(tmp_path):
    cancel = threading.Event()
    pidfile = tmp_path / "child.pid"

    def cancel_once_running() -> None:  # the event, not a fixed 0.3 s a loaded box's `sh` can miss
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the unit to start")
        cancel.set()

    threading.Thread(target=cancel_once_running, daemon=True).start()
    t0 = time.monotonic()
    res = run_exec_unit(req(tmp_path, ["sh", "-c", f"echo $$ > {pidfile}; sleep 300"], timeout_ms=None), cancel=cancel)
    assert res.failure_reason == "aborted" and "cancelled" in res.error
    assert time.monotonic() - t0 < 150  # long before `sleep 300` would end on its own
    assert wait_gone(int(pidfile.read_text()))


def test_cancel_before_start_spawns_nothing(tmp_path):
    cancel = threading.Event()
    cancel.set()
    marker = tmp_path / "ran"
    res = run_exec_unit(req(tmp_path, ["touch", str(marker)]), cancel=cancel)
    assert res.failure_reason == "aborted" and "not dispatched" in res.error
    assert not marker.exists()


# --------------------------------------------------------------------------- environment


def test_env_allowlist_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("AKM_EXEC_CANARY", "canary")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nope")
    monkeypatch.setenv("HOME", os.environ.get("HOME", "/root"))
    env = child_env(tmp_path)
    assert "AKM_EXEC_CANARY" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert "PATH" in env and env["HOME"] == os.environ["HOME"]
    allowed = set(EXEC_ENV_ALLOWLIST) | {"AKM_UNIT_ID", "AKM_GUARD"}  # AKM_GUARD: see akm/dispatch/guard.py
    # the interpreter may add LC_CTYPE (locale coercion), which is on the list anyway
    assert set(env) <= allowed, set(env) - allowed


def test_absent_allowlisted_var_stays_absent(tmp_path, monkeypatch):
    monkeypatch.delenv("TZ", raising=False)
    env = child_env(tmp_path)
    assert "TZ" not in env


def test_pass_env_and_inherit_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AKM_EXEC_CANARY", "canary")
    assert child_env(tmp_path, pass_env=["AKM_EXEC_CANARY"])["AKM_EXEC_CANARY"] == "canary"
    assert child_env(tmp_path, inherit_env=True)["AKM_EXEC_CANARY"] == "canary"
    assert "AKM_EXEC_NOT_SET" not in child_env(tmp_path, pass_env=["AKM_EXEC_NOT_SET"])


def test_binding_and_context_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("FOO", "parent")
    env = child_env(
        tmp_path,
        pass_env=["FOO"],
        env_bindings={"FOO": "1", "AKM_RUN_ID": "spoof", "BAR": "b"},
        context={"AKM_RUN_ID": "run-real", "AKM_UNIT_ID": "work:solo"},
    )
    assert env["FOO"] == "1" and env["BAR"] == "b"
    assert env["AKM_RUN_ID"] == "run-real"


def test_command_resolved_through_child_path(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "akm-test-tool"
    tool.write_text("#!/bin/sh\necho tool-ran\n")
    tool.chmod(0o755)
    res = run_exec_unit(req(tmp_path, ["akm-test-tool"]))
    assert res.failure_reason == "spawn_failed"
    res = run_exec_unit(
        req(tmp_path, ["akm-test-tool"], env_bindings={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    )
    assert res.ok and res.text == "tool-ran"


# --------------------------------------------------------------------------- context


def test_build_exec_context_solo_and_map():
    solo = build_exec_context(run_id="r1", step_id="work", unit_id="work:solo", params=None)
    assert solo == {"AKM_RUN_ID": "r1", "AKM_STEP_ID": "work", "AKM_UNIT_ID": "work:solo", "AKM_PARAMS": "{}"}
    m = build_exec_context(
        run_id="r1",
        step_id="work",
        unit_id="work:abc",
        params={"z": 1, "a": "é"},
        item={"b": 1, "a": 2},
        item_index=0,
        inputs={"steps.plan.output": {"y": [1], "x": None}},
    )
    assert m["AKM_PARAMS"] == '{"a":"é","z":1}'
    assert m["AKM_ITEM"] == '{"a":2,"b":1}' and m["AKM_ITEM_INDEX"] == "0"
    assert m["AKM_INPUTS"] == '{"steps.plan.output":{"x":null,"y":[1]}}'
    assert (
        build_exec_context(run_id="r", step_id="s", unit_id="u", params={}, item=None, item_index=3)["AKM_ITEM"]
        == "null"
    )


def test_context_reaches_child(tmp_path):
    ctx = build_exec_context(
        run_id="r1", step_id="work", unit_id="work:abc", params={"p": 1}, item={"b": 1, "a": 2}, item_index=0
    )
    res = run_exec_unit(
        req(tmp_path, py("import os;print(os.environ['AKM_ITEM'], os.environ['AKM_ITEM_INDEX'])"), context=ctx)
    )
    assert res.text == '{"a":2,"b":1} 0'


def test_context_too_large_nothing_spawned(tmp_path):
    marker = tmp_path / "ran"
    big = {"AKM_UNIT_ID": "work:solo", "AKM_INPUTS": "x" * 98_305}
    res = run_exec_unit(req(tmp_path, ["touch", str(marker)], context=big))
    assert res.failure_reason == "exec_context_too_large" and "AKM_INPUTS" in res.error
    assert "98305" in res.error and "98304" in res.error
    assert not marker.exists()
    total = {"AKM_ITEM": "x" * 70_000, "AKM_INPUTS": "y" * 70_000}
    res = run_exec_unit(req(tmp_path, ["touch", str(marker)], context=total))
    assert res.failure_reason == "exec_context_too_large"
    assert "AKM_ITEM" in res.error and "AKM_INPUTS" in res.error and "131072" in res.error
    assert not marker.exists()


def test_context_of_40000_bytes_passes(tmp_path):
    ctx = {"AKM_INPUTS": "é" * 20_000}  # 40000 UTF-8 bytes
    res = run_exec_unit(req(tmp_path, py("import os;print(len(os.environ['AKM_INPUTS']))"), context=ctx))
    assert res.ok and res.text == "20000"


# --------------------------------------------------------------------------- output volume


def _writer(n_bytes: int, marker: Path, stream: str = "stdout") -> list[str]:
    return py(
        f"import sys\nb=sys.{stream}.buffer\nfor _ in range({n_bytes // 65536}): b.write(b'a'*65536)\n"
        f"b.flush()\nopen({str(marker)!r},'w').write('done')"
    )


def test_big_stdout_without_schema_is_its_beginning_marked_truncated(tmp_path):
    marker = tmp_path / "done"
    res = run_exec_unit(req(tmp_path, _writer(3 * 1024 * 1024, marker)))
    assert res.ok, res.error
    assert marker.exists()  # the child ran to the end: the rest was drained, not blocked
    assert res.truncated
    assert res.text == "a" * STDOUT_CAPTURE_BYTES  # exactly the kept beginning, no in-band marker


def test_big_stdout_with_schema_is_output_limit(tmp_path):
    marker = tmp_path / "done"
    res = run_with_schema(req(tmp_path, _writer(12 * 1024 * 1024, marker)))
    assert res.failure_reason == "exec_output_limit"
    assert res.text is None and not res.has_result
    assert "nothing was promoted" in res.error and "one JSON value" in res.error and res.truncated
    assert marker.exists()


def test_big_stderr_never_fails(tmp_path):
    marker = tmp_path / "done"
    res = run_exec_unit(req(tmp_path, _writer(9 * 1024 * 1024, marker, "stderr")))
    assert res.ok and res.text is None and marker.exists() and not res.truncated


def test_big_stderr_diagnostic_shows_its_end(tmp_path):
    code = "import sys\nsys.stderr.write('x' * 3_000_000 + 'THE REAL ERROR')\nsys.exit(3)"
    res = run_exec_unit(req(tmp_path, py(code)))
    assert res.failure_reason == "non_zero_exit"
    assert res.error.endswith("xxxxTHE REAL ERROR") and "exited 3" in res.error


def test_truncation_cuts_on_character_boundary(tmp_path):
    # 'a' then 2-byte characters: the cap falls in the middle of one
    res = run_exec_unit(
        req(tmp_path, py(f"import sys;sys.stdout.buffer.write(b'a'+'é'.encode()*{STDOUT_CAPTURE_BYTES // 2 + 10})"))
    )
    assert res.ok and res.truncated
    assert "\ufffd" not in res.text
    assert len(res.text.encode()) == STDOUT_CAPTURE_BYTES - 1


# --------------------------------------------------------------------------- D9: leader exits, child holds stdout


def test_background_child_holding_stdout_is_killed(tmp_path):
    pidfile = tmp_path / "bg.pid"
    script = f"echo partial-artifact; sleep 30 & echo $! > {pidfile}; exit 0"
    t0 = time.monotonic()
    res = run_exec_unit(req(tmp_path, ["sh", "-c", script], timeout_ms=60_000))
    elapsed = time.monotonic() - t0
    assert res.failure_reason == "spawn_failed"
    assert "output capture did not complete" in res.error and "drain timed out" in res.error
    assert res.text is None and "partial-artifact" not in res.error
    assert elapsed < 30  # far below the 60 s unit timeout it would otherwise hang until
    assert wait_gone(int(pidfile.read_text()))


def test_detached_child_escaping_the_group_cannot_hold_the_unit(tmp_path):
    pidfile = tmp_path / "bg.pid"
    code = (
        "import os,sys,time\n"
        "print('partial-artifact', flush=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open({str(pidfile)!r},'w').write(str(os.getpid()))\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "os._exit(0)\n"
    )
    t0 = time.monotonic()
    try:
        res = run_exec_unit(req(tmp_path, py(code), timeout_ms=60_000))
        elapsed = time.monotonic() - t0
        assert res.failure_reason == "spawn_failed" and "drain timed out" in res.error
        assert res.text is None
        assert elapsed < 30  # far below the 60 s unit timeout
        # the reader threads were stopped, not abandoned on the held pipe
        assert not [t for t in threading.enumerate() if t.name.startswith("akm-exec-")]
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_background_child_with_redirected_output_does_not_block(tmp_path):
    pidfile = tmp_path / "bg.pid"
    script = f"sleep 30 >/dev/null 2>&1 & echo $! > {pidfile}; echo done"
    t0 = time.monotonic()
    try:
        res = run_exec_unit(req(tmp_path, ["sh", "-c", script]))
        assert res.ok and res.text == "done"
        assert time.monotonic() - t0 < 25  # did not wait for the background `sleep 30`
    finally:
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, FileNotFoundError):
            pass


# --------------------------------------------------------------------------- redaction


SECRET = "s3cr3t-Value-9876"


def test_secret_on_stdout_is_redacted(tmp_path):
    bindings = {"API_TOKEN": SECRET}
    res = run_exec_unit(
        req(
            tmp_path,
            ["sh", "-c", 'echo "token is $API_TOKEN"'],
            env_bindings=bindings,
            sensitive_values=sensitive_values_from(bindings),
        )
    )
    assert res.ok and res.text == f"token is {REDACTED}"


def test_secret_on_stderr_is_redacted_in_error(tmp_path):
    bindings = {"API_TOKEN": SECRET}
    res = run_exec_unit(
        req(
            tmp_path,
            ["sh", "-c", 'echo "$API_TOKEN" ; echo "auth failed for $API_TOKEN" >&2; exit 1'],
            env_bindings=bindings,
            sensitive_values=sensitive_values_from(bindings),
        )
    )
    assert res.failure_reason == "non_zero_exit"
    assert SECRET not in res.error and SECRET not in (res.text or "")
    assert f"auth failed for {REDACTED}" in res.error and res.text == REDACTED


def test_secret_at_end_of_huge_stderr(tmp_path):
    bindings = {"API_TOKEN": SECRET}
    code = "import os,sys;sys.stderr.write('x'*120000+os.environ['API_TOKEN']+'\\n');sys.exit(2)"
    res = run_exec_unit(
        req(tmp_path, py(code), env_bindings=bindings, sensitive_values=sensitive_values_from(bindings))
    )
    assert res.failure_reason == "non_zero_exit"
    assert SECRET not in res.error and REDACTED in res.error
    assert len(res.error) <= 2001


def test_secret_straddling_the_stderr_tail_boundary(tmp_path):
    # the tail starts in the middle of the secret: the surviving half must not leak either
    bindings = {"API_TOKEN": SECRET}
    code = f"import os,sys;sys.stderr.write('x'*100+os.environ['API_TOKEN']+'y'*{1500 - 5});sys.exit(2)"
    res = run_exec_unit(
        req(tmp_path, py(code), env_bindings=bindings, sensitive_values=sensitive_values_from(bindings))
    )
    assert SECRET[-5:] + "y" not in res.error
    assert SECRET[:-5] not in res.error


def test_secret_in_structured_result_is_redacted(tmp_path):
    bindings = {"API_TOKEN": SECRET}
    code = "import os,json;t=os.environ['API_TOKEN'];print(json.dumps({t:{'v':'x'+t}}))"
    res = run_with_schema(
        req(
            tmp_path,
            py(code),
            env_bindings=bindings,
            sensitive_values=sensitive_values_from(bindings),
        )
    )
    assert res.ok and res.has_result
    assert res.result == {REDACTED: {"v": "x" + REDACTED}}
    assert SECRET not in (res.text or "")


# --------------------------------------------------------------------------- strict JSON


@pytest.mark.parametrize(
    "stdout,value",
    [('{"ok":true}\n', {"ok": True}), ("\ufeff [1, 2]\n\n", [1, 2]), ("null", None), ('"s"', "s")],
)
def test_strict_json_success(tmp_path, stdout, value):
    res = run_with_schema(req(tmp_path, py(f"import sys;sys.stdout.write({stdout!r})")))
    assert res.ok and res.has_result and res.result == value


@pytest.mark.parametrize(
    "stdout,why",
    [
        ('log line {"ok":true}', 'does not start with a JSON value: line 1 column 1 reads "log line'),
        ("Building...\n{}", "a log line before the value"),
        ("", "the output is empty"),
        ("  \n", "the output is empty"),
        ("NaN", "NaN at line 1 column 1 is not a JSON value"),
        ('{"a":1} {"b":2}', 'text follows the JSON value at line 1 column 9: "{\\"b\\":2}"'),
        ("{bad}", "invalid JSON at line 1 column 2"),
        ("1e999", "the number 1e999 is out of range"),
        ('{"x": "1e999",\n "a": [1, 2e999]}', "invalid JSON at line 2 column 11: the number 2e999 is out of range"),
        ('{"NaN": [1, Infinity]}', "invalid JSON at line 1 column 13: Infinity is not a JSON value"),
        ('{"a": [1,', "the JSON value is cut off"),
    ],
)
def test_strict_json_parse_error(tmp_path, stdout, why):
    """Each problem is reported as what it is, with its position (issue 6 item 11)."""
    res = run_with_schema(req(tmp_path, py(f"import sys;sys.stdout.write({stdout!r})")))
    assert res.failure_reason == "parse_error" and not res.has_result
    assert why in res.error
    assert res.text == (stdout.rstrip("\n") or None)


def test_non_zero_exit_wins_over_json_parse(tmp_path):
    res = run_with_schema(req(tmp_path, ["sh", "-c", "echo '{}'; exit 4"]))
    assert res.failure_reason == "non_zero_exit" and not res.has_result
