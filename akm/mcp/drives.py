"""Drivers that outlive the call: background drives for a long-lived front (the MCP server).

An MCP tool call has a time bound; a unit (an LLM answer, an agent session, a build) often takes longer.
So a long-lived front does not drive a run inside its call: it asks `Drives.start_or_attach` for the run's
driver — a thread of this process running `api.run_workflow(run_id)` — and only *waits* for it, up to its
bound. The driver keeps going when the call returns; the next call for the same run attaches to it and sees
what happened meanwhile (`executed` since the driver started, per-step counts, its final result).

Rules this module keeps:
* One driver per run per process, started under one lock, so two calls never race for the run's lease.
* The driver never waits for a client: each waiting call gets a `Listener`, a bounded mailbox the driver
  drops progress into without blocking (the oldest messages go when it is full). A client that never reads
  its stdout can stall its own call, never the run.
* Stopping is explicit (`stop`, `shutdown`): a cancelled call only stops waiting. `shutdown` (the session
  ended: stdin closed, SIGTERM) stops every driver the way a signal stops `workflow run` — running units
  are killed, their attempts journaled as aborted, the lease released — and waits for them, so nothing
  is orphaned and each run stays resumable.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from akm import api
from akm.codes import Code
from akm.errors import AkmError, InternalError
from akm.views import RunResult, StepCount

# Abort reasons that are ours, not the run's: a unit they stop is not "failed" to the agent.
STOP_REASONS = frozenset({"stopped", "session_ended"})


class Listener:
    """A waiting call's mailbox: progress messages, most recent last, at most `size` of them."""

    def __init__(self, size: int = 256) -> None:
        self._items: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def put(self, item: dict[str, Any]) -> None:
        with self._lock:
            self._items.append(item)  # a full mailbox drops its oldest message

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items


class Drive:
    """One background driver of one run, and what it has done so far."""

    def __init__(self, run_id: str, max_steps: int | None, workers: bool = False) -> None:
        self.run_id = run_id
        self.max_steps = max_steps
        self.workers = workers
        self.cancel = api.Cancellation()
        self.finished = threading.Event()
        self.result: RunResult | None = None
        self.error: AkmError | None = None
        self.delivered = False  # a call has reported the final result
        self._lock = threading.Lock()
        self._steps: dict[str, StepCount] = {}
        self._listeners: set[Listener] = set()
        self.carried: list[dict[str, Any]] = []  # what an earlier, unreported driver of the run executed
        self.carried_progress: list[StepCount] = []  # and how far it got
        self.warnings: list[str] = []
        self.last_activity: dict[str, Any] | None = None  # the latest unit_activity (what a heartbeat names)

    # -- what the driver reports (worker threads) ------------------------------------------------------
    def on_progress(self, p: Any) -> None:
        if p.kind == "unit" and not p.ok and p.failure_reason == "aborted" and self.cancel.reason in STOP_REASONS:
            return  # stopped by us (stop, or the session ended): not a failure of the unit
        with self._lock:
            count = self._steps.get(p.step_id)
            if count is None:
                count = self._steps[p.step_id] = StepCount(step_id=p.step_id)
            if p.kind == "unit_activity":  # a running agent unit's CLI did something: no count changes
                self.last_activity = {"attemptId": p.attempt_id, "activity": p.to_json()}
                message = {
                    "kind": "unit_activity",
                    "stepId": p.step_id,
                    "attemptId": p.attempt_id,
                    "activity": p.to_json(),
                }
            elif p.kind == "step_started":  # a new pass (first dispatch, or a gate loop's re-dos) counts afresh
                count.done, count.total, count.failed, count.status = 0, p.total, 0, None
                message = {"kind": "step_started", "stepId": p.step_id, "total": p.total}
            elif p.kind == "unit":
                count.done, count.total = max(count.done, p.done), max(count.total, p.total)
                if not p.ok:
                    count.failed += 1
                message = {
                    "kind": "unit",
                    "stepId": p.step_id,
                    "done": p.done,
                    "total": p.total,
                    "attemptId": p.attempt_id,
                    "ok": p.ok,
                    "failureReason": p.failure_reason,
                }
            else:
                count.status = p.status
                message = {"kind": "step", "stepId": p.step_id, "status": p.status}
            listeners = list(self._listeners)
        for listener in listeners:
            listener.put(message)

    def progress(self) -> list[StepCount]:
        with self._lock:
            mine = {c.step_id: StepCount(**c.model_dump()) for c in self._steps.values()}
        earlier = [c for c in self.carried_progress if c.step_id not in mine]
        return earlier + list(mine.values())

    def listen(self) -> Listener:
        listener = Listener()
        with self._lock:
            self._listeners.add(listener)
        return listener

    def unlisten(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)

    @property
    def alive(self) -> bool:
        return not self.finished.is_set()

    def now_text(self) -> str:
        """What the driver is on, for a heartbeat: the step it works on, its units done, the latest activity."""
        from akm.report.live import activity_text

        counts = self.progress()
        current = next((c for c in reversed(counts) if c.status is None), None)
        if current is None:
            return "starting" if not counts else f"step {counts[-1].step_id} {counts[-1].status}"
        text = f"step {current.step_id} running ({current.done}/{current.total} units done"
        text += f", {current.failed} failed)" if current.failed else ")"
        last = self.last_activity
        if last is not None and last["activity"].get("stepId") == current.step_id:
            text += f"; {last['attemptId']} {activity_text(last['activity'])}"
        return text


class Drives:
    """The background drivers of one long-lived process, by run id."""

    def __init__(self, *, cwd: str) -> None:
        self.cwd = cwd
        self._lock = threading.Lock()
        self._drives: dict[str, Drive] = {}
        self._closed = False

    def start_or_attach(
        self,
        target: str,
        *,
        params: dict[str, Any] | None = None,
        new: bool = False,
        from_run: str | None = None,
        max_steps: int | None = None,
        cwd: str | None = None,
        workers: bool = False,
        trace_parent: str | None = None,
    ) -> tuple[Drive, api.OpenedRun]:
        """The driver of the run `target` names: the running one, or a new one (the run is opened first, so
        bad input is refused before anything runs). Raises AkmError for what `api.open_run` refuses."""
        with self._lock:
            if self._closed:
                raise AkmError("The server is shutting down; no run is started.", code=Code.SHUTTING_DOWN)
            opened = api.open_run(
                target,
                params=params or None,
                new=new,
                from_run=from_run,
                cwd=cwd or self.cwd,
                trace_parent=trace_parent,
            )
            drive = self._drives.get(opened.run_id)
            if drive is not None and drive.alive:
                return drive, opened
            unreported = drive if drive is not None and not drive.delivered and drive.result is not None else None
            if unreported is not None and opened.status != "active":
                return unreported, opened  # it finished between two calls and nothing changed since: report that
            fresh = Drive(opened.run_id, max_steps, workers)
            fresh.warnings = list(opened.warnings)
            if unreported is not None and unreported.result is not None:
                fresh.carried = list(unreported.carried) + list(unreported.result.executed)
                fresh.carried_progress = unreported.progress()
            self._drives[opened.run_id] = fresh
            threading.Thread(
                target=self._drive, args=(fresh, cwd or self.cwd), name=f"akm-drive-{opened.run_id[:8]}", daemon=True
            ).start()
            return fresh, opened

    def start_requested(
        self, req: api.RunToolRequest, *, cwd: str, trace_parent: str | None
    ) -> tuple[Drive, api.OpenedRun]:
        """`start_or_attach` for a `workflow_run` request (a plain call's or a task's: one reading of it)."""
        return self.start_or_attach(
            req.target,
            params=req.params or None,
            new=req.new,
            from_run=req.from_run,
            max_steps=req.max_steps,
            cwd=cwd,
            workers=req.workers,
            trace_parent=trace_parent,
        )

    def get(self, run_id: str) -> Drive | None:
        with self._lock:
            return self._drives.get(run_id)

    def _drive(self, drive: Drive, cwd: str) -> None:
        try:
            result = api.run_workflow(
                drive.run_id,
                max_steps=drive.max_steps,
                workers=drive.workers,
                cancel=drive.cancel,
                on_progress=drive.on_progress,
                on_warning=lambda w: drive.warnings.append(w.message),
                cwd=cwd,
            )
            if drive.carried:
                result.executed = drive.carried + result.executed
            drive.result = result
        except AkmError as exc:
            drive.error = exc
        except Exception as exc:  # a bug: the waiting call reports it as INTERNAL, the server keeps serving
            drive.error = InternalError(
                f"unexpected {type(exc).__name__} while driving run {drive.run_id}: {exc}",
                code=Code.INTERNAL,
            )
        finally:
            drive.finished.set()

    def stop(self, run_id: str, *, reason: str = "stopped", wait_s: float = 60.0) -> bool:
        """Stop this process's driver of the run (its running units are killed; the run stays active and
        resumable). False when this process has no live driver of it."""
        drive = self.get(run_id)
        if drive is None or not drive.alive:
            return False
        drive.cancel.trip(reason)
        drive.finished.wait(wait_s)
        return True

    def shutdown(self, *, reason: str = "session_ended", wait_s: float = 60.0) -> None:
        """Stop every driver and wait for each to journal its aborted units and release its lease."""
        with self._lock:
            self._closed = True
            drives = [d for d in self._drives.values() if d.alive]
        for d in drives:
            d.cancel.trip(reason)
        deadline = time.monotonic() + wait_s
        for d in drives:
            d.finished.wait(max(0.0, deadline - time.monotonic()))


def snapshot(drive: Drive, opened: api.OpenedRun) -> RunResult:
    """The answer for a call whose bound came before the driver finished: the run as the journal has it now,
    with `driving` set and the per-step counts so far."""
    view = api.run_status(drive.run_id)
    return RunResult(
        run=view, started=opened.started, warnings=list(drive.warnings), driving=drive.alive, progress=drive.progress()
    )


def final(drive: Drive, opened: api.OpenedRun) -> RunResult:
    """The driver's own result once it finished (its error is raised)."""
    if drive.error is not None:
        raise drive.error
    assert drive.result is not None
    result = drive.result
    result.started = result.started or opened.started
    result.warnings = list(dict.fromkeys(list(opened.warnings) + list(drive.warnings) + list(result.warnings)))
    result.progress = drive.progress()
    result.driving = False
    drive.delivered = True
    return result
