"""Calls made from many threads at once, written as one batch: the coordinator's queue writes.

Why: a coordinator with workers waits on one thread per unit in flight, and each thread queues its unit's next
attempt on its own. Across a network every write is a round trip, and a pass of a wide fan-out starts its
units together, so the writes come in bursts: one statement for the burst costs one round trip instead of one
per unit. Batching adds no wait to a write that comes alone: a call made while no batch is being written is
written at once, as a batch of one; calls arriving meanwhile wait for it and go together in the next
batch, which the first of them writes on its own thread (no writer thread, no timer).

The protocol does not change: `submit` returns only when the batch holding its item was written (or failed),
so what a caller did not get back was not written for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("done", "error", "item", "lead", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | None = None
        self.error: BaseException | None = None
        self.lead = False  # this caller writes the next batch
        self.done = threading.Event()  # woken with its result, or to write the next batch


class Coalescer(Generic[T, R]):
    """`submit(item)` from any thread; `write(items)` (one call at a time) answers each item with its result or
    with an exception instance (that item's error); an exception `write` raises is every item's error."""

    def __init__(self, write: Callable[[list[T]], Sequence[R | BaseException]]) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._pending: list[_Slot[T, R]] = []
        self._busy = False
        self.batches = 0  # batches written (items / batches: the mean batch)

    def submit(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item)
        with self._lock:
            self._pending.append(slot)
            if not self._busy:
                self._busy = slot.lead = True
        if not slot.lead:
            slot.done.wait()  # its result, or the lead of the next batch
        if slot.lead:
            self._lead()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _lead(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        try:
            results: Sequence[R | BaseException] = self._write([s.item for s in batch])
            if len(results) != len(batch):
                raise AssertionError(f"a batch of {len(batch)} got {len(results)} results")
        except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets it
            results = [exc] * len(batch)
        for s, r in zip(batch, results, strict=True):
            s.lead = False
            if isinstance(r, BaseException):
                s.error = r
            else:
                s.result = r
        with self._lock:
            self.batches += 1
            nxt = self._pending[0] if self._pending else None
            if nxt is not None:
                nxt.lead = True  # busy stays set: it writes what queued meanwhile
            else:
                self._busy = False
        for s in batch:
            s.done.set()
        if nxt is not None:
            nxt.done.set()
