"""`akm worker`: claim queued units of active runs, run them with the engine's dispatchers, finish them fenced.

Any number of workers on any hosts share one journal (PostgreSQL across machines; SQLite for several processes
on one machine). A worker never decides anything about a step: the run's coordinator (`workflow run
--workers`, the lease holder) queues the attempts and finalizes the steps; a worker only turns a queued row
into a finished one (`akm.store.queue`):

* it claims only what it can run here (`akm.worker.workspace`), at most `concurrency` at once;
* a heartbeat renews its claims every third of their TTL; a claim it cannot renew (re-queued after it
  lapsed, the run abandoned) is stopped at once — its result would be rejected anyway — and a watchdog
  that never touches the journal stops each unit whose claim was last renewed (counted from when the
  renewal was *sent*) longer ago than its TTL less `fencing.stop_margin`: a journal that stalls or drops
  the connection cannot keep a unit running past the moment another worker may claim it; such
  a claim is given back when the journal answers again, or lapses;
* a finish carries the claim's fencing token: after a freeze (SIGSTOP, a VM pause) past the claim's expiry
  the late result is rejected and the newer claim's stands;
* stopped (SIGINT/SIGTERM), it claims nothing more, stops its units and gives their claims back to the queue;
* it sweeps lapsed claims of dead workers back into the queue as it polls.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from akm import paths
from akm.codes import Code
from akm.dispatch import guard
from akm.dispatch.base import DispatcherRegistry
from akm.engine.attempt import AttemptSpec, EnvBindingError, StepAttempts, WorktreeError, from_payload
from akm.engine.cancel import Cancellation
from akm.engine.fencing import WATCH_EVERY_S, stop_margin
from akm.engine.reduce import UnitOutcome, storable
from akm.engine.state import decode_plan, load_run
from akm.errors import JournalError
from akm.ids import uuid4
from akm.plan.model import Plan
from akm.record import dataclass, field
from akm.store import queue as queue_store
from akm.store.journal import Journal
from akm.worker import workspace

DEFAULT_KINDS = ("exec", "llm", "agent")
# A slot claims its next unit ahead (so that it starts it without waiting for a round trip) only after a unit that
# ran shorter than AHEAD_AFTER_S, and gives it back unrun when its own unit has not ended within AHEAD_HOLD_S:
# an agent's unit runs for minutes, and the unit behind it must not wait there while other workers idle.
AHEAD_AFTER_S = 1.0
AHEAD_HOLD_S = 1.0
SWEEP_EVERY_S = 2.0
VERDICT_TTL_S = 10.0  # how long a decision "can / cannot run this step here" is trusted
COMMIT_READ_EVERY_S = 0.5  # how often the checkout's commit is read again (a `git pull` is seen within this)


class HostProblem(Exception):
    """What this host lacks for a claimed unit (its env file, a worktree): the claim goes back, the step is
    refused here, and the unit's retries are not spent on it."""


@dataclass
class WorkerEvent:
    """One thing a worker did, for its log lines: claimed | finished | rejected | released | refused | swept |
    fenced | warning | error."""

    kind: str
    run_id: str | None = None
    unit_id: str | None = None
    step_id: str | None = None
    detail: str | None = None


@dataclass
class WorkerOptions:
    project_root: Path
    kinds: tuple[str, ...] = DEFAULT_KINDS
    concurrency: int = 2
    poll_s: float = 1.0
    idle_exit_s: float | None = None  # leave after this long with nothing claimed or running (None: never)
    cancel: Cancellation = field(default_factory=Cancellation)
    on_event: Callable[[WorkerEvent], None] | None = None  # from unit threads too
    registry: DispatcherRegistry | None = None


@dataclass
class WorkerSummary:
    holder: str
    host: str
    claimed: int = 0
    finished: int = 0
    rejected: int = 0
    released: int = 0
    swept: int = 0
    refused: list[str] = field(default_factory=list)
    stop_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "host": self.host,
            "claimed": self.claimed,
            "finished": self.finished,
            "rejected": self.rejected,
            "released": self.released,
            "swept": self.swept,
            "refused": list(self.refused),
            "stopReason": self.stop_reason,
        }


class _InFlight:
    def __init__(self, claim: queue_store.Claim, sent: float) -> None:
        self.claim = claim
        self.stop = threading.Event()
        self.lost = False  # the claim is no longer ours (heartbeat): write nothing
        self.fenced = False  # stopped by the watchdog before its claim could lapse: give it back, finish nothing
        self.renewed_at = sent  # when the claim or its last successful renewal was sent (monotonic)
        self.answered_at = time.monotonic()  # when the claim's answer came: a unit claimed ahead waits from here
        self.taken = threading.Event()  # claimed ahead: its slot took it (to run it or give it back)
        self.started_at: str | None = None  # claimed ahead: when it really started (its finish moves the stamp)


class _Slot:
    """One of a worker's `concurrency` places to run units (issue 40, "waits overlap"): the unit claimed ahead
    for it, which it starts the moment its unit ends while that one's finish is written behind it, and the one
    helper thread that writes those finishes and times the claim ahead out, in the order they were asked for.

    The helper lives as long as the slot: a thread started per unit cost the slot a handshake with the new
    thread (`Thread.start` waits for it to run) between one unit's end and the next one's spawn."""

    def __init__(self) -> None:
        self.ahead: _InFlight | None = None  # claimed ahead, not started: the slot or its give-back timer takes it
        self.answered = threading.Event()  # set: no finish of the slot's is in flight (one may bring `ahead`)
        self.answered.set()
        self._jobs: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._helper: threading.Thread | None = None

    def behind(self, job: Callable[[], None]) -> None:
        """Have the slot's helper thread run `job` once the jobs asked for before it are done."""
        if self._helper is None:
            self._helper = threading.Thread(target=self._work, name="akm-slot-helper", daemon=True)
            self._helper.start()
        self._jobs.put(job)

    def close(self) -> None:
        """Wait for the jobs asked for, then end the helper thread."""
        if self._helper is not None:
            self._jobs.put(None)
            self._helper.join()
            self._helper = None

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # noqa: BLE001 - each job tells its own failures; the slot's next jobs still run
                pass


class Worker:
    def __init__(self, db: Journal, opts: WorkerOptions) -> None:
        from akm.store.runs import host_id

        self.db = db
        self.opts = opts
        self.root = paths.project_root(opts.project_root)
        self.holder = "worker-" + uuid4()
        self.host = host_id()
        self.pid = os.getpid()
        self.scopes = paths.scope_keys(self.root, portable=db.shared)
        self.commit = paths.project_commit(self.root)
        self._commit_read_at = time.monotonic()
        self.registry = opts.registry or _default_registry()
        self.kinds = tuple(k for k in opts.kinds if self.registry.get(k) is not None)
        if not self.kinds:
            from akm.errors import UsageError

            raise UsageError(
                f"this akm has no dispatcher for any of the unit kinds asked for ({', '.join(opts.kinds)}); "
                "the worker would claim nothing.",
                code=Code.INVALID_ARGUMENT,
                details={"argument": "kinds"},
            )
        self.summary = WorkerSummary(holder=self.holder, host=self.host)
        self.ttl = queue_store.claim_ttl_s()
        self._plans: dict[str, Plan] = {}
        # (run, step) -> (refusal or None, when decided): decided again after VERDICT_TTL_S, or at once when
        # the checkout's commit changed (a `git pull` may cure a refusal, or void an approval).
        self._verdicts: dict[tuple[str, str | None], tuple[str | None, float]] = {}
        self._flying: dict[tuple[str, str], _InFlight] = {}  # every claim held: running, finishing, or ahead
        self._slots = 0  # slot threads alive: at most `concurrency`, each running at most one unit at a time
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._hinted = threading.Event()  # units were queued since the queue was last listed (PostgreSQL)
        self._listed_at = 0.0  # when the queue was last listed (monotonic)
        self._parent_env = dict(os.environ)
        self._stopped = False
        self._notifier: Any = None

    # ------------------------------------------------------------ events
    def _tell(self, event: WorkerEvent) -> None:
        if self.opts.on_event is not None:
            self.opts.on_event(event)

    # ------------------------------------------------------------ the loop
    def run(self) -> WorkerSummary:
        cancel = self.opts.cancel
        cancel.link(self._wake)
        # its slots, its loop and its heartbeat, before the first claim; its claims and finishes parsed and planned
        self.db.warm(self.opts.concurrency + 2, queue_store.worker_primers(self.db))
        # The guardian that takes units down with this process (akm.dispatch.guard) starts now, while the worker
        # waits for work: started by the first spawn, its interpreter's start-up competed with the run's first units.
        guard.token()
        # queued units wake us (PostgreSQL), and have the queue listed again
        listener = self.db.listener(queue_store.WORK_CHANNEL, _Hint(self))
        self._notifier = self.db.notifier(queue_store.RUN_CHANNEL)
        heartbeat = threading.Thread(target=self._heartbeat, name="akm-worker-heartbeat", daemon=True)
        heartbeat.start()
        threading.Thread(target=self._fence, name="akm-worker-fence", daemon=True).start()
        last_busy = time.monotonic()
        last_sweep = 0.0
        threads: list[threading.Thread] = []
        try:
            while not cancel.tripped:
                now = time.monotonic()
                if now - last_sweep >= SWEEP_EVERY_S:
                    last_sweep = now
                    self._sweep()
                got = self._claim_some()
                with self._lock:
                    self._slots += len(got)
                for claim in got:
                    t = threading.Thread(target=self._run_slot, args=(claim,), name=f"akm-work-{claim.unit_id}")
                    t.daemon = True
                    threads.append(t)
                    t.start()
                threads = [t for t in threads if t.is_alive()]
                with self._lock:
                    busy = bool(got) or bool(self._flying)
                if busy:
                    last_busy = time.monotonic()
                elif self.opts.idle_exit_s is not None and time.monotonic() - last_busy >= self.opts.idle_exit_s:
                    self.summary.stop_reason = "idle"
                    break
                if not got:
                    self._wake.wait(self.opts.poll_s)
                self._wake.clear()
        finally:
            self._wind_down(threads, listener)
        return self.summary

    def _wind_down(self, threads: list[threading.Thread], listener: Any) -> None:
        """Stop what `run` started: on a cancel, tell each flying unit to stop; wait for their threads, then
        close the queue's listener and notifier."""
        cancel = self.opts.cancel
        if cancel.tripped:
            self.summary.stop_reason = cancel.reason
            with self._lock:
                for f in self._flying.values():
                    f.stop.set()
        for t in threads:
            t.join()
        cancel.unlink(self._wake)
        self._stopped = True
        for hint in (listener, self._notifier):
            if hint is not None:
                hint.close()

    def _sweep(self) -> None:
        try:
            swept = queue_store.sweep(self.db, self.host)
        except Exception as exc:
            self._tell(WorkerEvent("error", detail=f"sweep failed: {exc}"))
            return
        for run_id, unit_id in swept:
            self.summary.swept += 1
            self._tell(WorkerEvent("swept", run_id, unit_id, detail="its claim lapsed; back in the queue"))

    def _claim_some(self) -> list[queue_store.Claim]:
        """Claim up to the free slots (issue 40: one statement per claim, the queue listed only when needed).

        First from the (run, step) pairs this host was found able to run; then, when those had too few and
        units may have been queued elsewhere (a wake-up from the coordinator, a poll interval gone by, or no
        such pair at all), from the pairs the queue lists now, once each passed the workspace check."""
        with self._lock:
            free = self.opts.concurrency - self._slots
        if free <= 0 or not self.kinds:
            return []
        known = self._approved()
        got = self._claim(known, free) if known else []
        free -= len(got)
        now = time.monotonic()
        due = not known or self._hinted.is_set() or now - self._listed_at >= self.opts.poll_s
        if free <= 0 or not due or self.opts.cancel.tripped:
            return got
        self._hinted.clear()
        self._listed_at = now
        try:
            work = queue_store.eligible_work(self.db, self.kinds, known=set(self._plans))
        except Exception as exc:
            self._tell(WorkerEvent("error", detail=f"reading the queue failed: {exc}"))
            return got
        fresh = [
            (e.run_id, e.step_id)
            for e in work
            if (e.run_id, e.step_id) not in known and not self.opts.cancel.tripped and self._refusal(e) is None
        ]
        return got + (self._claim(fresh, free) if fresh else [])

    def _approved(self) -> list[tuple[str, str | None]]:
        """The (run, step) pairs whose units this host was found able to run, in the last VERDICT_TTL_S."""
        self._check_commit()
        now = time.monotonic()
        return [
            key for key, (reason, at) in list(self._verdicts.items()) if reason is None and now - at < VERDICT_TTL_S
        ]

    def _claim(self, targets: list[tuple[str, str | None]], limit: int) -> list[queue_store.Claim]:
        sent = time.monotonic()
        try:
            claims = queue_store.claim_work(
                self.db,
                targets=targets,
                kinds=self.kinds,
                holder=self.holder,
                host=self.host,
                pid=self.pid,
                limit=limit,
            )
        except Exception as exc:
            run_id, step_id = targets[0] if len(targets) == 1 else (None, None)
            self._tell(WorkerEvent("error", run_id, step_id=step_id, detail=f"claim failed: {exc}"))
            return []
        self._took(claims, sent)
        return claims

    def _took(self, claims: list[queue_store.Claim], sent: float) -> None:
        """Count claims in flight (`sent`: when the claim was sent, from which the watchdog counts)."""
        with self._lock:
            for c in claims:
                f = self._flying[(c.run_id, c.unit_id)] = _InFlight(c, sent)
                if self.opts.cancel.tripped:  # taken with a finish as the worker stops: given back unrun
                    f.stop.set()
        for c in claims:
            self.summary.claimed += 1
            self._tell(WorkerEvent("claimed", c.run_id, c.unit_id, c.step_id, detail=f"attempt {c.token}"))

    def _check_commit(self) -> None:
        """Forget every verdict once the checkout's commit changed (a `git pull` may cure or void one). Read at
        most every COMMIT_READ_EVERY_S: it is asked before each claim, and reading `.git` (a worktree's pointer,
        HEAD, the ref) costs ~0.4 ms, more than the rest of a slot's bookkeeping for a unit."""
        now = time.monotonic()
        if now - self._commit_read_at < COMMIT_READ_EVERY_S:
            return
        self._commit_read_at = now
        commit = paths.project_commit(self.root)
        if commit != self.commit:
            self.commit = commit
            self._verdicts.clear()

    def _refusal(self, e: queue_store.Eligible) -> str | None:
        key = (e.run_id, e.step_id)
        self._check_commit()
        known = self._verdicts.get(key)
        if known is not None and time.monotonic() - known[1] < VERDICT_TTL_S:
            return known[0]
        try:
            plan = self._plan(e.run_id, e)
            reason = workspace.refusal(
                plan=plan,
                step_id=e.step_id,
                payload=from_payload(e.payload),  # read with the listing: no race with other claimers
                scopes=self.scopes,
                run_scope=e.scope_key,
                project_root=self.root,
                commit=self.commit,
                kinds_here=frozenset(self.kinds),
            )
        except JournalError as exc:  # the journal, not this host: no verdict, asked again at the next poll
            self._tell(WorkerEvent("error", e.run_id, step_id=e.step_id, detail=f"reading its plan failed: {exc}"))
            return str(exc)
        except Exception as exc:
            reason = f"its plan cannot be read here: {exc}"
        repeated = known is not None and known[0] == reason
        self._verdicts[key] = (reason, time.monotonic())
        if reason is not None and not repeated:
            text = f"run {e.run_id} step {e.step_id}: {reason}"
            self.summary.refused.append(text)
            self._tell(WorkerEvent("refused", e.run_id, step_id=e.step_id, detail=reason))
        return reason

    def _plan(self, run_id: str, listed: queue_store.Eligible | None = None) -> Plan:
        """The run's frozen plan (checked against its hash), decoded once per run: from the listing that named the
        run (`eligible_work` sends it for runs this worker has not decoded), else read from the journal."""
        plan = self._plans.get(run_id)
        if plan is None:
            if listed is not None and listed.plan_json is not None:
                plan = decode_plan(run_id, listed.plan_json, listed.plan_hash)
            else:
                plan = load_run(self.db, run_id).plan
            self._plans[run_id] = plan
        return plan

    # ------------------------------------------------------------ one slot
    def _run_slot(self, claim: queue_store.Claim) -> None:
        """One of the worker's `concurrency` slots, on this one thread: run the claim, then each next unit the slot
        took with a finish (`_finish`) or claimed ahead (`_Slot`), until none is left; then free the slot."""
        slot = _Slot()
        nxt: queue_store.Claim | None = claim
        try:
            while nxt is not None:
                nxt = self._run_one(slot, nxt)
                if nxt is None:  # nothing taken with a finish: the unit claimed ahead, if any
                    nxt = self._take_ahead(slot)
        finally:
            left = self._pop_ahead(slot)  # a slot that leaves (an error, say) runs nothing more
            if left is not None:
                self._not_started(left)
            slot.close()
            with self._lock:
                self._slots -= 1
            self._wake.set()  # a free slot: the loop claims for it

    def _run_one(self, slot: _Slot, claim: queue_store.Claim) -> queue_store.Claim | None:
        """Run one claimed unit and journal its outcome; the slot's next unit, when its finish took one."""
        key = (claim.run_id, claim.unit_id)
        with self._lock:
            flying = self._flying[key]
        began = time.monotonic()
        finishing = False
        try:
            if self.opts.cancel.tripped:  # the worker stops: a unit not started yet goes back (claimed with a finish)
                self._give_back(claim)
                return None
            try:
                outcome = self._execute(claim, flying.stop)
            except HostProblem as exc:
                self._verdicts[(claim.run_id, claim.step_id)] = (str(exc), time.monotonic())
                self.summary.refused.append(f"run {claim.run_id} step {claim.step_id}: {exc}")
                self._tell(WorkerEvent("refused", claim.run_id, claim.unit_id, claim.step_id, detail=str(exc)))
                if queue_store.release_claim(self.db, claim, self.holder):
                    self.summary.released += 1
                return None
            except Exception as exc:  # a failure inside akm: the row is claimed, so it must be finished
                outcome = UnitOutcome(
                    unit_id=claim.unit_id,
                    ok=False,
                    failure_reason="dispatch_error",
                    error=f"unit {claim.unit_id} failed inside the worker before it produced a result: {exc}",
                )
            short = time.monotonic() - began < AHEAD_AFTER_S
            if flying.lost:
                self.summary.rejected += 1
                self._tell(
                    WorkerEvent("rejected", claim.run_id, claim.unit_id, claim.step_id, detail="the claim was lost")
                )
                return None
            if flying.fenced:  # stopped before its claim could lapse: back to the queue (else it lapses there)
                if not self._give_back(claim):  # it lapsed meanwhile (this worker was frozen, say): another's now
                    self.summary.rejected += 1
                    self._tell(
                        WorkerEvent("rejected", claim.run_id, claim.unit_id, claim.step_id, detail="its claim lapsed")
                    )
                return None
            if flying.stop.is_set() and self.opts.cancel.tripped and not outcome.ok:  # a result in hand is kept
                self._give_back(claim)
                return None
            finishing = True
            return self._finish(slot, flying, outcome, short)
        except Exception as exc:
            self._tell(WorkerEvent("error", claim.run_id, claim.unit_id, claim.step_id, detail=str(exc)))
            return None
        finally:
            if not finishing:
                with self._lock:
                    self._flying.pop(key, None)

    def _give_back(self, claim: queue_store.Claim) -> bool:
        """Release the claim unrun (back to the queue, counted and told); False when it is not this worker's any
        more (it lapsed and another took it: nothing written)."""
        if not queue_store.release_claim(self.db, claim, self.holder):
            return False
        self.summary.released += 1
        self._tell(WorkerEvent("released", claim.run_id, claim.unit_id, claim.step_id))
        return True

    def _finish(self, slot: _Slot, flying: _InFlight, outcome: UnitOutcome, short: bool) -> queue_store.Claim | None:
        """Journal the outcome, fenced, and return the slot's next unit, if any.

        When a unit claimed ahead waits in the slot, it is the next one, started at once, and this finish is
        written behind it on a helper thread, with the claim of the unit after it when this one was short (the
        slot then never waits for a round trip between units). Otherwise the finish is written now, claiming in
        the same round trip the slot's next unit, plus one more ahead after a short unit (issue 40)."""
        ahead = self._take_ahead(slot)
        more = short and not self.opts.cancel.tripped
        if ahead is not None:
            slot.answered.clear()
            slot.behind(functools.partial(self._finish_behind, slot, flying, outcome, more))
            return ahead
        claims = self._write_finish(flying, outcome, 1, 1 if more else 0)
        held = self._hold(slot, claims[1]) if len(claims) > 1 else None
        if held is not None:  # its give-back timer waits on the slot's helper thread
            slot.behind(functools.partial(self._hold_or_give_back, slot, held))
        return claims[0] if claims else None

    def _finish_behind(self, slot: _Slot, flying: _InFlight, outcome: UnitOutcome, more: bool) -> None:
        """`_finish` on a helper thread while the slot runs its next unit: the claim it takes waits in the slot."""
        claims: list[queue_store.Claim] = []
        try:
            claims = self._write_finish(flying, outcome, 0, 1 if more else 0)
        except Exception as exc:
            c = flying.claim
            self._tell(WorkerEvent("error", c.run_id, c.unit_id, c.step_id, detail=str(exc)))
        finally:
            held = self._hold(slot, claims[0]) if claims else None  # in the slot before it may look
            slot.answered.set()
        if held is not None:
            self._hold_or_give_back(slot, held)

    def _write_finish(self, flying: _InFlight, outcome: UnitOutcome, limit: int, ahead: int) -> list[queue_store.Claim]:
        """Write the finish of `flying`'s claim and, in the same round trip, claim up to `limit` units from the
        (run, step) pairs this host was found able to run (none: the loop lists and claims for the slot), and `ahead`
        more to hold, each only while another unit stays queued for other workers (`queue.take_ahead`)."""
        claim = flying.claim
        try:
            outcome, result_json = storable(outcome, claim.unit_id)
            fields: dict[str, Any] = dict(
                status="completed" if outcome.ok else "failed",
                result_json=result_json,
                tokens=outcome.tokens,
                failure_reason=None if outcome.ok else outcome.failure_reason,
                session_id=outcome.session_id,
                truncated=outcome.truncated,
                usage=outcome.usage,
                cost=outcome.cost,
                started_at=flying.started_at,
            )
            targets = [] if self.opts.cancel.tripped or limit + ahead <= 0 else self._approved()
            claims: list[queue_store.Claim] = []
            if targets:
                sent = time.monotonic()
                written, claims = queue_store.finish_and_claim(
                    self.db,
                    claim,
                    self.holder,
                    **fields,
                    targets=targets,
                    kinds=self.kinds,
                    host=self.host,
                    pid=self.pid,
                    limit=limit,
                    ahead=ahead,
                )
                self._took(claims, sent)  # in flight before this one leaves
            else:
                written = queue_store.finish_claimed(self.db, claim, self.holder, **fields)
        finally:
            with self._lock:
                self._flying.pop((claim.run_id, claim.unit_id), None)
        if written == "finished":
            if self._notifier is not None and not queue_store.finish_notifies(self.db):
                self._notifier.notify(claim.run_id)  # the coordinator reads the row now, not at its next poll
            self.summary.finished += 1
            mark = "ok" if outcome.ok else f"failed ({outcome.failure_reason})"
            self._tell(WorkerEvent("finished", claim.run_id, claim.unit_id, claim.step_id, detail=mark))
        else:
            self.summary.rejected += 1
            self._tell(
                WorkerEvent(
                    "rejected",
                    claim.run_id,
                    claim.unit_id,
                    claim.step_id,
                    detail="its claim lapsed and the unit was claimed again meanwhile; this result was not journaled",
                )
            )
        return claims

    # ------------------------------------------------------------ a unit claimed ahead
    def _hold(self, slot: _Slot, claim: queue_store.Claim) -> _InFlight | None:
        """Put `claim` in the slot as its next unit (None: it is not in flight any more); the caller then waits
        for the slot to take it (`_hold_or_give_back`)."""
        with self._lock:
            flying = self._flying.get((claim.run_id, claim.unit_id))
            if flying is not None:
                slot.ahead = flying
        return flying

    def _hold_or_give_back(self, slot: _Slot, flying: _InFlight) -> None:
        """Give the unit claimed ahead back unrun when the slot has not taken it within AHEAD_HOLD_S (the slot's
        unit turned out long: another worker may be idle meanwhile)."""
        flying.taken.wait(AHEAD_HOLD_S)
        with self._lock:
            mine = slot.ahead is flying  # else the slot took it first
            if mine:
                slot.ahead = None
        if mine:
            self._not_started(flying)
            self._wake.set()  # it is back in the queue: the loop may claim it for a free slot

    def _pop_ahead(self, slot: _Slot) -> _InFlight | None:
        """Take the unit claimed ahead out of the slot, after the slot's finish in flight answered (it may bring
        one). The give-back timer and the slot race for it under the lock: exactly one of them gets it."""
        slot.answered.wait()
        with self._lock:
            flying = slot.ahead
            slot.ahead = None
        if flying is not None:
            flying.taken.set()
        return flying

    def _take_ahead(self, slot: _Slot) -> queue_store.Claim | None:
        """The unit claimed ahead for the slot, ready to run — its start stamp moved on by its wait in the slot
        (`queue.started_later`: the wait is not shown as its run time) —, or None; one that may not run (lost,
        fenced or about to be, its run ended, its step refused here since, the worker stopping) is given back
        instead."""
        flying = self._pop_ahead(slot)
        if flying is None:
            return None
        verdict = self._verdicts.get((flying.claim.run_id, flying.claim.step_id))
        refused = verdict is not None and verdict[0] is not None
        # overdue: the watchdog's own rule, checked here too: after a freeze (SIGSTOP) the slot may look before it
        overdue = time.monotonic() - flying.renewed_at > self.ttl - stop_margin(self.ttl)
        if refused or overdue or flying.lost or flying.fenced or flying.stop.is_set() or self.opts.cancel.tripped:
            self._not_started(flying)
            return None
        with self._lock:
            flying.started_at = queue_store.started_later(flying.claim, time.monotonic() - flying.answered_at)
            flying.claim = flying.claim._replace(started_at=flying.started_at)
        return flying.claim

    def _not_started(self, flying: _InFlight) -> None:
        """A claim the slot will not run: given back; when it is not ours any more nothing is written, and it counts
        as rejected (each claim ends finished, rejected or released)."""
        c = flying.claim
        try:
            if flying.lost or not self._give_back(c):
                self.summary.rejected += 1
                self._tell(WorkerEvent("rejected", c.run_id, c.unit_id, c.step_id, detail="its claim lapsed unstarted"))
        except Exception as exc:
            self._tell(
                WorkerEvent("error", c.run_id, c.unit_id, c.step_id, detail=f"giving its claim back failed: {exc}")
            )
        finally:
            with self._lock:
                self._flying.pop((c.run_id, c.unit_id), None)

    def _execute(self, claim: queue_store.Claim, stop: threading.Event) -> UnitOutcome:
        """Run the claimed attempt as its driver would have run it (`akm.engine.attempt`)."""
        payload = from_payload(claim.dispatch_json)
        spec = payload.spec if payload is not None else AttemptSpec(unit_id="", kind="")
        spec.kind = claim.runner or ""  # the row's runner: the dispatcher that runs it
        unit_id = spec.unit_id = spec.unit_id or claim.unit_id
        plan = self._plan(claim.run_id)
        step = plan.step(claim.step_id) if claim.step_id is not None else None
        dispatcher = self.registry.get(claim.runner or "")
        if step is None or step.unit_template is None or dispatcher is None:
            return UnitOutcome(
                unit_id=unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"unit {claim.unit_id}: no unit template or dispatcher for it in this worker",
            )
        try:
            attempts = StepAttempts.open(
                plan, step, run_id=claim.run_id, project_root=self.root, parent_env=self._parent_env
            )
        except EnvBindingError as exc:
            raise HostProblem(f"the step's env binding cannot be resolved here: {exc}") from None
        try:
            # (the coordinator and `status --watch` read an agent's live activity from the journal)
            prepared = attempts.prepare(spec, claim.unit_id, db=self.db, started_at=claim.started_at)
        except (WorktreeError, OSError) as exc:
            raise HostProblem(f"could not create the isolation worktree here: {exc}") from None
        try:
            return prepared.run(dispatcher, stop)
        finally:
            warning = prepared.cleanup()
            if warning:
                self._tell(WorkerEvent("warning", claim.run_id, claim.unit_id, claim.step_id, detail=warning))

    # ------------------------------------------------------------ heartbeat
    def _heartbeat(self) -> None:
        interval = max(0.05, self.ttl / 3)
        retry = min(interval, 1.0)  # a renewal that could not reach the journal is tried again soon
        wait = interval
        while not self._stopped:
            time.sleep(wait)
            with self._lock:
                flying = [f for f in self._flying.values() if not f.fenced]
            if not flying:
                wait = interval
                continue
            sent = time.monotonic()
            try:
                renewal = queue_store.renew_claims(self.db, self.holder, [f.claim for f in flying])
            except Exception as exc:  # the watchdog (`_fence`) stops units before their claims can lapse
                self._tell(WorkerEvent("error", detail=f"renewing claims failed: {exc}"))
                wait = retry
                continue
            wait = interval
            keys = {_key(c): "gone" for c in renewal.gone} | {_key(c): "ended" for c in renewal.ended}
            for f in flying:
                why = keys.get(_key(f.claim))
                if why is None:
                    f.renewed_at = max(f.renewed_at, sent)
                    continue
                if why == "gone":
                    f.lost = True  # not ours any more: write nothing
                f.stop.set()  # "ended": the run cannot be driven; the finish records how the unit ended

    def _fence(self) -> None:
        """Stop each unit whose claim could lapse soon: `stop_margin` before its TTL since the last renewal that
        was sent and succeeded. Touches neither the journal nor anything a journal call holds."""
        limit = self.ttl - stop_margin(self.ttl)
        while not self._stopped:
            time.sleep(WATCH_EVERY_S)
            now = time.monotonic()
            with self._lock:
                overdue = [f for f in self._flying.values() if not f.fenced and now - f.renewed_at > limit]
                for f in overdue:
                    f.fenced = True
            for f in overdue:
                f.stop.set()
                c = f.claim
                self._tell(
                    WorkerEvent(
                        "fenced",
                        c.run_id,
                        c.unit_id,
                        c.step_id,
                        detail="its claim could not be renewed in time (the journal did not answer); stopped so "
                        "that no other worker runs it at the same time",
                    )
                )


class _Hint:
    """What the coordinator's wake-up sets (`Journal.listener` calls `set()`): have the queue listed again, and wake
    the loop when it has a slot to claim for. With every slot busy the loop sleeps on: the coordinator queues
    with each finish it reads, and four workers' loops woken for each of those writes only to find no free slot
    was CPU taken from the units (a slot that frees wakes the loop itself, and the listing is still due)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def set(self) -> None:
        w = self.worker
        w._hinted.set()
        if w._slots < w.opts.concurrency:
            w._wake.set()


def _key(c: queue_store.Claim) -> tuple[str, str, int]:
    return (c.run_id, c.unit_id, c.token)


def _default_registry() -> DispatcherRegistry:
    from akm.dispatch.registry import default_registry

    return default_registry()
