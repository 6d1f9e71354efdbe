"""The report guards: pure decisions over the rows a report's transaction read (spec/session.md).

`units.write_report` reads the run row, the unit's row and the run's totals inside ONE store transaction
and asks these functions what to do; `units.guard_session_write` (a verdict) asks the run half. Keeping the
decisions here, free of SQL and of the connection, is what lets each refusal be tested from a table of rows
(tests/test_report_guards.py) while the atomicity stays where it must be: every read and the write it allows
share the transaction, so no other writer can slip between a guard and the write.

Each function returns what to write, or raises the coded error the protocol documents; a refusal writes
nothing because the caller has not written yet. The only outside state consulted is `holder_is_live`'s pid
probe for a holder on this host that recorded a pid (a reporter's claim records none).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from akm.codes import Code
from akm.errors import NotFoundError, UsageError
from akm.store.runs import holder_is_live
from akm.store.status import DRIVABLE_STATUSES, REPORT_LOCK_PREFIX
from akm.text import dollars


class Row(Protocol):
    """A row as read inside the transaction: column values by name (an `sqlite3.Row`, or a dict in tests)."""

    def __getitem__(self, key: str, /) -> Any: ...


def is_report_lock(holder: str | None) -> bool:
    """A report finalizing a step holds the run lease briefly; it does not block other reports."""
    return bool(holder) and str(holder).startswith(REPORT_LOCK_PREFIX)


def check_run_takes_reports(run_id: str, run: Row | None, now: str, *, lease_details: bool = True) -> None:
    """The run half: the run exists (RUN_NOT_FOUND), is drivable (RUN_NOT_ACTIVE), and no engine holds a
    live lease (LEASE_HELD; a report's own finalize lock does not count).

    `run` holds the columns status, lease_holder, lease_host, lease_pid, lease_until. `lease_details`:
    a unit report names the lease holder and its expiry; a verdict's refusal (guard_session_write)
    has always said less, and keeps its words.
    """
    if run is None:
        raise NotFoundError(f"No workflow run with id {run_id}.", code=Code.RUN_NOT_FOUND)
    if run["status"] not in DRIVABLE_STATUSES:
        raise UsageError(f"Run {run_id} is {run['status']}; it no longer takes reports.", code=Code.RUN_NOT_ACTIVE)
    if holder_is_live(
        run["lease_holder"], run["lease_host"], run["lease_pid"], run["lease_until"], now
    ) and not is_report_lock(run["lease_holder"]):
        if not lease_details:
            raise UsageError(
                f"Run {run_id} is being driven by akm right now; reports are refused while the engine owns the run.",
                code=Code.LEASE_HELD,
            )
        raise UsageError(
            f"Run {run_id} is being driven by akm right now (lease holder {run['lease_holder']} until "
            f"{run['lease_until']}); reports are refused while the engine owns the run.",
            code=Code.LEASE_HELD,
            details={"holder": run["lease_holder"], "until": run["lease_until"]},
        )


class Report(NamedTuple):
    """What a report asks to record for one attempt row (already redacted and normalised)."""

    unit_id: str
    status: str  # completed | failed | running
    result_json: str | None
    failure_reason: str | None
    holder: str
    rerun: bool
    input_hash: str | None = None  # the plan's input hash of the unit (None: not checked)


class ReportPlan(NamedTuple):
    """What the guards allow.

    kind:
      idempotent -- the row already holds exactly this: write nothing, answer `idempotent`
      renew      -- the reporter's own live claim, reported running again: extend it
      write      -- (re)insert the row unless `finishing_claim`, then claim it or finish it
    `finishing_claim`: the row is the reporter's own live claim (no new attempt is counted).
    `prior_tokens`: what a re-run's earlier finished attempt spent (carried into the new one).
    """

    kind: str
    finishing_claim: bool = False
    prior_tokens: int = 0


def check_report(run_id: str, run: Row | None, row: Row | None, report: Report, now: str) -> ReportPlan:
    """The run guard, then the unit row's: what this report may write, or the coded refusal.

    `row` holds the unit row's status, result_json, failure_reason, tokens, input_hash, claim_holder,
    claim_host, claim_pid, claim_expires_at (None: no attempt row yet). Refusals: a row journaled with
    another input hash than the plan's, whatever its status and even for a re-run (REPLAY_DIVERGED, as
    upstream: the row answers other work), a finished row reported again
    with other content and no `rerun` (REPORT_CONFLICT), a running report on a finished row without
    `rerun` (UNIT_TERMINAL), a live claim of another holder (CLAIM_HELD), the reporter's own claim
    expired (CLAIM_EXPIRED, unless it claims again).
    """
    check_run_takes_reports(run_id, run, now)
    unit_id, status = report.unit_id, report.status
    if row is None:
        return ReportPlan("write")
    if report.input_hash is not None and row["input_hash"] is not None and row["input_hash"] != report.input_hash:
        raise replay_diverged(run_id, unit_id, row["status"], report.input_hash, row["step_id"])
    if row["status"] in ("completed", "failed"):
        same = (
            row["status"] == status
            and row["result_json"] == report.result_json
            and (row["failure_reason"] or None) == (report.failure_reason or None)
        )
        if same and not report.rerun:
            return ReportPlan("idempotent")
        if not report.rerun:
            if status == "running":
                raise UsageError(
                    f"Unit {unit_id} is already {row['status']}; it cannot be claimed again unless it is re-run.",
                    code=Code.UNIT_TERMINAL,
                )
            raise UsageError(
                f"Unit {unit_id} is already recorded as {row['status']} with a different result; the "
                "journal keeps the first report unless this one is explicitly a re-run.",
                code=Code.REPORT_CONFLICT,
            )
        return ReportPlan("write", prior_tokens=int(row["tokens"] or 0))
    live = holder_is_live(row["claim_holder"], row["claim_host"], row["claim_pid"], row["claim_expires_at"], now)
    if live and row["claim_holder"] != report.holder:
        raise UsageError(
            f"Unit {unit_id} is claimed by {row['claim_holder']} until {row['claim_expires_at']}; only "
            "that holder can report it.",
            code=Code.CLAIM_HELD,
            details={"holder": row["claim_holder"], "until": row["claim_expires_at"]},
        )
    if row["claim_holder"] == report.holder and not live and status != "running":
        raise UsageError(
            f"Your claim on unit {unit_id} expired at {row['claim_expires_at']}; claim it again (status "
            "running) before reporting its result.",
            code=Code.CLAIM_EXPIRED,
        )
    finishing_claim = row["claim_holder"] == report.holder and live
    if status == "running" and finishing_claim:
        return ReportPlan("renew", finishing_claim=True)
    return ReportPlan("write", finishing_claim=finishing_claim)


def replay_diverged(run_id: str, unit_id: str, status: str, input_hash: str, step_id: str | None) -> UsageError:
    """REPLAY_DIVERGED: the unit's journal row was written for other input than the plan gives it now. The
    remedy that works is a rewind of its step, redoing its units (spec/engine.md "Rewind and reuse")."""
    remedy = (
        f"Rewind the run to step {step_id} (redoing its units) to go on."
        if step_id is not None
        else "Rewind the run to the unit's step (redoing its units) to go on."
    )
    return UsageError(
        f"Replay divergence: unit {unit_id} of run {run_id} is journaled as {status} with a different input hash "
        f"than the plan gives it now; nothing was recorded. {remedy}",
        code=Code.REPLAY_DIVERGED,
        details={"runId": run_id, "stepId": step_id, "unitId": unit_id, "inputHash": input_hash},
    )


def max_units_reason(used: int, max_units: int) -> str:
    """Why a unit ceiling stops a run: one sentence for the drive loop and a report (it becomes the step's
    notes either way, so both surfaces end with the same words)."""
    return f"budget exceeded (max_units ceiling): {used} of {max_units} units already dispatched"


def max_tokens_reason(spent: int, max_tokens: int) -> str:
    """Why a token ceiling stops a run (see `max_units_reason`)."""
    return f"budget exceeded (max_tokens ceiling): {spent} of {max_tokens} tokens used"


def max_cost_reason(spent: float, max_cost: float) -> str:
    """Why a money ceiling stops a run (see `max_units_reason`)."""
    return f"budget exceeded (max_cost ceiling): {dollars(spent)} of {dollars(max_cost)} spent"


def unknown_usage_reason(ceiling: str, units: int) -> str:
    """Why a ceiling refuses further dispatch once units reported no usage (`budget.unknown: refuse`)."""
    what = "1 unit's usage is" if units == 1 else f"{units} units' usage is"
    return (
        f"budget exceeded ({ceiling} ceiling): {what} unknown (its engine reported no usage, or has no prices), so "
        "the ceiling cannot count it; set budget.unknown: allow in the workflow to count only what is known"
    )


def daily_cost_reason(spent: float, limit: float) -> str:
    """Why config `limits.maxCostPerDay` stops a run."""
    return (
        f"budget exceeded (limits.maxCostPerDay): this project's runs spent {dollars(spent)} of "
        f"{dollars(limit)} today (UTC)"
    )


def check_budget(
    plan: ReportPlan,
    row: Row | None,
    *,
    other_attempts: int,
    other_tokens: int,
    max_units: int | None,
    max_tokens: int | None,
    other_cost: float = 0.0,
    unknown_tokens: int = 0,
    unknown_cost: int = 0,
    max_cost: float | None = None,
    allow_unknown: bool = False,
) -> int:
    """The run's budget ceilings for a `write` plan (BUDGET_EXCEEDED); returns the tokens spent so far.

    `other_attempts` / `other_tokens` / `other_cost`: the sums over the run's other dispatch rows;
    `unknown_tokens` / `unknown_cost`: its engine attempts that reported no usage. A new attempt (anything
    but finishing the reporter's own claim) must fit under `max_units`; any report is refused once the
    tokens already spent reach `max_tokens`, the dollars `max_cost`, or once a ceiling has usage it cannot
    count (unless `allow_unknown`). A session unit's own cost is not akm's to know: the calling agent did it.
    """
    own_attempts = int(row["attempts"]) if row is not None else 0
    if not plan.finishing_claim and max_units is not None and other_attempts + own_attempts + 1 > max_units:
        raise UsageError(max_units_reason(other_attempts + own_attempts, max_units) + ".", code=Code.BUDGET_EXCEEDED)
    spent = other_tokens + _row_tokens(row)
    if max_tokens is not None and spent >= max_tokens:
        raise UsageError(max_tokens_reason(spent, max_tokens) + ".", code=Code.BUDGET_EXCEEDED)
    if max_cost is not None and other_cost >= max_cost:
        raise UsageError(max_cost_reason(other_cost, max_cost) + ".", code=Code.BUDGET_EXCEEDED)
    if not allow_unknown:
        if max_cost is not None and unknown_cost:
            raise UsageError(unknown_usage_reason("max_cost", unknown_cost) + ".", code=Code.BUDGET_EXCEEDED)
        if max_tokens is not None and unknown_tokens:
            raise UsageError(unknown_usage_reason("max_tokens", unknown_tokens) + ".", code=Code.BUDGET_EXCEEDED)
    return spent


def carried_tokens(plan: ReportPlan, tokens: int | None) -> int | None:
    """The tokens the finished row records: a re-run carries its earlier attempt's spend."""
    return (plan.prior_tokens + (tokens or 0)) if plan.prior_tokens else tokens


def tokens_crossed(other_tokens: int, carried: int | None, max_tokens: int | None) -> str | None:
    """The max_tokens message when this report's write reached the ceiling (the step then fails), else None.

    `other_tokens`: the run's tokens on every other dispatch row; the reported row counts with what it
    carries now (its earlier tokens are replaced, not added)."""
    if max_tokens is None:
        return None
    total = other_tokens + (carried or 0)
    if total < max_tokens:
        return None
    return max_tokens_reason(total, max_tokens)


def _row_tokens(row: Row | None) -> int:
    return int(row["tokens"] or 0) if row is not None else 0
