"""The api is the whole service surface (issue 9 item 3): typed requests validated in the api, typed
progress events, `list_runs(cwd=...)`, and core messages that name no front's flags or commands."""

from __future__ import annotations

import ast
import re
import threading

import pytest

from akm import api
from akm.errors import AkmError, UsageError
from tests.helpers import ROOT, py, run, write_wf


def _fan(project):
    return write_wf(
        project,
        "fan.md",
        f"""
        params:
          items: {{ type: array, items: {{ type: integer }}, default: [1, 2, 3] }}
        steps:
          - id: fan
            map:
              over: params.items
              unit: {{ exec: {{ command: {py("print(1)")} }} }}
          - id: last
            unit: {{ exec: {{ command: {py("print(2)")} }} }}
        """,
        "## fan\n\nx\n\n## last\n\ny",
    )


def test_calls_take_request_models_and_publish_their_schemas(project):
    wf = _fan(project)
    res = api.run_workflow(api.RunRequest(target=str(wf), cwd=str(project), max_steps=1))
    assert [s.status for s in res.run.steps] == ["completed", "pending"]
    assert api.run_status(api.StatusRequest(run_id=res.run.run_id, units=True)).units
    assert api.list_runs(api.ListRunsRequest(cwd=str(project))).runs[0].run_id == res.run.run_id
    assert api.events(api.EventsRequest(run_id=res.run.run_id, limit=2)).has_more
    props = api.RunRequest.model_json_schema()["properties"]
    assert {"target", "params", "maxSteps", "timeout", "new", "cwd"} <= set(props)


@pytest.mark.parametrize(
    "kwargs, argument, words",
    [
        ({"max_steps": "abc"}, "max_steps", "whole number"),
        ({"max_steps": -1}, "max_steps", "whole number"),
        ({"timeout": "5 parsecs"}, "timeout", "duration like"),
        ({"timeout": "99999999999s"}, "timeout", "too long"),
        ({"timeout": 0}, "timeout", "longer than zero"),
    ],
)
def test_run_arguments_are_validated_by_the_api(project, kwargs, argument, words):
    wf = _fan(project)
    with pytest.raises(UsageError) as info:
        run(wf, project, **kwargs)
    err = info.value
    assert err.code == "INVALID_ARGUMENT" and err.details["argument"] == argument
    assert words in err.message and "--" not in err.message, err.message


@pytest.mark.parametrize("paths", [[], "wf.md", ["wf.md", 3]])
def test_lint_arguments_are_checked_without_and_with_a_request_model(project, paths):
    """Plain arguments get LintRequest's rules without pydantic (the CLI's lint path); a request model still works."""
    with pytest.raises(UsageError) as info:
        api.lint(paths)
    assert info.value.code == "INVALID_ARGUMENT" and info.value.details["argument"] == "paths"
    wf = _fan(project)
    assert api.lint([str(wf)]) == api.lint(api.LintRequest(paths=[str(wf)]))
    assert api.lint((str(wf),)).files[0].ok is True


def test_durations_and_formats():
    assert api.parse_duration_ms("500ms") == 500 and api.parse_duration_ms("30s") == 30_000
    assert api.parse_duration_ms("5m") == 300_000 and api.parse_duration_ms("1h") == 3_600_000
    assert api.parse_duration_ms(250) == 250
    assert api.check_output_format("json") == "json"
    with pytest.raises(UsageError) as info:
        api.check_output_format("xml")
    assert info.value.details["argument"] == "format"


def test_list_runs_honours_cwd(project, tmp_path, monkeypatch):
    wf = _fan(project)
    run_id = run(wf, project).run.run_id
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the process is somewhere else entirely
    assert api.list_runs().runs == []
    assert [r.run_id for r in api.list_runs(cwd=str(project)).runs] == [run_id]
    assert [r.run_id for r in api.list_runs(cwd=str(project), ref="fan.md").runs] == [run_id]


def test_progress_events_are_typed_and_come_from_worker_threads(project):
    wf = _fan(project)
    seen: list = []
    threads: set[str] = set()
    lock = threading.Lock()

    def on_progress(event: api.ProgressEvent) -> None:
        with lock:
            seen.append(event)
            threads.add(threading.current_thread().name)

    cancel = api.Cancellation()
    run(wf, project, on_progress=on_progress, cancel=cancel)
    units = [e for e in seen if isinstance(e, api.UnitFinished)]
    steps = [e for e in seen if isinstance(e, api.StepFinished)]
    assert len(units) == 4 and all(u.ok for u in units)
    assert [(s.step_id, s.status) for s in steps] == [("fan", "completed"), ("last", "completed")]
    assert steps[0].to_json()["kind"] == "step" and units[0].to_json()["stepId"] in ("fan", "last")
    assert any(name.startswith("akm-unit") for name in threads), threads


def _messages_of(fn) -> AkmError:
    with pytest.raises(AkmError) as info:
        fn()
    return info.value


def test_core_errors_name_no_cli_flags_or_commands(project):
    wf = _fan(project)
    run_id = run(wf, project, max_steps=1).run.run_id
    api.abandon(run_id)
    (project / "bad.md").write_text("---\nsteps: 3\n---\n")
    errors = [
        _messages_of(lambda: api.run_status("00000000-0000-4000-8000-000000000000")),
        _messages_of(lambda: api.resume(run_id)),
        _messages_of(lambda: run(run_id, project)),
        _messages_of(lambda: api.abandon(run_id)),
        _messages_of(lambda: run(project / "bad.md", project)),
        _messages_of(lambda: api.events(since="yesterday")),
        _messages_of(lambda: api.events(limit=0)),
        _messages_of(lambda: run(wf, project, max_steps="x")),
    ]
    for err in errors:
        for text in (err.message, err.hint or ""):
            assert "akm " not in text and not re.search(r"(^|\s|`)--[a-z]", text), f"{err.code}: {text}"


def test_the_cli_adds_its_own_hints(cli, project):
    _fan(project)
    missing = cli("workflow", "status", "00000000-0000-4000-8000-000000000000", check=1)
    assert "hint: List runs with `akm workflow list`" in missing.stderr
    bad = cli("workflow", "run", "fan.md", "--max-steps", "x", check=2)
    assert "max_steps 'x'" in bad.stderr and "--max-steps" in bad.stderr.split("hint:")[1]
    (project / "bad.md").write_text("---\nsteps: 3\n---\n")
    invalid = cli("workflow", "run", "bad.md", check=2)
    assert "akm workflow lint" in invalid.stderr


# Strings in the core that would tell a user to type something: a backticked `akm ...` command or a `--flag`.
_FRONT_WORDS = re.compile(r"`akm\b|(^|\s|`)--[a-z][a-z-]+")


def test_no_core_string_names_a_cli_command_or_flag():
    files = [
        *sorted((ROOT / "akm" / "api").glob("*.py")),
        *sorted((ROOT / "akm" / "engine").glob("*.py")),
        *sorted((ROOT / "akm" / "store").glob("*.py")),
    ]
    found = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and " " in node.value
                and _FRONT_WORDS.search(node.value)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert not found, "\n".join(found)
