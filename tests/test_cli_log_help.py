"""`akm log` paging, `--verbose`, and help for every argument (issue 6 item 14; issue 6 item 9's `--limit`)."""

from __future__ import annotations

import json

import pytest

from akm import api
from akm.api import _inspect
from akm.errors import UsageError
from tests.helpers import run, write_wf


def _completed_run(project, units: int = 3) -> str:
    wf = write_wf(
        project,
        "w.md",
        f"""
        params:
          items: {{ type: array, items: {{ type: integer }}, default: {list(range(units))} }}
        steps:
          - id: fan
            map:
              over: params.items
              unit: {{ exec: {{ command: ["true"] }} }}
        """,
        "## fan\n\nx",
    )
    return run(wf, project).run.run_id


def test_since_a_future_time_does_not_rewind_the_cursor(project):
    run_id = _completed_run(project)
    everything = api.events(run_id=run_id)
    page = api.events(run_id=run_id, since="2999-01-01T00:00:00Z")
    assert page.events == [] and page.next_offset == everything.next_offset > 0
    # a poller continuing from there sees only what happens later
    assert api.events(run_id=run_id, since=f"@offset:{page.next_offset}").events == []


def test_since_a_past_time_returns_events_and_a_cursor_past_them(project):
    run_id = _completed_run(project)
    page = api.events(run_id=run_id, since="2000-01-01T00:00:00Z")
    assert page.events and page.next_offset == page.events[-1].id and not page.has_more


def test_log_has_a_default_limit_and_says_when_more_are_waiting(project, monkeypatch):
    monkeypatch.setattr(_inspect, "DEFAULT_EVENT_LIMIT", 5)  # where events() reads it
    run_id = _completed_run(project, units=6)
    first = api.events(run_id=run_id)
    assert len(first.events) == 5 and first.has_more and first.next_offset == first.events[-1].id
    seen = [e.id for e in first.events]
    page = first
    while page.has_more:
        page = api.events(run_id=run_id, since=f"@offset:{page.next_offset}")
        seen += [e.id for e in page.events]
    assert seen == sorted(set(seen)) and len(seen) == len(api.events(run_id=run_id, limit=1000).events)


@pytest.mark.parametrize("limit", [0, -1, 10_001, 99999999999999999999])
def test_out_of_range_limits_are_coded_errors(project, limit):
    with pytest.raises(UsageError) as info:
        api.events(limit=limit)
    assert info.value.code == "INVALID_ARGUMENT"


def test_cli_limit_overflow_is_a_usage_error(cli):
    proc = cli("log", "--limit", "99999999999999999999", check=2)
    assert "INVALID_ARGUMENT" in proc.stderr and "INTERNAL" not in proc.stderr


def test_cli_default_page_and_more_line(project, capsys):
    from akm.cli import main

    _completed_run(project, units=60)  # 120 unit events and more
    assert main(["log", "--format", "json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert len(page["events"]) == 100 and page["hasMore"] is True
    assert main(["log"]) == 0
    assert "more events are waiting" in capsys.readouterr().out


def test_verbose_prints_progress_when_stderr_is_not_a_terminal(cli, project):
    (project / "v.md").write_text('---\nsteps:\n  - id: a\n    unit: { exec: { command: ["true"] } }\n---\n## a\nx\n')
    quiet = cli("workflow", "run", "v.md", "--new", check=0)
    assert "[a " not in quiet.stderr  # a pipe gets no progress by default
    loud = cli("workflow", "run", "v.md", "--new", "--verbose", check=0)
    assert "[a 1/1] a:solo ok" in loud.stderr and "[a] step completed" in loud.stderr, loud.stderr
    both = cli("workflow", "run", "v.md", "--quiet", "--verbose", check=2)
    assert "contradict" in both.stderr


def _walk(parser, prefix=()):
    import argparse

    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, prefix + (name,))


def test_every_subcommand_describes_every_argument():
    import argparse

    from akm.cli import _build_parser

    for path, parser in _walk(_build_parser()):
        if path == ("workflow", "run"):
            continue  # has its own help text, checked below
        for action in parser._actions:
            if action.dest == "help" or isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"akm {' '.join(path)}: {action.option_strings or action.dest} has no help"
        if path:
            assert parser.description, f"akm {' '.join(path)} has no description"


def test_run_help_describes_every_run_flag(cli):
    from akm.format.params import RUN_CONTROL_BOOL_FLAGS, RUN_CONTROL_VALUE_FLAGS

    text = cli("workflow", "run", "--help", check=0).stdout
    for flag in (*RUN_CONTROL_VALUE_FLAGS, *RUN_CONTROL_BOOL_FLAGS):
        assert f"--{flag} " in text or f"--{flag}," in text, flag
