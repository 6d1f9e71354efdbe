"""Group commit: the journal writes of workers that finish together share one transaction.

Every unit of a fan-out costs one journal transaction (its finish and the next insert, see
`akm.engine.local._PendingFinish`), and most of a transaction's cost is its COMMIT (the WAL frames of
the pages it touched; on PostgreSQL a round trip and a WAL flush), not its statements. When
a worker wants to write while another worker's group is being written, it queues its write
instead of waiting for the journal's lock; when that group is done, the first queued writer
runs every write queued meanwhile in one transaction on its own thread (each write's `tx()`
joins it, keeping its own statements, guards and fence checks), so a burst of finishing
workers pays one commit.

The protocol does not change: `submit` returns only after the transaction holding the
caller's write committed, so a unit's row is still committed before it is dispatched, and
a finished result is journaled before its worker moves on. If the shared transaction
fails (one write's guard refused, a lost lease, a journal error), it rolls back whole and
every write of the group raises `Alone`: its worker writes it again in a transaction of
its own, which tells it what its own write did — as if there had been no group.

Alone (width 1), or when nobody else is writing, a write goes straight through: one
uncontended lock more than writing directly.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from akm.store.journal import Journal


class Alone(Exception):
    """The group this write was part of rolled back: write it again on its own."""


class _Write:
    __slots__ = ("fn", "result", "alone", "wake", "batch")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.alone = False
        self.wake: Any = None  # a held lock its writer blocks on while queued; released to wake it
        self.batch: list[_Write] | None = None  # set when its writer is to run the next group


class GroupCommit:
    """One per dispatch pass; shared by its worker threads.

    A queued writer sleeps on a lock of its own and is woken exactly once: when its write
    committed (or rolled back), or to run the next group, which it heads. No broadcast: with
    eight workers a shared condition would wake seven of them for every commit.
    """

    def __init__(self, db: Journal) -> None:
        self.db = db
        self._lock = threading.Lock()
        self._queue: list[_Write] = []
        self._busy = False  # a group is being written (its writer hands over to the next one)
        self.transactions = 0  # transactions run, groups or single writes (writes / transactions: mean group)

    def submit(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` (journal writes through `self.db`) in a committed transaction; its result.

        Raises `Alone` when the shared transaction failed: nothing of `fn` was kept.
        """
        w = _Write(fn)
        with self._lock:
            if self._busy:
                w.wake = threading.Lock()
                w.wake.acquire()
                self._queue.append(w)
            else:
                self._busy = True
                w.batch = [w]
        if w.batch is None:
            w.wake.acquire()  # until done, or handed the next group
        if w.batch is not None:
            self._run(w.batch)
        if w.alone:
            raise Alone()
        return w.result

    def _run(self, batch: list[_Write]) -> None:
        results: list[Any] = []
        ok = False
        try:
            if len(batch) == 1:
                results.append(batch[0].fn())  # its own transaction: an error reaches its caller as it is
            else:
                with self.db.tx():
                    for w in batch:
                        results.append(w.fn())
            ok = True
        except Exception:
            if len(batch) == 1:
                raise
        finally:
            self._finish(batch, results, ok)

    def _finish(self, batch: list[_Write], results: list[Any], ok: bool) -> None:
        """Hand every write of `batch` its outcome, and the queued writes to the next group's writer.

        The group's head is the writer running it (its wake lock, if any, is already released);
        every other write's writer sleeps until woken here.
        """
        for i, w in enumerate(batch):
            if ok:
                w.result = results[i]
            elif len(batch) > 1:
                w.alone = True
        with self._lock:
            self.transactions += 1
            nxt, self._queue = self._queue, []
            if nxt:
                nxt[0].batch = nxt  # busy stays set: the head of the queue writes the next group
            else:
                self._busy = False
        for w in batch[1:]:
            w.wake.release()
        if nxt:
            nxt[0].wake.release()
