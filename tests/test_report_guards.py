"""The report guards as pure functions (akm/store/report_guards.py): a table of rows in, a plan or a code out.

`write_report` reads these rows inside its transaction and asks the same functions; here they are asked
directly, with no database, so every refusal of the protocol is pinned by its inputs alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from akm.errors import AkmError
from akm.store.clock import now_iso
from akm.store.report_guards import (
    REPORT_LOCK_PREFIX,
    Report,
    ReportPlan,
    carried_tokens,
    check_budget,
    check_report,
    check_run_takes_reports,
    is_report_lock,
    tokens_crossed,
)

NOW = now_iso()
LATER = now_iso(3600)
EARLIER = now_iso(-3600)
RUN = "run-1"


def run_row(status: str = "awaiting_session", holder: str | None = None, until: str | None = None) -> dict[str, Any]:
    return {"status": status, "lease_holder": holder, "lease_host": None, "lease_pid": None, "lease_until": until}


def unit_row(
    status: str = "completed",
    result: str | None = '"done"',
    reason: str | None = None,
    claim: str | None = None,
    claim_until: str | None = None,
    tokens: int | None = 3,
    attempts: int = 1,
) -> dict[str, Any]:
    return {
        "status": status,
        "result_json": result,
        "failure_reason": reason,
        "tokens": tokens,
        "attempts": attempts,
        "input_hash": "h",
        "claim_holder": claim,
        "claim_host": None,
        "claim_pid": None,
        "claim_expires_at": claim_until,
        "step_id": "work",
    }


def report(
    status: str = "completed",
    result: str | None = '"done"',
    reason: str | None = None,
    holder: str = "me",
    rerun=False,
    input_hash: str | None = None,
) -> Report:
    return Report("u:solo", status, result, reason, holder, rerun, input_hash)


# (case, run row, unit row, report, expected plan or error code)
CASES: list[tuple[str, Any, Any, Report, Any]] = [
    ("no such run", None, None, report(), "RUN_NOT_FOUND"),
    ("run not drivable (completed)", run_row("completed"), None, report(), "RUN_NOT_ACTIVE"),
    ("run not drivable (abandoned)", run_row("abandoned"), None, report(), "RUN_NOT_ACTIVE"),
    ("engine holds the lease", run_row("active", "driver-1", LATER), None, report(), "LEASE_HELD"),
    ("a lapsed engine lease", run_row("active", "driver-1", EARLIER), None, report(), ReportPlan("write")),
    ("a report's finalize lock", run_row("active", REPORT_LOCK_PREFIX + "x", LATER), None, report(), "write"),
    ("first report of the attempt", run_row(), None, report(), ReportPlan("write")),
    ("first claim of the attempt", run_row(), None, report("running", None), ReportPlan("write")),
    ("duplicate identical report", run_row(), unit_row(), report(), ReportPlan("idempotent")),
    ("the plan's input hash", run_row(), unit_row(), report(input_hash="h"), ReportPlan("idempotent")),
    ("a completed row of other input", run_row(), unit_row(), report(input_hash="x"), "REPLAY_DIVERGED"),
    (
        "a running row of other input, finished",
        run_row(),
        unit_row("running", None, claim="me", claim_until=LATER),
        report(input_hash="x"),
        "REPLAY_DIVERGED",
    ),
    (
        "a running row of other input, heartbeated",
        run_row(),
        unit_row("running", None, claim="me", claim_until=LATER),
        report("running", None, input_hash="x"),
        "REPLAY_DIVERGED",
    ),
    (
        "a failed row of other input, re-run",
        run_row(),
        unit_row("failed", None, "timeout"),
        report(rerun=True, input_hash="x"),
        "REPLAY_DIVERGED",
    ),
    (
        "duplicate identical failure",
        run_row(),
        unit_row("failed", '"x"', "timeout"),
        report("failed", '"x"', "timeout"),
        ReportPlan("idempotent"),
    ),
    ("conflicting re-report", run_row(), unit_row(), report(result='"other"'), "REPORT_CONFLICT"),
    ("other failure reason", run_row(), unit_row("failed", None, "a"), report("failed", None, "b"), "REPORT_CONFLICT"),
    ("unit already finished, claimed again", run_row(), unit_row(), report("running", None), "UNIT_TERMINAL"),
    ("re-run of a finished unit", run_row(), unit_row(tokens=5), report(rerun=True), ReportPlan("write", False, 5)),
    ("identical re-run is new work", run_row(), unit_row(tokens=None), report(rerun=True), ReportPlan("write")),
    (
        "wrong claim holder",
        run_row(),
        unit_row("running", None, claim="other", claim_until=LATER),
        report(),
        "CLAIM_HELD",
    ),
    (
        "own claim expired (a stale attempt)",
        run_row(),
        unit_row("running", None, claim="me", claim_until=EARLIER),
        report(),
        "CLAIM_EXPIRED",
    ),
    (
        "own expired claim, claimed again",
        run_row(),
        unit_row("running", None, claim="me", claim_until=EARLIER),
        report("running", None),
        ReportPlan("write"),
    ),
    (
        "another holder's lapsed claim is taken over",
        run_row(),
        unit_row("running", None, claim="other", claim_until=EARLIER),
        report(),
        ReportPlan("write"),
    ),
    (
        "own live claim renewed",
        run_row(),
        unit_row("running", None, claim="me", claim_until=LATER),
        report("running", None),
        ReportPlan("renew", True),
    ),
    (
        "own live claim finished",
        run_row(),
        unit_row("running", None, claim="me", claim_until=LATER),
        report(),
        ReportPlan("write", True),
    ),
    ("an unclaimed running row (crashed driver)", run_row(), unit_row("running", None), report(), ReportPlan("write")),
]


@pytest.mark.parametrize("case, run, row, rep, expected", CASES, ids=[c[0] for c in CASES])
def test_check_report_table(case, run, row, rep, expected):
    if isinstance(expected, str) and expected.isupper():
        with pytest.raises(AkmError) as caught:
            check_report(RUN, run, row, rep, NOW)
        assert caught.value.code == expected, case
        return
    plan = check_report(RUN, run, row, rep, NOW)
    if isinstance(expected, str):
        assert plan.kind == expected, case
    else:
        assert plan == expected, case


def test_the_run_guard_runs_before_the_row_guards():
    """A finished run refuses even a resend of exactly what the row holds (the engine answers resends earlier)."""
    with pytest.raises(AkmError) as caught:
        check_report(RUN, run_row("failed"), unit_row(), report(), NOW)
    assert caught.value.code == "RUN_NOT_ACTIVE"


def test_lease_held_words_differ_for_a_verdict():
    """A unit report names the engine's lease; a verdict's refusal (guard_session_write) says less, as before."""
    held = run_row("active", "driver-1", LATER)
    with pytest.raises(AkmError) as unit:
        check_run_takes_reports(RUN, held, NOW)
    with pytest.raises(AkmError) as verdict:
        check_run_takes_reports(RUN, held, NOW, lease_details=False)
    assert unit.value.code == verdict.value.code == "LEASE_HELD"
    assert "driver-1" in unit.value.message and unit.value.details == {"holder": "driver-1", "until": LATER}
    assert "driver-1" not in verdict.value.message and not verdict.value.details


def test_report_lock_prefix():
    assert is_report_lock(REPORT_LOCK_PREFIX + "abc")
    assert not is_report_lock("driver") and not is_report_lock(None) and not is_report_lock("")


@pytest.mark.parametrize(
    "plan, row, others, limits, expected",
    [
        (ReportPlan("write"), None, (2, 0), (3, None), 0),
        (ReportPlan("write"), None, (3, 0), (3, None), "BUDGET_EXCEEDED"),
        (ReportPlan("write"), unit_row(attempts=1), (2, 0), (3, None), "BUDGET_EXCEEDED"),  # a re-run is an attempt
        (ReportPlan("write", True), unit_row("running", None, attempts=1), (2, 0), (3, None), 3),  # own claim
        (ReportPlan("write"), unit_row(tokens=4), (0, 5), (None, 10), 9),
        (ReportPlan("write"), unit_row(tokens=5), (0, 5), (None, 10), "BUDGET_EXCEEDED"),
    ],
)
def test_check_budget(plan, row, others, limits, expected):
    kwargs = dict(other_attempts=others[0], other_tokens=others[1], max_units=limits[0], max_tokens=limits[1])
    if expected == "BUDGET_EXCEEDED":
        with pytest.raises(AkmError) as caught:
            check_budget(plan, row, **kwargs)
        assert caught.value.code == expected
    else:
        assert check_budget(plan, row, **kwargs) == expected


def test_tokens_carried_and_crossed():
    assert carried_tokens(ReportPlan("write"), 7) == 7
    assert carried_tokens(ReportPlan("write"), None) is None
    assert carried_tokens(ReportPlan("write", prior_tokens=5), 7) == 12  # a re-run carries its earlier spend
    assert carried_tokens(ReportPlan("write", prior_tokens=5), None) == 5
    assert tokens_crossed(4, 3, None) is None
    assert tokens_crossed(4, 3, 10) is None
    assert tokens_crossed(4, 6, 10) == "budget exceeded (max_tokens ceiling): 10 of 10 tokens used"
    # the row's own earlier tokens are replaced by what it carries now, not counted twice: 4 others + 5 now
    assert tokens_crossed(4, 5, 10) is None
