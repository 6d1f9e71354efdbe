"""A dispatch pass's semantics through the runner seam, with no process (tests/fake_runner.py).

The driver and its pass run as they always do — fail fast, retries and their Retry-After wait, the budget,
the width, cancellation — while each attempt is answered by a function instead of a dispatcher; its row is
journaled as the real runners journal it, and the step is decided from the journal.
"""

from __future__ import annotations

import json
import threading

from akm.engine.cancel import Cancellation
from akm.engine.drive import DriveOptions, drive_run
from tests.fake_runner import FakeAttempt, FakeRunner, fail, ok
from tests.helpers import db_rows, open_test_journal, run, write_wf

FAN = """
params:
  xs: {{ type: array }}
{budget}steps:
  - id: fan
    map:
      over: params.xs
      concurrency: {width}
      unit:
{extra}        exec: {{ command: ["false"] }}
"""


def _fan(project, *, width: int = 1, budget: str = "", extra: str = ""):
    # The command is never run: the fake runner answers every attempt.
    return write_wf(project, "fan.md", FAN.format(width=width, budget=budget, extra=extra), "## fan\n\nx")


def _created(project, wf, **params) -> str:
    """A run created as `workflow run` creates one, with nothing driven yet."""
    return run(wf, project, params=params or None, max_steps=0).run.run_id


def _drive(project, run_id: str, fake: FakeRunner, cancel: Cancellation | None = None):
    db = open_test_journal()
    try:
        opts = DriveOptions(work_dir=project, project_root=project, runner=fake)
        if cancel is not None:
            opts.cancel = cancel
        return drive_run(db, run_id, opts)
    finally:
        db.close()


def _item(call: FakeAttempt) -> str:
    assert json.loads(call.spec.exec_context["AKM_ITEM"]) == call.item  # what the unit's process would get
    return call.item


def _tried(fake: FakeRunner) -> list[tuple[str, int]]:
    """Each attempt the runner was asked for: its unit's item, its retry index."""
    return [(c.item, c.retry) for c in fake.calls]


def _rows(fake: FakeRunner) -> list[tuple[str, int, str, str | None]]:
    """The journal's row of each attempt, in the order they started: item, retry, status, failure reason."""
    rows = {u: (s, r) for u, s, r in db_rows("SELECT unit_id, status, failure_reason FROM units")}
    assert len(rows) == len(fake.calls)
    return [(c.item, c.retry, *rows[c.attempt]) for c in fake.calls]


def _step(run_id: str) -> tuple[str, str | None]:
    return db_rows("SELECT status, notes FROM steps WHERE run_id = ? AND step_id = 'fan'", run_id)[0]


def test_the_fake_runner_completes_a_fan_out_from_its_answers(project):
    run_id = _created(project, _fan(project, width=2), xs=["a", "b", "c"])
    fake = FakeRunner(lambda call: ok(_item(call).upper()))
    res = _drive(project, run_id, fake)
    assert res.done and sorted(_tried(fake)) == [("a", 0), ("b", 0), ("c", 0)]
    assert _step(run_id)[0] == "completed"
    evidence = db_rows("SELECT evidence_json FROM steps WHERE run_id = ? AND step_id = 'fan'", run_id)[0][0]
    assert json.loads(evidence)["output"] == ["A", "B", "C"]
    assert db_rows("SELECT count(*) FROM units WHERE status = 'completed'") == [(3,)]


def test_fail_fast_starts_no_unit_after_one_failed_for_good(project):
    run_id = _created(project, _fan(project), xs=["a", "b", "c", "d", "e"])
    fake = FakeRunner(lambda call: fail() if _item(call) == "b" else ok(_item(call)))
    res = _drive(project, run_id, fake)
    assert not res.done
    assert _tried(fake) == [("a", 0), ("b", 0)] and fake.halts == 1  # width 1: c, d and e never started
    assert _step(run_id)[0] == "failed"
    assert _rows(fake) == [("a", 0, "completed", None), ("b", 0, "failed", "non_zero_exit")]


def test_retries_only_the_reasons_retry_on_names(project):
    wf = _fan(project, extra="        retry: { max: 2, on: [timeout] }\n")
    run_id = _created(project, wf, xs=["flaky", "broken"])
    seen: dict[str, int] = {}

    def answer(call: FakeAttempt):
        item = _item(call)
        seen[item] = seen.get(item, 0) + 1
        if item == "flaky":
            return ok("made it") if seen[item] == 3 else fail("timeout")
        return fail("non_zero_exit")  # not in retry.on: not retried

    fake = FakeRunner(answer)
    _drive(project, run_id, fake)
    assert _rows(fake) == [
        ("flaky", 0, "failed", "timeout"),
        ("flaky", 1, "failed", "timeout"),
        ("flaky", 2, "completed", None),
        ("broken", 0, "failed", "non_zero_exit"),
    ]


def test_a_retry_after_wait_journals_the_failed_attempt_before_it_waits(project):
    wf = _fan(project, extra="        retry: { max: 1, on: [llm_rate_limit] }\n")
    run_id = _created(project, wf, xs=["a"])
    rows_at_retry: list = []

    def answer(call: FakeAttempt):
        if call.retry == 0:
            return fail("llm_rate_limit", retry_after_s=0.05)
        rows_at_retry.extend(db_rows("SELECT status FROM units ORDER BY unit_id"))
        return ok("later")

    _drive(project, run_id, FakeRunner(answer))
    assert rows_at_retry == [("failed",), ("running",)]  # the first attempt's row did not read `running`
    assert _step(run_id)[0] == "completed"


def test_a_budget_ceiling_stops_the_pass_and_fails_the_step(project):
    run_id = _created(project, _fan(project, budget="budget: { max_units: 2 }\n"), xs=["a", "b", "c", "d"])
    fake = FakeRunner(lambda call: ok(_item(call)))
    _drive(project, run_id, fake)
    assert len(fake.calls) == 2
    status, notes = _step(run_id)
    assert status == "failed" and "budget exceeded (max_units ceiling)" in (notes or "")


def test_the_width_bounds_the_attempts_in_flight(project):
    run_id = _created(project, _fan(project, width=2), xs=[str(i) for i in range(8)])
    both = threading.Barrier(2, timeout=60)  # the first two attempts meet: two ran at once
    first = iter(range(2))

    def answer(call: FakeAttempt):
        if next(first, None) is not None:
            both.wait()
        return ok(_item(call))

    fake = FakeRunner(answer)
    assert _drive(project, run_id, fake).done
    assert fake.max_in_flight == 2 and len(fake.calls) == 8


def test_a_cancelled_drive_starts_nothing_more_and_leaves_the_run_active(project):
    run_id = _created(project, _fan(project), xs=["a", "b", "c", "d"])
    cancel = Cancellation()

    def answer(call: FakeAttempt):
        if _item(call) == "b":
            cancel.trip("test")
        return ok(_item(call))

    fake = FakeRunner(answer)
    res = _drive(project, run_id, fake, cancel)
    assert res.aborted and _tried(fake) == [("a", 0), ("b", 0)]
    assert db_rows("SELECT status FROM runs WHERE id = ?", run_id) == [("active",)]
    assert db_rows("SELECT count(*) FROM units WHERE status = 'running'") == [(0,)]
