"""The runner seam: how the attempts of a dispatch pass run, apart from what the pass decides about them.

A pass (`akm.engine.passes`) schedules a step's units over its width of threads and keeps fail fast,
cancellation, retries, the budget and progress; each attempt it hands to its runner, which journals the
attempt's row before anything is dispatched and its result after, and returns the outcome:

* `akm.engine.local.LocalRunner` runs it here, on the pass's thread (group commit, rows journaled ahead);
* `akm.engine.remote.WorkerRunner` queues it for `akm worker` processes and waits for their finished row;
* a test may give the driver a runner of its own (`DriveOptions.runner`) that answers without any process.

Each thread of a pass is a `Lane` of its runner: what a runner carries from one unit to the next on that
thread (results held back for the next write, rows journaled ahead) lives there, touched by that thread only.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from akm.engine.reduce import UnitOutcome
from akm.store import units as units_store

if TYPE_CHECKING:
    from akm.dispatch.base import DispatcherRegistry
    from akm.engine.attempt import StepAttempts
    from akm.engine.budget import DispatchBudget
    from akm.engine.cancel import Cancellation
    from akm.engine.heartbeat import Heartbeat
    from akm.engine.worklist import WorkUnit
    from akm.errors import JournalError
    from akm.plan.model import StepPlan
    from akm.store.journal import Journal
    from akm.store.runs import Fence


class Ticket:
    """A unit a lane runs next: its index in the pass, and whether its first dispatch is in the budget already."""

    __slots__ = ("index", "prepaid")

    def __init__(self, index: int, prepaid: bool = False) -> None:
        self.index = index
        self.prepaid = prepaid


class Lane(Protocol):
    """One thread of a pass, as its runner sees it."""

    def next(self) -> Ticket | None:
        """The unit this thread runs next (None: none is left)."""
        ...

    def run(self, unit: WorkUnit, attempt: str, ticket: Ticket | None) -> UnitOutcome:
        """Run one attempt of `unit` (`ticket`: its first, as `next` gave it); its outcome, journaled."""
        ...

    def hand_back(self, ticket: Ticket) -> None:
        """The pass stopped before it ran `ticket`'s unit."""
        ...

    def settle(self) -> None:
        """Journal now whatever this lane holds back for its next write (the pass is about to wait)."""
        ...

    def close(self) -> None:
        """The thread is done: journal and close what it holds."""
        ...


class PlainLane:
    """A lane that holds nothing from one unit to the next: it takes the pass's next unit and runs each
    attempt with `run_attempt` (a runner that journals each attempt in a transaction of its own)."""

    __slots__ = ("p", "run_attempt")

    def __init__(self, p: PassView, run_attempt: Callable[[WorkUnit, str], UnitOutcome]) -> None:
        self.p = p
        self.run_attempt = run_attempt

    def next(self) -> Ticket | None:
        i = self.p.claim()
        return None if i is None else Ticket(i)

    def run(self, unit: WorkUnit, attempt: str, ticket: Ticket | None) -> UnitOutcome:
        return self.run_attempt(unit, attempt)

    def hand_back(self, ticket: Ticket) -> None:
        pass

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


class Runner(Protocol):
    """How one pass's attempts run (see the module docstring); built per pass by a `RunnerFactory`."""

    def lane(self) -> Lane:
        """A lane for the calling thread (called once on each thread of the pass)."""
        ...

    def start(self) -> None:
        """The pass's threads are about to start."""
        ...

    def halt(self) -> None:
        """The step failed fast: nothing not started yet is to run."""
        ...

    def close(self) -> None:
        """Every lane is closed: the pass is over."""
        ...


class HolderOptions(Protocol):
    @property
    def project_root(self) -> Path: ...

    @property
    def cancel(self) -> Cancellation: ...

    @property
    def on_progress(self) -> Callable[[Any], None] | None: ...


class Holder(Protocol):
    """What a runner needs of the driver holding the run's lease (`akm.engine.drive`)."""

    @property
    def db(self) -> Journal: ...

    @property
    def run_id(self) -> str: ...

    @property
    def fence(self) -> Fence: ...

    @property
    def opts(self) -> HolderOptions: ...

    @property
    def registry(self) -> DispatcherRegistry: ...

    @property
    def budget(self) -> DispatchBudget: ...

    @property
    def heartbeat(self) -> Heartbeat: ...

    @property
    def lease_lost(self) -> Cancellation: ...

    @property
    def journal_fault(self) -> JournalError | None: ...

    @property
    def recheck_after_s(self) -> float: ...

    # what workers check before they claim the run's units (`akm.engine.attempt.to_payload`)
    @property
    def scope_key(self) -> str: ...

    @property
    def commit(self) -> str | None: ...

    @property
    def work_notifier(self) -> Any: ...

    def warn(self, message: str) -> None: ...

    def fenced_out(self, exc: BaseException) -> bool: ...

    def reconfirm_lease(self) -> bool: ...


class PassView(Protocol):
    """What a runner needs of the pass it runs the attempts of (`akm.engine.passes.Pass`)."""

    @property
    def step(self) -> StepPlan: ...

    @property
    def units(self) -> list[WorkUnit]: ...

    @property
    def event(self) -> threading.Event: ...  # set: the pass stops (cancelled, lease lost, a budget ceiling)

    @property
    def halted(self) -> bool: ...  # the step failed fast

    @property
    def unclaimed(self) -> int: ...  # units no lane has claimed yet (read without a lock: an estimate)

    @property
    def lanes(self) -> int: ...  # threads the pass runs

    @property
    def attempts(self) -> StepAttempts: ...

    def claim(self) -> int | None:
        """The index of the next unit no lane has claimed yet (None: none is left)."""
        ...


RunnerFactory = Callable[[Holder, PassView], Runner]


def new_attempt(
    run_id: str, step_id: str, unit: WorkUnit, attempt: str, worktree_path: str | None = None
) -> units_store.NewAttempt:
    """What an attempt's journal row records of it, whether it runs here or is queued for workers."""
    return units_store.NewAttempt(
        run_id=run_id,
        unit_id=attempt,
        step_id=step_id,
        node_id=unit.node_id,
        parent_unit_id=unit.parent_unit_id,
        runner=unit.runner,
        engine=unit.engine,
        model=unit.model,
        input_hash=unit.input_hash,
        worktree_path=worktree_path,
    )


def not_started(unit: WorkUnit, attempt: str) -> UnitOutcome:
    """The outcome of a unit a driver did not start because it lost the lease (nothing journaled)."""
    return UnitOutcome(
        unit_id=unit.unit_id,
        ok=False,
        failure_reason="aborted",
        error=f"unit {attempt} was not started: this invocation lost the run lease",
    )
