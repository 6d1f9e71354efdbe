"""A newcomer's first hour (issue 39): what a person following the README, and an agent driving the corpus,
tripped over — each on the fronts it concerns.

Run ids typed in part or as `@last`; `workflow run FILE --help` with the workflow's params; "did you mean"
for a misspelt config key; `--result` meaning completed; one exit-status rule; a judge prompt that keeps a
rubric's own list; a step-level `on_error` pointed at `unit:`; the live board counting units, keeping its
total and its words; a loopback engine's one-at-a-time said where the user looks.
"""

from __future__ import annotations

import json

import pytest

from akm import api
from tests.helpers import create_run, open_test_journal, py, write_wf
from tests.test_mcp import call, err
from tests.test_session import journal

EXEC = "steps:\n  - id: a\n    unit: { exec: { command: %s } }" % py("print('hi')")
SESSION = "steps:\n  - id: write"


def _run_with_id(project, name: str, run_id: str) -> str:
    """A session run created with a chosen id (to make two ids share a prefix)."""
    wf = write_wf(project, name, SESSION, "## write\n\nWrite.")
    plan, _ = api.compile_workflow_file(wf)
    return create_run(project, wf, plan, run_id)


# ------------------------------------------------------------------ run ids: prefixes and @last


def test_a_unique_prefix_and_at_last_name_a_run_everywhere_at_the_cli(cli, project):
    write_wf(project, "first.md", EXEC, "## a\n\nA.")
    write_wf(project, "s.md", SESSION, "## write\n\nWrite.")
    first = cli.json("workflow", "run", "first.md")["run"]["runId"]
    rid = cli.json("workflow", "run", "s.md", check=3)["run"]["runId"]
    short = rid[:8]
    assert cli.json("workflow", "status", short)["runId"] == rid
    assert cli.json("workflow", "status", first[:6])["runId"] == first
    assert cli.json("workflow", "status", "@last")["runId"] == rid  # the newest of this project
    assert cli.json("workflow", "next", short)["runId"] == rid
    assert cli.json("log", "--run", short, "--since", "@offset:0")["run"] == rid
    out = cli.json("workflow", "report", "@last", "write:solo", "--result", "done")
    assert out["runId"] == rid and out["recorded"] == "written"
    assert cli.json("workflow", "run", short)["run"]["runId"] == rid  # continues it, no new run
    assert cli("workflow", "wait", "@last", check=0).returncode == 0
    assert len(cli.json("workflow", "list")["runs"]) == 2
    text = cli("workflow", "status", short, check=0).stdout
    assert rid in text


def test_an_ambiguous_or_too_short_prefix_is_refused_naming_the_candidates(cli, project):
    a = _run_with_id(project, "a.md", "abcdef12-0000-4000-8000-000000000001")
    b = _run_with_id(project, "b.md", "abcdef12-0000-4000-8000-000000000002")
    before = journal()
    out = cli("workflow", "report", "abcdef12", "write:solo", "--result", "x")
    assert out.returncode == 2 and "error[RUN_ID_AMBIGUOUS]" in out.stderr, out.stderr
    assert a in out.stderr and b in out.stderr and "Traceback" not in out.stderr
    err_json = json.loads(cli("workflow", "status", "abcdef", "--format", "json").stderr)
    assert err_json["code"] == "RUN_ID_AMBIGUOUS" and set(err_json["details"]["candidates"]) == {a, b}
    assert journal() == before, "a refused call changed the journal"
    assert cli.json("workflow", "status", a)["runId"] == a  # whole ids still work
    short = cli("workflow", "status", "abcde")
    assert short.returncode == 1 and "error[RUN_NOT_FOUND]" in short.stderr and "6 characters" in short.stderr
    none = cli("workflow", "status", "fedcba98")
    assert none.returncode == 1 and "error[RUN_NOT_FOUND]" in none.stderr


def test_at_last_in_a_project_without_runs_says_so(cli, project):
    out = cli("workflow", "status", "@last")
    assert out.returncode == 1 and "error[RUN_NOT_FOUND]" in out.stderr and "has none yet" in out.stderr


def test_prefixes_and_at_last_over_mcp(project, monkeypatch):
    monkeypatch.chdir(project)  # `@last` is the newest run of the server's project
    write_wf(project, "s.md", SESSION, "## write\n\nWrite.")
    _run_with_id(project, "a.md", "abcdef12-0000-4000-8000-000000000001")
    _run_with_id(project, "b.md", "abcdef12-0000-4000-8000-000000000002")

    async def script(c):
        rid = (await c.call_tool("workflow_run", {"target": "s.md"})).structured_content["run"]["runId"]
        status = (await c.call_tool("workflow_status", {"run_id": rid[:7]})).structured_content
        brief = (await c.call_tool("workflow_next", {"run_id": "@last"})).structured_content
        before = journal()
        ambiguous = await c.call_tool("unit_report", {"run_id": "abcdef12", "unit_id": "write:solo", "result": "x"})
        unchanged = journal() == before
        report = (
            await c.call_tool("unit_report", {"run_id": rid[:10], "unit_id": "write:solo", "result": "done"})
        ).structured_content
        events = (await c.call_tool("workflow_events", {"run_id": "@last"})).structured_content
        resumed = await c.call_tool("workflow_resume", {"run_id": rid[:8]})
        return rid, status, brief, ambiguous, unchanged, report, events, resumed

    rid, status, brief, ambiguous, unchanged, report, events, resumed = call(project, script)
    assert status["runId"] == rid and brief["runId"] == rid and report["runId"] == rid
    assert report["recorded"] == "written" and events["run"] == rid
    e = err(ambiguous)
    assert (
        e["code"] == "RUN_ID_AMBIGUOUS" and e["exitCode"] == 2 and "abcdef12-0000-4000-8000-000000000001" in e["error"]
    )
    assert unchanged, "a refused report changed the journal"
    assert rid in err(resumed)["error"]  # resolved to the whole id; refused for the run's state alone


# ------------------------------------------------------------------ workflow run FILE --help

PARAMS = """
    description: Review files and tally the verdicts.
    params:
      files: { type: array, items: { type: string }, description: the files to review }
      strict: { type: boolean, default: false, description: refuse on any nit }
      depth: { type: integer, default: 2 }
    steps:
      - id: a
        unit: { exec: { command: %s } }
    """ % py("print(1)")


def test_workflow_run_file_help_shows_the_workflows_params(cli, project):
    write_wf(project, "review.md", PARAMS, "## a\n\nA.")
    (project / ".akm" / "workflows").mkdir(parents=True)
    write_wf(project / ".akm" / "workflows", "review.md", PARAMS, "## a\n\nA.")
    for target in ("review.md", "workflows/review"):
        out = cli("workflow", "run", target, "--help", check=0).stdout
        assert f"usage: akm workflow run {target}" in out and "Review files and tally the verdicts." in out
        lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  --")}
        assert "required" in lines["--files"] and "the files to review" in lines["--files"]
        assert "ARRAY" in lines["--files"] and "BOOLEAN" in lines["--strict"]
        assert "default false" in lines["--strict"] and "default 2" in lines["--depth"]
        assert "--max-steps" in lines  # the run flags follow
    half = cli("workflow", "run", "review.md", "--files", "--help", check=0).stdout  # a half-typed line
    assert "--files ARRAY" in half
    generic = cli("workflow", "run", "--help", check=0).stdout
    assert generic.startswith("usage: akm workflow run TARGET") and "--files" not in generic
    for run_target in ("@last", "ce0c35b3", "ce0c35b3-0000-4000-8000-000000000000"):  # a run: params are fixed
        assert cli("workflow", "run", run_target, "--help", check=0).stdout == generic
    assert not list(api.list_runs(cwd=str(project)).runs)  # help starts nothing
    missing = cli("workflow", "run", "nope.md", "--help")
    assert missing.returncode == 1 and "error[WORKFLOW_NOT_FOUND]" in missing.stderr


# ------------------------------------------------------------------ did you mean, for config keys


def test_a_misspelt_engine_key_is_kept_but_said_with_did_you_mean(cli, project, monkeypatch):
    engine = {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"}
    out = cli("config", "set", "engines.fast", json.dumps({**engine, "timeoutMS": 5000, "pricee": 2}), check=0)
    assert "engines.fast.timeoutMS" in out.stderr and "did you mean timeoutMs?" in out.stderr
    assert "engines.fast.pricee" in out.stderr and "it is kept but does nothing" in out.stderr
    assert api.config_get("engines.fast")["timeoutMS"] == 5000  # kept (as upstream keeps unknown keys)
    change = cli.json("config", "set", "workflow.maxConcurrency", "2")
    assert any("timeoutMS" in w for w in change["warnings"])
    write_wf(project, "x.md", EXEC, "## a\n\nA.")
    res = cli.json("workflow", "run", "x.md")
    warned = [w for w in res["warnings"] if "engines.fast.timeoutMS" in w]
    assert warned and "did you mean timeoutMs?" in warned[0] and "config.json" in warned[0]
    # setup --config says it too
    setup = cli.json("setup", "--config", json.dumps({"workflow": {"maxConcurency": 3}}))
    assert any("workflow.maxConcurency" in w and "did you mean maxConcurrency?" in w for w in setup["warnings"])


# ------------------------------------------------------------------ --result means completed


def test_report_result_without_status_means_completed(cli, project):
    write_wf(project, "s.md", SESSION + "\n  - id: two", "## write\n\nWrite.\n\n## two\n\nTwo.")
    rid = cli.json("workflow", "run", "s.md", check=3)["run"]["runId"]
    out = cli.json("workflow", "report", rid, "write:solo", "--result", "done")
    assert out["status"] == "completed" and out["recorded"] == "written"
    cli("workflow", "run", rid, check=3)
    failed = cli.json("workflow", "report", rid, "two:solo", "--failure-reason", "timeout")
    assert failed["status"] == "failed"
    neither = cli("workflow", "report", rid, "two:solo")
    assert neither.returncode == 2 and "error[INVALID_ARGUMENT]" in neither.stderr and "--result" in neither.stderr


# ------------------------------------------------------------------ one exit-status rule, on both fronts


def test_exit_statuses_follow_the_code_on_both_fronts(cli, project):
    missing = cli("workflow", "run", "nope.md")
    assert missing.returncode == 1 and "error[WORKFLOW_NOT_FOUND]" in missing.stderr
    write_wf(project, "s.md", SESSION, "## write\n\nWrite.")
    rid = cli.json("workflow", "run", "s.md", check=3)["run"]["runId"]
    from akm.store import runs as runs_store

    with open_test_journal() as db:
        assert runs_store.acquire_lease(db, rid, "someone-else") is None
    held = cli("workflow", "run", rid)
    assert held.returncode == 2 and "error[LEASE_HELD]" in held.stderr

    async def script(c):
        return (
            await c.call_tool("workflow_run", {"target": "nope.md"}),
            await c.call_tool("unit_report", {"run_id": rid, "unit_id": "write:solo", "result": "x"}),
        )

    not_found, lease = call(project, script)
    assert err(not_found)["code"] == "WORKFLOW_NOT_FOUND" and err(not_found)["exitCode"] == 1
    assert err(lease)["code"] == "LEASE_HELD" and err(lease)["exitCode"] == 2


# ------------------------------------------------------------------ the judge prompt keeps the rubric's list


def test_the_judge_prompt_keeps_a_multi_line_rubric_as_written(cli, project):
    write_wf(
        project,
        "g.md",
        "steps:\n  - id: poem",
        "## poem\n\nWrite a haiku.\n\n### gate\n\n- It is a haiku.\n- It mentions rain.\n",
    )
    rid = cli.json("workflow", "run", "g.md", check=3)["run"]["runId"]
    cli.json("workflow", "report", rid, "poem:solo", "--result", "rain on the old roof")
    prompt = cli.json("workflow", "next", rid)["judge"]["prompt"]
    assert "Completion criteria:\n- It is a haiku.\n- It mentions rain.\n" in prompt
    assert "1. -" not in prompt


def test_several_criteria_are_numbered_one_per_item():
    from akm.engine.gates import rubric_text

    assert rubric_text(["It is short.", "It rhymes\nand scans."]) == "1. It is short.\n2. It rhymes\n   and scans."


# ------------------------------------------------------------------ a step-level on_error goes under unit:


@pytest.mark.parametrize(
    "frontmatter, where",
    [
        ("steps:\n  - id: a\n    on_error: continue", "write it under `unit:`, e.g. `unit: { on_error: continue }`"),
        (
            "steps:\n  - id: a\n    retry: { max: 1, on: [timeout] }",
            "write it under `unit:`, e.g. `unit: { retry: ... }`",
        ),
        (
            "params:\n  xs: { type: array }\nsteps:\n  - id: a\n    map: { over: params.xs, on_error: continue }",
            "`map: { ..., unit: { on_error: continue } }`",
        ),
    ],
)
def test_a_unit_setting_written_on_the_step_is_pointed_at_unit(cli, project, frontmatter, where):
    write_wf(project, "w.md", frontmatter, "## a\n\nA.")
    out = cli.json("workflow", "lint", "w.md", check=1)
    errors = out["files"][0]["errors"]
    assert errors and errors[0]["code"] == "unknown_key" and "is a setting of the" in errors[0]["hint"]
    assert where in errors[0]["hint"] and "allowed keys:" in errors[0]["hint"]


def test_unknown_step_keys_that_are_no_unit_setting_keep_the_plain_hint(cli, project):
    write_wf(project, "w.md", "steps:\n  - id: a\n    inptus: [params.x]", "## a\n\nA.")
    hint = cli.json("workflow", "lint", "w.md", check=1)["files"][0]["errors"][0]["hint"]
    assert "did you mean inputs" in hint.lower() or "inputs" in hint
    assert "setting of the" not in hint


# ------------------------------------------------------------------ the live board: units, a stable total, 80 columns


def _unit(step: str, unit: str, attempt: str, ok: bool, done: int, total: int):
    from akm.views import UnitFinished

    return UnitFinished(
        run_id="r",
        step_id=step,
        unit_id=unit,
        attempt_id=attempt,
        ok=ok,
        failure_reason=None if ok else "timeout",
        done=done,
        total=total,
    )


# 7 units, 10 attempts: u0, u1 and u2 fail once then pass on their retry; u6 fails for good.
ATTEMPTS = [("u0", "u0", False), ("u0", "u0~r1", True), ("u1", "u1", False), ("u1", "u1~r1", True)]
ATTEMPTS += [("u2", "u2", False), ("u2", "u2~r1", True), ("u3", "u3", True), ("u4", "u4", True)]
ATTEMPTS += [("u5", "u5", True), ("u6", "u6", False)]


def _step_line(board, step: str) -> str:
    return next(line for line in board.lines(80, 24) if f" {step} " in line)


def test_the_board_counts_units_not_attempts_and_its_total_holds_through_retries():
    from akm.report.live import Board
    from akm.views import StepStarted

    board = Board(started=0.0, clock=lambda: 5.0)
    board.progress(StepStarted(run_id="ce0c35b3-0000-4000-8000-000000000000", step_id="ask", total=7))
    totals = []
    for done, (unit, attempt, ok) in enumerate(ATTEMPTS, 1):
        board.progress(_unit("ask", unit, attempt, ok, done, 7))
        totals.append(board.steps["ask"].total)
    assert set(totals) == {7}, totals  # never grows as retries happen
    line = _step_line(board, "ask")
    assert "7/7 units" in line and "1 failed" in line, line
    assert "7 unit(s) done, 1 failed" in board.lines(80, 24)[0]


def test_a_board_following_events_counts_units_too():
    from akm.report.live import Board

    board = Board(started=0.0, clock=lambda: 5.0)
    for _, attempt, ok in ATTEMPTS:
        meta = {"stepId": "ask", "unitId": attempt}
        board.event({"eventType": "workflow_unit_started", "ts": "1970-01-01T00:00:01Z", "metadata": meta})
        status = "completed" if ok else "failed"
        board.event(
            {
                "eventType": "workflow_unit_finished",
                "ts": "1970-01-01T00:00:02Z",
                "metadata": {**meta, "status": status},
            }
        )
    line = _step_line(board, "ask")
    assert "7/7 units" in line and "1 failed" in line, line
    # a gate's next loop (`~l2`) counts its units afresh
    board.event(
        {
            "eventType": "workflow_unit_started",
            "ts": "1970-01-01T00:00:03Z",
            "metadata": {"stepId": "ask", "unitId": "u0~l2"},
        }
    )
    assert "0/1 units" in _step_line(board, "ask")


def test_the_board_fits_80_columns_without_cutting_a_word():
    from akm.report.live import Board, _fit
    from akm.views import StepStarted

    board = Board(started=0.0, clock=lambda: 3725.0)  # an hour in: the longest clock
    board.run_id = "ce0c35b3-1234-4cde-8f00-0123456789ab"
    board.note = "no driver holds this run right now, and this note is long enough to need shortening at 80"
    long_step = "summarise_every_open_incident_for_the_weekly_review"
    board.progress(StepStarted(run_id=board.run_id, step_id=long_step, total=12000, width=1, note="x " * 60))
    for i in range(12000):
        board.progress(_unit(long_step, f"u{i}", f"u{i}", i % 7 != 0, i + 1, 12000))
    lines = board.lines(80, 24)
    assert all(len(line) <= 79 for line in lines), [len(line) for line in lines]
    head = lines[0]
    assert head.startswith("akm run ce0c35b3 ")  # the short id: a unique prefix, usable as the run id
    full = board.lines(200, 24)[0]  # what a wide terminal shows whole
    assert full.endswith("12000 unit(s) done, 1715 failed")
    assert head == full or (head.endswith("…") and full.startswith(head[:-1]) and full[len(head) - 1] == " ")
    cut = _fit("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi", 40)
    assert cut == "alpha beta gamma delta epsilon zeta…", cut  # at a word boundary, ellipsis added


# ------------------------------------------------------------------ a loopback engine's width, said where the user looks

LOOPBACK_MAP = """
    params:
      qs: { type: array, items: { type: string }, default: [a, b, c] }
    steps:
      - id: ask
        map: { over: params.qs, concurrency: 3 }
    """


def _engine_config(project, endpoint: str, concurrency: int | None = None) -> None:
    engine = {"kind": "llm", "endpoint": endpoint, "model": "plain"}
    if concurrency is not None:
        engine["concurrency"] = concurrency
    (project / ".akm").mkdir(exist_ok=True)
    (project / ".akm" / "config.json").write_text(
        json.dumps({"engines": {"local": engine}, "defaults": {"llmEngine": "local"}}), encoding="utf-8"
    )


@pytest.mark.parametrize(
    "endpoint, concurrency, width, noted",
    [
        ("http://127.0.0.1:11434/v1/chat/completions", None, 1, True),  # the loopback default of 1
        ("http://localhost:11434/v1/chat/completions", 3, 3, False),  # configured: as declared
        ("https://llm.example.com/v1/chat/completions", None, 3, False),  # a remote default of 4
    ],
)
def test_the_effective_width_of_each_step_comes_from_one_function(project, endpoint, concurrency, width, noted):
    """What `--plan` (or anything showing a plan) shows: akm.engine.concurrency.plan_widths."""
    from akm.engine.concurrency import plan_widths, step_width

    _engine_config(project, endpoint, concurrency)
    wf = write_wf(project, "ask.md", LOOPBACK_MAP, "## ask\n\nAnswer.")
    plan, _ = api.compile_workflow_file(wf, cwd=project)
    ask = step_width(plan, plan.steps[0], host_limit=64)  # a big host: only the engine bounds the map here
    assert (ask.step_id, ask.width, ask.declared, ask.engine) == ("ask", width, 3, "local")
    assert ask.to_json()["width"] == width
    assert [w.step_id for w in plan_widths(plan)] == ["ask"]  # this host's widths, one per executing step
    notes = [n for n in (w.note() for w in plan_widths(plan)) if n]  # what a terminal is told at start
    if noted:
        assert ask.limited_by == "engine" and ask.loopback
        assert notes == [ask.note()] and "one unit at a time" in notes[0]
        assert "loopback" in notes[0] and "engines.local.concurrency: 3 raises it" in notes[0]
    else:
        assert notes == [] and ask.note() is None


def test_a_loopback_engine_running_a_map_one_at_a_time_is_said_on_the_verbose_lines_and_the_board(
    cli, project, fake_openai
):
    _engine_config(project, fake_openai.url)
    write_wf(project, "ask.md", LOOPBACK_MAP, "## ask\n\nAnswer.")
    out = cli("workflow", "run", "ask.md", "--verbose", check=0)
    notes = [line for line in out.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "step ask declares concurrency 3 but runs one unit at a time" in notes[0]
    assert "loopback" in notes[0] and "engines.local.concurrency" in notes[0]
    from akm.report.live import Board
    from akm.views import StepStarted

    board = Board(started=0.0, clock=lambda: 1.0)
    board.progress(StepStarted(run_id="r", step_id="ask", total=3, width=1, note=notes[0][len("note: ") :]))
    lines = board.lines(80, 24)
    assert any(line.strip().startswith("note: step ask declares concurrency 3") for line in lines), lines
    assert all(len(line) <= 79 for line in lines)
    assert "one unit at a time" in " ".join(line.strip() for line in lines)  # wrapped whole, not cut


def test_the_terminal_board_says_it_at_run_start(akm, project, fake_openai):
    pexpect = pytest.importorskip("pexpect")
    _engine_config(project, fake_openai.url)
    write_wf(project, "ask.md", LOOPBACK_MAP.replace("[a, b, c]", "[a, b, c, d]"), "## ask\n\nAnswer.")
    child = pexpect.spawn(
        akm.argv0[0],
        [*akm.argv0[1:], "workflow", "run", "ask.md"],
        cwd=str(akm.cwd),
        env=akm.env,
        encoding="utf-8",
        dimensions=(30, 80),
        timeout=120,
    )
    child.expect(r"note: step ask declares concurrency 3 but runs one unit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
