"""Abandon is immediate and final (issue 6 item 5)."""

from __future__ import annotations

import json
import os
import time

import pytest

from akm import api
from akm.errors import UsageError
from tests.helpers import PY, ROOT, journal_sql, run, write_wf

# A unit that abandons its own run the way another command would. Item 2 (when there is one) sleeps;
# item 1 first waits until item 2's unit row is journaled, so the abandon lands while 2 is in flight.
UNIT = """\
import json, os, sqlite3, sys, time
sys.path.insert(0, {root!r})
os.environ["AKM_DATA_DIR"] = {data!r}
if {url!r}:
    os.environ["AKM_JOURNAL_URL"] = {url!r}
from akm import api, paths
from tests.helpers import journal_sql

item = json.loads(os.environ["AKM_ITEM"])
if item == 2:
    time.sleep(120)
elif item == 1:
    if {wait_for_two!r}:
        deadline = time.time() + 60
        while time.time() < deadline:
            con = journal_sql()
            started = con.execute("SELECT count(*) FROM units").fetchone()[0]
            con.close()
            if started >= 2:
                break
            time.sleep(0.05)
    api.abandon(os.environ["AKM_RUN_ID"])
print(item)
"""


def _unit_script(project, tmp_path, *, wait_for_two: bool):
    script = project / "unit.py"
    script.write_text(
        UNIT.format(
            root=str(ROOT),
            data=str(tmp_path / "akm-data"),
            url=os.environ.get("AKM_JOURNAL_URL", ""),
            wait_for_two=wait_for_two,
        )
    )
    return json.dumps([PY, str(script)])


def _journal(sql: str, *args):
    con = journal_sql()
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def _fan(project, tmp_path, items, width, *, wait_for_two):
    return write_wf(
        project,
        "fan.md",
        f"""
        params:
          items: {{ type: array, items: {{ type: integer }}, default: {json.dumps(items)} }}
        steps:
          - id: fan
            map:
              over: params.items
              concurrency: {width}
              unit:
                exec:
                  command: {_unit_script(project, tmp_path, wait_for_two=wait_for_two)}
          - id: after
            unit: {{ exec: {{ command: {json.dumps([PY, "-c", "print(2)"])} }} }}
        """,
        "## fan\n\nx\n\n## after\n\ny",
    )


def test_no_unit_starts_after_abandon_and_the_driver_says_so(project, tmp_path):
    wf = _fan(project, tmp_path, [1, 3, 4, 5], 1, wait_for_two=False)
    with pytest.raises(UsageError) as info:
        run(wf, project)
    assert info.value.code == "RUN_ABANDONED" and "abandoned" in info.value.message
    # the first unit abandoned the run; not one unit started after that
    assert len(_journal("SELECT unit_id FROM units")) == 1
    run_id = _journal("SELECT id FROM runs")[0][0]
    view = api.run_status(run_id, units=True)
    assert view.status == "abandoned" and view.engine_lease is None
    assert [(s.id, s.status) for s in view.steps] == [("fan", "failed"), ("after", "skipped")]
    types = [e.event_type for e in api.events(run_id=run_id).events]
    assert types.count("workflow_unit_started") == 1 and types.count("workflow_abandoned") == 1


def test_abandon_stops_units_in_flight(project, tmp_path):
    wf = _fan(project, tmp_path, [1, 2], 2, wait_for_two=True)
    began = time.monotonic()
    with pytest.raises(UsageError) as info:
        run(wf, project)
    assert info.value.code == "RUN_ABANDONED"
    assert time.monotonic() - began < 90, "the sleeping unit ran on after the abandon"
    rows = _journal("SELECT unit_id, status, failure_reason FROM units ORDER BY unit_id")
    assert len(rows) == 2 and "running" not in [r[1] for r in rows]
    # Both finished after the abandon committed (the first unit abandoned the run itself, then printed): no
    # result of theirs is journaled; they end as abandon ends a dead driver's rows (issue 23 item 1).
    assert sorted((r[1], r[2]) for r in rows) == [("failed", "abandoned"), ("failed", "abandoned")]
    assert _journal("SELECT status FROM runs") == [("abandoned",)]


def test_an_abandoned_run_cannot_be_resumed_or_driven(project, tmp_path):
    wf = write_wf(
        project,
        "two.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {json.dumps([PY, "-c", "print(1)"])} }} }}
          - id: b
            unit: {{ exec: {{ command: {json.dumps([PY, "-c", "print(2)"])} }} }}
        """,
        "## a\n\nx\n\n## b\n\ny",
    )
    run_id = run(wf, project, max_steps=1).run.run_id
    view = api.abandon(run_id)
    assert view.status == "abandoned"
    assert [(s.id, s.status) for s in view.steps] == [("a", "completed"), ("b", "failed")]
    for attempt, code in (
        (lambda: api.resume(run_id), "RUN_ABANDONED"),
        (lambda: run(run_id, project), "RUN_ABANDONED"),
        (lambda: api.abandon(run_id), "RUN_ALREADY_FINISHED"),
    ):
        with pytest.raises(UsageError) as info:
            attempt()
        assert info.value.code == code
    brief = api.next_brief(run_id)
    assert brief.kind == "inactive" and brief.message.endswith("it takes no reports; abandoning is final.")
    with pytest.raises(UsageError) as info:
        api.resume(run_id)
    assert info.value.code == "RUN_ABANDONED"
    # the same file starts a fresh run: an abandoned run is never continued
    again = run(wf, project)
    assert again.started and again.run.run_id != run_id and again.run.status == "completed"
