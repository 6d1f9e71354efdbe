"""A lease holder's liveness by a session advisory lock (akm/store/postgres/liveness.py; postgres.md §2.4).

Against real servers: the session's throwaway cluster for the plain cases, and a cluster of this module's own
for the cases that restart or crash the server (so no other test loses its connections). The holder that is
killed is a real process holding a real lock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from akm.store.postgres import liveness
from akm.store.postgres.connect import connect, parse_url
from tests.helpers import pg_bindir, wait_until

ROOT = Path(__file__).resolve().parent.parent

HOLDER_SCRIPT = """
import json, os, sys, time
from akm.store.postgres.connect import parse_url
from akm.store.postgres.liveness import HolderLock
lock = HolderLock.acquire(parse_url(os.environ["LIVENESS_URL"]), sys.argv[1])
print(json.dumps({"key": lock.key, "marker": lock.marker}), flush=True)
while True:
    time.sleep(60)
"""


@pytest.fixture(scope="module")
def own_cluster():
    """A cluster only this module uses, because its tests restart and crash it."""
    from tests import pgcluster

    with pgcluster.cluster(pg_bindir()) as c:
        yield c


def _target(cluster):
    return parse_url(cluster.url())


def _connect_when_up(cluster, not_marker: str | None = None):
    """A connection once the server accepts them again (after a restart or a crash reset), and, with
    `not_marker`, once it is a new incarnation (a crash is noticed by the postmaster asynchronously)."""
    last: list[Exception] = []

    def attempt():
        try:
            con = connect(_target(cluster), timeout=10)
            if not_marker is None or liveness.server_marker(con) != not_marker:
                return con
            con.close()
        except Exception as exc:  # the server is still recovering
            last[:] = [exc]
        return None

    return wait_until(attempt, what=f"the server to accept connections again ({last})", every=0.2)


def _holder_process(cluster, holder: str) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "LIVENESS_URL": cluster.url(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, holder], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    line = proc.stdout.readline()  # blocks until the lock is held (or the process died)
    assert line, f"holder process exited with {proc.wait()}"
    return proc, json.loads(line)


def test_keys_and_markers(pg_cluster):
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    assert liveness.session_key(a) == liveness.session_key(a) != liveness.session_key(b)
    assert all(0 <= liveness.session_key(str(uuid.uuid4())) < 2**31 for _ in range(200))
    con = connect(_target(pg_cluster))
    try:
        marker = liveness.server_marker(con)
        assert marker == liveness.server_marker(con) and "/" in marker
        con.run("SET TimeZone = 'Asia/Kathmandu'")  # another host's session settings give the same text
        assert liveness.server_marker(con) == marker
        # nothing recorded: never dead
        assert not liveness.holder_is_dead(con, None, marker)
        assert not liveness.holder_is_dead(con, liveness.session_key(a), None)
    finally:
        con.close()


def test_a_live_holder_is_not_dead_and_a_released_one_is(pg_cluster):
    holder = str(uuid.uuid4())
    peer = connect(_target(pg_cluster))
    try:
        with liveness.HolderLock.acquire(_target(pg_cluster), holder) as lock:
            assert lock.marker == liveness.server_marker(peer)
            assert not liveness.holder_is_dead(peer, lock.key, lock.marker)
            assert lock.refresh() == lock.marker  # still held: the same marker to record
            # the probe left nothing behind: the holder still holds its lock, checks stay "alive"
            assert not liveness.holder_is_dead(peer, lock.key, lock.marker)
            # the expression form, as the lease takeover statement would embed it
            sql = f"SELECT {liveness.dead_sql('CAST(:k AS int)', 'CAST(:m AS text)')}"
            assert peer.run(sql, k=lock.key, m=lock.marker) == [[False]]
            key, marker = lock.key, lock.marker
        assert liveness.holder_is_dead(peer, key, marker)
        # a stale or foreign marker never lets the fast path through
        assert not liveness.holder_is_dead(peer, key, "2000-01-01T00:00:00.000000Z/-")
    finally:
        peer.close()


def test_a_colliding_live_key_only_makes_a_holder_look_alive(pg_cluster):
    first = liveness.HolderLock.acquire(_target(pg_cluster), "holder-one")
    try:
        twin = liveness.HolderLock(_target(pg_cluster), "holder-two", wait_s=0.2)
        twin.key = first.key  # force a collision
        twin._connect_and_take(0.2)
        assert twin.marker is None  # no lock of its own: it records NULL, peers wait for its expiry
        assert twin.refresh() is None
        peer = connect(_target(pg_cluster))
        assert not liveness.holder_is_dead(peer, twin.key, liveness.server_marker(peer))
        first.release()  # the key is free now: the twin's next refresh takes it on its live session
        marker = twin.refresh()
        assert marker == liveness.server_marker(peer)
        assert not liveness.holder_is_dead(peer, twin.key, marker)
        twin.release()
        assert liveness.holder_is_dead(peer, twin.key, marker)
        peer.close()
    finally:
        first.release()


def test_a_sigkilled_holder_process_is_dead_at_once(pg_cluster):
    proc, info = _holder_process(pg_cluster, str(uuid.uuid4()))
    peer = connect(_target(pg_cluster))
    try:
        assert not liveness.holder_is_dead(peer, info["key"], info["marker"])
        killed = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        wait_until(lambda: liveness.holder_is_dead(peer, info["key"], info["marker"]), what="the lock to go")
        print(f"\nliveness: SIGKILL -> seen dead after {time.monotonic() - killed:.3f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        peer.close()


def test_a_dropped_liveness_connection_is_dead_and_refresh_takes_the_lock_again(pg_cluster):
    peer = connect(_target(pg_cluster))
    lock = liveness.HolderLock.acquire(_target(pg_cluster), str(uuid.uuid4()))
    try:
        pid = lock._con.run("SELECT pg_backend_pid()")[0][0]
        assert peer.run("SELECT pg_terminate_backend(:p)", p=pid) == [[True]]
        wait_until(lambda: liveness.holder_is_dead(peer, lock.key, lock.marker), what="the dropped session's lock")
        # the holder notices before its next renewal and takes the lock on a new connection first
        marker = lock.refresh()
        assert marker == liveness.server_marker(peer)
        assert lock._con.run("SELECT pg_backend_pid()")[0][0] != pid
        assert not liveness.holder_is_dead(peer, lock.key, marker)
    finally:
        lock.release()
        peer.close()


def test_after_a_restart_the_fast_path_stays_off(own_cluster):
    from tests import pgcluster

    proc, info = _holder_process(own_cluster, str(uuid.uuid4()))
    try:
        pgcluster.restart(own_cluster)  # every session lock is gone now
        peer = _connect_when_up(own_cluster)
        assert liveness.server_marker(peer) != info["marker"]
        assert peer.run("SELECT pg_try_advisory_xact_lock(:ns, :k)", ns=liveness.NAMESPACE, k=info["key"]) == [[True]]
        assert not liveness.holder_is_dead(peer, info["key"], info["marker"])  # free lock, but not trusted
        # a holder that comes back takes its lock first, then records the new marker: the fast path is on again
        lock = liveness.HolderLock.acquire(_target(own_cluster), "returning-holder")
        assert lock.marker == liveness.server_marker(peer)
        recorded = lock.marker
        assert not liveness.holder_is_dead(peer, lock.key, recorded)
        lock.release()
        assert liveness.holder_is_dead(peer, lock.key, recorded)
        peer.close()
    finally:
        proc.kill()
        proc.wait()


def test_after_a_backend_crash_the_fast_path_stays_off(own_cluster):
    """A crashed backend makes the postmaster reset shared memory: every lock goes, its start time stays.

    This is why the marker is more than `pg_postmaster_start_time()` (the guard postgres.md §2.4 proposes).
    """
    holder = liveness.HolderLock.acquire(_target(own_cluster), str(uuid.uuid4()))
    peer = _connect_when_up(own_cluster)
    start = peer.run("SELECT pg_postmaster_start_time()")[0][0]
    marker = holder.marker
    victim = connect(_target(own_cluster))
    try:
        os.kill(victim.run("SELECT pg_backend_pid()")[0][0], signal.SIGKILL)
    except PermissionError:
        pytest.skip("cannot signal the server's processes as this user")
    for con in (victim, peer):
        try:
            con.close()
        except Exception:  # reset by the crash
            pass
    peer = _connect_when_up(own_cluster, not_marker=marker)
    try:
        assert peer.run("SELECT pg_postmaster_start_time()")[0][0] == start  # same postmaster...
        assert peer.run("SELECT pg_try_advisory_xact_lock(:ns, :k)", ns=liveness.NAMESPACE, k=holder.key) == [[True]]
        assert liveness.server_marker(peer) != marker  # ...but a new incarnation
        assert not liveness.holder_is_dead(peer, holder.key, marker)
        new_marker = holder.refresh()  # the holder's old session died with the reset: it re-takes its lock
        assert new_marker == liveness.server_marker(peer)
        assert not liveness.holder_is_dead(peer, holder.key, new_marker)
    finally:
        holder.release()
        peer.close()
