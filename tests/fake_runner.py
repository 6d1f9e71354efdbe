"""A runner that starts no process: each attempt of a pass is answered by a function.

As httpx's `MockTransport(handler)` answers requests without a network, `FakeRunner(handler)` answers a
dispatch pass's attempts without a dispatcher: give it as `DriveOptions.runner` and the driver's pass
(scheduling, width, fail fast, cancellation, retries, budget, progress) runs as it always does, while each
attempt is `handler(call)`. The attempt's row is journaled around it as a runner must (committed `running`
before, finished after, fenced by the driver's lease), so the step is decided from the journal as with the
real runners (`akm.engine.local`, `akm.engine.remote`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from akm.dispatch.types import DispatchResult
from akm.engine.attempt import AttemptSpec
from akm.engine.reduce import UnitOutcome, storable
from akm.engine.runner import Holder, PassView, PlainLane, new_attempt, not_started
from akm.engine.worklist import WorkUnit
from akm.store import units as units_store


@dataclass
class FakeAttempt:
    """What the handler is asked: one attempt of one unit."""

    unit: WorkUnit
    attempt: str  # its journal id (the unit's, `~r1` added for its first retry)
    spec: AttemptSpec  # what a real runner would run (the exec context with AKM_ITEM, the prompt, ...)
    stop: threading.Event  # set when the pass stops (cancelled, lease lost, a budget ceiling)

    @property
    def item(self) -> Any:
        """The unit's item of the list its step maps over."""
        return self.unit.item

    @property
    def retry(self) -> int:
        """0 for the unit's first attempt, 1 for its first retry, ..."""
        _, mark, k = self.attempt.rpartition("~r")
        return int(k) if mark else 0


def ok(value: Any = None) -> DispatchResult:
    """A successful attempt whose text artifact is `value` (None: empty)."""
    return DispatchResult(ok=True, text=None if value is None else str(value))


def fail(reason: str = "non_zero_exit", error: str = "it failed", **kw: Any) -> DispatchResult:
    """A failed attempt, for `reason` (the failure vocabulary, as a `retry.on` names it)."""
    return DispatchResult(ok=False, failure_reason=reason, error=error, **kw)


class FakeRunner:
    """A `akm.engine.runner.RunnerFactory`: pass it as `DriveOptions.runner`."""

    def __init__(self, handler: Callable[[FakeAttempt], DispatchResult]) -> None:
        self.handler = handler
        self.calls: list[FakeAttempt] = []  # in the order they started
        self.in_flight = 0
        self.max_in_flight = 0
        self.halts = 0  # passes that failed fast
        self._lock = threading.Lock()

    def __call__(self, d: Holder, p: PassView) -> _Runner:
        return _Runner(self, d, p)


class _Runner:
    def __init__(self, fake: FakeRunner, d: Holder, p: PassView) -> None:
        self.fake, self.d, self.p = fake, d, p

    def lane(self) -> PlainLane:
        return PlainLane(self.p, self.attempt)

    def start(self) -> None:
        pass

    def halt(self) -> None:
        with self.fake._lock:
            self.fake.halts += 1

    def close(self) -> None:
        pass

    def attempt(self, unit: WorkUnit, attempt: str) -> UnitOutcome:
        d, p, fake = self.d, self.p, self.fake
        new = new_attempt(d.run_id, p.step.step_id, unit, attempt)
        try:
            started_at = units_store.insert_unit(d.db, **new._asdict(), fence=d.fence)
        except Exception as exc:
            if d.fenced_out(exc):
                return not_started(unit, attempt)
            raise
        call = FakeAttempt(unit, attempt, p.attempts.spec_of(unit), p.event)
        with fake._lock:
            fake.calls.append(call)
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            res = fake.handler(call)
        finally:
            with fake._lock:
                fake.in_flight -= 1
        outcome = UnitOutcome(unit_id=unit.unit_id, **vars(res))
        outcome.dispatched = True
        outcome, result_json = storable(outcome, attempt)
        units_store.finish_unit(
            d.db,
            run_id=d.run_id,
            unit_id=attempt,
            started_at=started_at,
            status="completed" if outcome.ok else "failed",
            result_json=result_json,
            tokens=outcome.tokens,
            failure_reason=None if outcome.ok else outcome.failure_reason,
            step_id=p.step.step_id,
            fence=d.fence,
        )
        return outcome
