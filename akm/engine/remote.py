"""The coordinator's half of a fan-out spread over workers (phase 2; spec/journal.md "Workers").

A driver started with `--workers` keeps everything it does today — the lease, the work list, retries,
budgets, per-step and per-engine concurrency, fail fast, the one finalize path — and changes one thing: an
attempt is not run on one of its threads but journaled `queued` (`akm.store.queue.queue_unit`, fenced by
its lease) with its dispatch payload, and the thread waits for a worker to finish the row. So every limit
that bounds the driver's threads bounds the units in flight across all workers, and every decision is still
taken from the journal by the lease holder alone.

The payload (`dispatch_payload`) holds what the coordinator computed for the attempt and a worker cannot:
the prompt or the exec context (run id, params, inputs, item), the timeout, the engine and model, and the
project's identity and commit, which a worker checks before it claims anything. Never a secret: env
bindings and credentials are resolved by the worker, from its own environment and env files.

One `Waiter` per pass polls the journal for finished rows (one indexed read per interval for all waiting
threads, however wide the fan-out) and sweeps lapsed worker claims back into the queue, so a fan-out whose
workers all died goes on as soon as any worker starts again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from akm.dispatch.base import UnitRequest
from akm.store import queue as queue_store
from akm.store.journal import Journal

PAYLOAD_VERSION = 1
POLL_S = 0.25  # between reads of the finished rows; a worker's NOTIFY (PostgreSQL) wakes the read sooner
SWEEP_EVERY_S = 2.0
UNCLAIMED_WARN_S = 30.0  # queued units no worker touched for this long: say so (once, until work moves again)


def dispatch_payload(request: UnitRequest, *, scope_key: str, commit: str | None, trace: Any = None) -> str:
    """The `dispatch_json` of a queued attempt: the request's computed parts, without cwd or secrets.
    `trace`: the run's trace when tracing is on — the worker gives the unit TRACEPARENT for its attempt."""
    body: dict[str, Any] = {
        "v": PAYLOAD_VERSION,
        "unitId": request.unit_id,
        "kind": request.kind,
        "scope": scope_key,
        "commit": commit,
    }
    if trace is not None:
        body["trace"] = {"traceId": trace.trace_id, "parentSpanId": trace.parent_span_id}
    if request.kind == "exec":
        body["execContext"] = request.exec_context
    else:
        body["prompt"] = request.prompt
        if request.system_prompt is not None:
            body["systemPrompt"] = request.system_prompt
    if request.timeout_ms is not None:
        body["timeoutMs"] = request.timeout_ms
    if request.engine_name is not None:
        body["engine"] = request.engine_name
    if request.model is not None:
        body["model"] = request.model
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


class Waiter:
    """Wait, on many threads at once, for queued attempts of one run to be finished by workers."""

    def __init__(
        self,
        db: Journal,
        run_id: str,
        *,
        poll_s: float = POLL_S,
        on_unclaimed: Callable[[int, float], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        unclaimed_warn_s: float | None = None,
    ) -> None:
        self.db = db
        self.run_id = run_id
        self.poll_s = poll_s
        # Told (the number of units waiting, and for how long nothing moved) when no worker has claimed or
        # finished any of them for `unclaimed_warn_s`: no worker runs, or every one refuses the step.
        self.on_unclaimed = on_unclaimed
        self.unclaimed_warn_s = UNCLAIMED_WARN_S if unclaimed_warn_s is None else unclaimed_warn_s
        self.on_error = on_error  # told of the first journal failure of a series (the loop keeps retrying)
        self._poke = threading.Event()  # set by a worker's notification: read the rows now
        self._listener: Any = None
        self._lock = threading.Lock()
        self._waiting: dict[str, threading.Event] = {}
        self._rows: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def wait(self, attempt: str, cancel: threading.Event) -> dict[str, Any] | None:
        """The attempt's finished row, or None once `cancel` is set first (the row stays queued or claimed)."""
        done = threading.Event()
        with self._lock:
            self._waiting[attempt] = done
            if self._thread is None:
                self._listener = self.db.listener(queue_store.RUN_CHANNEL, self._poke, self.run_id)
                self._thread = threading.Thread(target=self._loop, name="akm-remote-wait", daemon=True)
                self._thread.start()
        try:
            while not done.wait(self.poll_s):
                if cancel.is_set():
                    return None
        finally:
            with self._lock:
                self._waiting.pop(attempt, None)
        with self._lock:
            return self._rows.pop(attempt, None)

    def _loop(self) -> None:
        last_sweep = 0.0
        last_progress = time.monotonic()
        warned = False
        while not self._stop.is_set():
            with self._lock:
                ids = list(self._waiting)
            if not ids:
                last_progress = time.monotonic()
            else:
                try:
                    rows = queue_store.finished_rows(self.db, self.run_id, ids)
                    now = time.monotonic()
                    if rows:
                        last_progress, warned = now, False
                    if now - last_sweep >= SWEEP_EVERY_S:
                        last_sweep = now
                        queue_store.sweep(self.db)
                        if queue_store.claimed_count(self.db, self.run_id):
                            last_progress, warned = now, False
                        elif not warned and now - last_progress >= self.unclaimed_warn_s:
                            warned = True
                            if self.on_unclaimed is not None:
                                self.on_unclaimed(len(ids), self.unclaimed_warn_s)
                except Exception as exc:  # a journal hiccup: try again next interval; waiting threads keep waiting
                    if self._error is None and self.on_error is not None:
                        self.on_error(exc)
                    self._error = exc
                    rows = {}
                else:
                    self._error = None
                with self._lock:
                    for unit_id, row in rows.items():
                        event = self._waiting.get(unit_id)
                        if event is not None and not event.is_set():
                            self._rows[unit_id] = row
                            event.set()
            self._poke.wait(self.poll_s)
            self._poke.clear()

    def close(self) -> None:
        self._stop.set()
        self._poke.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
