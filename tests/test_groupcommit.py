"""Group commit: writes queued while a transaction is open share the next one (both journals)."""

from __future__ import annotations

import threading
import time

import pytest

from akm.engine.groupcommit import Alone, GroupCommit
from akm.store import units
from tests.helpers import bare_run


@pytest.fixture()
def db(journal):
    bare_run(journal, step_ids=["fan"])
    return journal


def _insert(db, i):
    return units.insert_unit(db, run_id="r1", unit_id=f"fan.unit:{i}", step_id="fan", node_id="fan.unit")


def _wait_until(cond, what):
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _group_behind_a_blocked_write(db, group, writes):
    """Start a write that blocks until `writes` are all queued behind it; their outcomes."""
    release = threading.Event()
    outcomes: dict[int, object] = {}

    def blocked():
        release.wait(60)
        return _insert(db, 0)

    def run(i, fn):
        try:
            outcomes[i] = group.submit(fn)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            outcomes[i] = exc

    first = threading.Thread(target=run, args=(0, blocked))
    first.start()
    _wait_until(lambda: group._busy, "the first write to start")
    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in writes.items()]
    for t in threads:
        t.start()
    _wait_until(lambda: len(group._queue) == len(writes), "the other writes to queue")
    release.set()
    for t in [first, *threads]:
        t.join(60)
    return outcomes


def test_queued_writes_share_one_transaction_and_get_their_own_results(db):
    group = GroupCommit(db)
    outcomes = _group_behind_a_blocked_write(db, group, {i: (lambda i=i: _insert(db, i)) for i in (1, 2, 3)})
    assert all(isinstance(outcomes[i], str) for i in range(4)), outcomes
    assert {u.unit_id for u in units.get_units(db, "r1")} == {f"fan.unit:{i}" for i in range(4)}
    assert group.transactions == 2  # the first write alone, then ONE for the three queued behind it


def test_a_failing_write_rolls_the_group_back_and_every_writer_retries_alone(db):
    group = GroupCommit(db)

    def refused():
        _insert(db, 9)
        raise ValueError("refused")

    outcomes = _group_behind_a_blocked_write(db, group, {1: lambda: _insert(db, 1), 2: refused})
    assert isinstance(outcomes[0], str)  # the first write ran alone and committed
    assert isinstance(outcomes[1], Alone) and isinstance(outcomes[2], Alone)
    assert {u.unit_id for u in units.get_units(db, "r1")} == {"fan.unit:0"}  # nothing of the group kept


def test_a_write_alone_raises_its_own_error(db):
    group = GroupCommit(db)
    with pytest.raises(ValueError, match="mine"):
        group.submit(lambda: (_ for _ in ()).throw(ValueError("mine")))
    assert group.submit(lambda: _insert(db, 1))


def test_many_writers_each_get_their_own_committed_row(db):
    group = GroupCommit(db)
    got: dict[str, str] = {}

    def worker(k):
        for j in range(50):
            uid = f"fan.unit:{k}-{j}"
            got[uid] = group.submit(
                lambda uid=uid: units.insert_unit(db, run_id="r1", unit_id=uid, step_id="fan", node_id="fan.unit")
            )

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    rows = {u.unit_id: u.started_at for u in units.get_units(db, "r1")}
    assert rows == got and len(rows) == 400
    assert group.transactions <= 400 and not group._busy and not group._queue
