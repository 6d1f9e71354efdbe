"""The real agent CLIs — claude, codex, opencode, gemini from npm — running akm agent units end to end.

Each CLI (tests/agent_clis, pinned by its lock file; `.ci/run` installs it) is configured as a user would
(tests/real_clis.py) against a loopback fake of the model API it speaks (tests/fake_model_apis.py), and akm
runs a one-step workflow with an output schema on a plain engine `{"kind": "agent", "platform": P}`, once per
way the model API can behave:

  ok        the unit completes: the schema's JSON parsed, tokens and session id journaled
  401       the key is refused: the unit fails `agent_auth` within seconds, saying so (no timeout is set)
  429       rate limited every time: the unit fails `llm_rate_limit` within a bound (the CLI's own retries
            are limited or watched and stopped by akm)
  500→ok    one server error, then an answer: completed, the answer's tokens counted once
  notjson   prose first: completed — after akm's corrective re-ask, or (claude, with --json-schema) the
            CLI's own
  timeout   the API never answers: the unit fails `timeout` once its `timeout` passed (and not much later)
  missing   the binary is not on PATH: `spawn_failed` at once

The seven of one CLI run at once (separate akm processes, one fake server); every case asserts its code and a
time bound. In CI (CI=1) the CLIs must be installed: their absence fails, never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests import fake_harness, real_clis
from tests.fake_model_apis import IN_TOKENS, OUT_TOKENS, ROUTER_IN, ROUTER_OUT, FakeModelApis
from tests.helpers import ROOT

pytestmark = real_clis.skip_or_fail()

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
TIMEOUT_S = 25  # the `timeout` case's unit timeout: above every CLI's start on a busy machine
KILL_GRACE_S = 5  # SIGTERM, then SIGKILL (akm.dispatch.process.KILL_GRACE_S)
# What each case must end as, and within how many seconds of akm's start (generous: CI is a busy 2-core box).
CASES: dict[str, tuple[str, str | None, float]] = {
    "ok": ("completed", None, 120),
    "401": ("failed", "agent_auth", 90),  # claude: 60 (the acceptance), checked in test_claude
    "429": ("failed", "llm_rate_limit", 120),
    "500ok": ("completed", None, 120),
    "notjson": ("completed", None, 150),
    "timeout": ("failed", "timeout", TIMEOUT_S + KILL_GRACE_S + 45),
    "missing": ("failed", "spawn_failed", 30),
}
# Tokens the fake API counts per answer; gemini's model router asks it once more, with its own figures.
ANSWER_TOKENS = {p: IN_TOKENS + OUT_TOKENS for p in real_clis.PLATFORMS}
ANSWER_TOKENS["gemini"] = (IN_TOKENS + OUT_TOKENS + 7) + (ROUTER_IN + ROUTER_OUT)  # 7: its thinking tokens
RESULTS: dict[str, dict[str, Any]] = {}  # platform -> case -> outcome (printed as the matrix at the end)


@pytest.fixture(scope="module")
def apis():
    server = FakeModelApis()
    yield server
    server.close()


def _workflow(project: Path, timeout: str | None) -> Path:
    unit = f"\n    unit: {{ timeout: {timeout} }}" if timeout else ""
    path = project / "flow.md"
    path.write_text(
        "---\nsteps:\n  - id: answer\n    output: " + json.dumps(SCHEMA) + unit + "\n---\n\n"
        "## answer\n\nAnswer with the JSON object the schema describes: set ok to true.\n",
        encoding="utf-8",
    )
    return path


def _run_case(platform: str, case: str, apis: FakeModelApis, tmp: Path) -> dict[str, Any]:
    """One akm process running the workflow with `platform` in `case`; what it journaled and how long it took."""
    behaviour = {"timeout": "slow", "missing": "ok"}.get(case, case)
    scenario = f"{behaviour}.{case}-{platform}"
    home, project = tmp / case / "home", tmp / case / "project"
    project.mkdir(parents=True)
    conf = real_clis.setup(platform, home, project, apis.base(scenario))
    xdg = tmp / case / "xdg"
    (xdg / "akm").mkdir(parents=True)
    (xdg / "akm" / "config.json").write_text(
        json.dumps({"engines": {"agent": conf["engine"]}, "defaults": {"agentEngine": "agent"}}), encoding="utf-8"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AKM_", "ANTHROPIC_", "OPENAI_", "GEMINI_"))}
    env.update(conf["env"])
    env.update({"AKM_DATA_DIR": str(tmp / case / "akm-data"), "XDG_CONFIG_HOME": str(xdg), "PYTHONPATH": str(ROOT)})
    if case == "missing":
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != real_clis.BIN)
    wf = _workflow(project, f"{TIMEOUT_S}s" if case == "timeout" else None)
    akm = [sys.executable, "-m", "akm"]
    started = time.monotonic()
    run = subprocess.run(
        [*akm, "workflow", "run", str(wf), "--format", "json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - started
    assert run.stdout.strip(), f"{platform} {case}: akm printed nothing (exit {run.returncode}):\n{run.stderr[-3000:]}"
    result = json.loads(run.stdout)
    run_id = result["run"]["runId"]
    status = subprocess.run(
        [*akm, "workflow", "status", run_id, "--units", "--format", "json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    view = json.loads(status.stdout)
    watched = ""
    if case == "ok":  # what `status --watch` shows of it: the journal's events, the CLI's activity among them
        watched = subprocess.run(
            [*akm, "workflow", "status", run_id, "--watch"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        ).stderr
    [unit] = [u for u in view["units"] if u["phase"] == "unit"]
    step = view["steps"][0]
    return {
        "status": result["run"]["status"],
        "reason": unit["failureReason"],
        "seconds": round(seconds, 1),
        "unit": unit,
        "step": step,
        "text": json.dumps(result) + json.dumps(step),
        "main": len(apis.of(scenario)),
        "requests": apis.of(scenario, kind=None),
        "exit": run.returncode,
        "watched": watched,
    }


def _matrix(platform: str, apis: FakeModelApis, tmp_path: Path) -> dict[str, dict[str, Any]]:
    real_clis.require()
    with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
        futures = {case: pool.submit(_run_case, platform, case, apis, tmp_path) for case in CASES}
        got = {case: f.result() for case, f in futures.items()}
    RESULTS[platform] = got
    for case, (status, reason, bound) in CASES.items():
        o = got[case]
        brief = {k: v for k, v in o.items() if k != "requests"}
        assert (o["status"], o["reason"]) == (status, reason), f"{platform} {case}: {str(brief)[:4000]}"
        assert o["seconds"] < bound, f"{platform} {case}: {o['seconds']} s, more than {bound} s"
    return got


def _check_common(platform: str, got: dict[str, dict[str, Any]]) -> None:
    ok = got["ok"]
    assert ok["step"]["output"] == {"ok": True}
    assert ok["unit"]["tokens"] == ANSWER_TOKENS[platform], ok["unit"]
    assert ok["unit"]["sessionId"], ok["unit"]  # the CLI's own session id, journaled and shown
    # 401: refused at once — one call (claude, gemini and opencode may ask a second model first), no retry storm
    refused = got["401"]
    assert refused["main"] <= 2, refused["requests"]
    assert "refused" in refused["text"] and "API key" in refused["text"], refused["text"][:3000]
    assert refused["unit"]["tokens"] is None  # nothing was answered: unknown, not 0
    # 500 then ok: retried by the CLI, the answer's tokens counted once
    flaky = got["500ok"]
    assert flaky["main"] == 2 and flaky["step"]["output"] == {"ok": True}
    assert flaky["unit"]["tokens"] == ANSWER_TOKENS[platform]
    # the timeout: not much later than the unit's timeout, and the stuck call was really in flight
    assert got["timeout"]["seconds"] >= TIMEOUT_S - 1 and got["timeout"]["main"] >= 1 or platform == "opencode"
    assert "not on PATH" in got["missing"]["text"]
    if platform != "gemini":  # gemini's JSON output comes at its end: nothing to follow while it runs
        assert "[answer] answer:solo: " in got["ok"]["watched"], got["ok"]["watched"]
    assert "Reading additional input from stdin" not in json.dumps(got)


def _reasked(o: dict[str, Any]) -> bool:
    """Did akm re-ask (the corrective feedback reached the model)?"""
    return any("could not be read as JSON" in json.dumps(r["body"]) for r in o["requests"])


def test_claude(apis, tmp_path):
    got = _matrix("claude", apis, tmp_path)
    _check_common("claude", got)
    assert got["401"]["seconds"] < 60  # no timeout set, a refused key: failed within a minute
    # --json-schema: claude re-asks the model itself (its StructuredOutput tool), akm never has to
    assert got["notjson"]["main"] == 2 and not _reasked(got["notjson"])
    assert any(t.get("name") == "StructuredOutput" for t in got["ok"]["requests"][0]["body"].get("tools", []))


def test_codex(apis, tmp_path):
    got = _matrix("codex", apis, tmp_path)
    _check_common("codex", got)
    assert _reasked(got["notjson"])
    assert got["notjson"]["unit"]["tokens"] == 2 * ANSWER_TOKENS["codex"]  # both calls of the attempt counted


def test_opencode(apis, tmp_path):
    got = _matrix("opencode", apis, tmp_path)
    _check_common("opencode", got)
    assert _reasked(got["notjson"])


def test_gemini(apis, tmp_path):
    """gemini on a plain engine: trusted headless (it exits 55 in a folder it was not told to trust), its model
    router's tokens reported apart from the main model's."""
    got = _matrix("gemini", apis, tmp_path)
    _check_common("gemini", got)
    assert _reasked(got["notjson"])


@pytest.fixture(scope="module", autouse=True)
def _print_matrix():
    yield
    if not RESULTS:
        return
    rows = ["", "real agent CLIs × model API behaviour → outcome (failure reason), seconds:"]
    head = f"  {'CLI':<9}" + "".join(f"{c:<27}" for c in CASES)
    rows.append(head)
    for platform, got in RESULTS.items():
        cells = [f"{o['status'][:4]} {o['reason'] or '-'} {o['seconds']}s" for o in got.values()]
        rows.append(f"  {platform:<9}" + "".join(f"{c:<27}" for c in cells))
    print("\n".join(rows), file=sys.__stderr__)


def test_the_fakes_replay_what_the_pinned_clis_print():
    """tests/agent_clis/captured/ must come from the versions tests/agent_clis pins (re-run
    `python -m tests.agent_clis.capture` after a bump); the fake CLIs replay them."""
    real_clis.require()
    for platform in real_clis.PLATFORMS:
        for capture in sorted((fake_harness.CAPTURED / platform).glob("*.json")):
            got = json.loads(capture.read_text(encoding="utf-8"))
            assert got["version"] == real_clis.version(platform), f"{capture}: captured from {got['version']}"
