"""LISTEN/NOTIFY wake-ups between a run's coordinator and its workers (spec/journal.md).

A notification is a hint, never the truth: listeners also poll, because notifications sent while a listener
reconnects are lost (and pg8000 keeps only the last hundred). So every failure here is swallowed and retried
later; the journal stays the only source of what to do.

* `Listener`: one dedicated connection LISTENing on a channel; a background thread waits on its socket
  (`select`), reads the messages that arrived itself (the server sends a notification unasked: no round trip
  of ours, issue 40) and sets an event per notification whose payload matches. Over TLS, whose buffer a
  `select` cannot see, a `SELECT 1` makes the driver read what arrived instead. The event is the one the
  caller already waits on, so a wake-up and a timeout look alike to it.
* `Notifier`: sends NOTIFYs from its own autocommit connection, *after* the write they announce committed
  and never inside a unit's transaction (a transaction with a pending NOTIFY takes a global lock at commit,
  which would serialize every commit). Requests arriving while one is sent are coalesced into the next.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
from typing import Any

from akm.store.postgres import wire
from akm.store.postgres.connect import Target, connect

RECONNECT_S = 1.0
KEEPALIVE_S = 5.0


class Listener:
    def __init__(self, target: Target, channel: str, event: threading.Event, payload: str | None = None) -> None:
        self.target = target
        self.channel = channel
        self.event = event
        self.payload = payload
        self._stop = threading.Event()
        # `close` writes a byte here, so the loop's `select` returns at once (a driver stopping waits for it)
        self._interrupt_r, self._interrupt_w = socket.socketpair()
        self._thread = threading.Thread(target=self._loop, name=f"akm-listen-{channel}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            con: Any = None
            try:
                con = connect(self.target, timeout=10.0, role="akm-listen")
                con.run(f"LISTEN {self.channel}")
                sock = con._usock
                quiet = 0.0
                while not self._stop.is_set():
                    ready, _, _ = select.select([sock, self._interrupt_r], [], [], 0.5)
                    if self._stop.is_set():
                        break
                    quiet = 0.0 if ready else quiet + 0.5
                    if sock in ready and not isinstance(sock, ssl.SSLSocket):
                        _read_arrived(con)
                    elif ready or quiet >= KEEPALIVE_S:
                        # the driver reads what arrived (and what TLS or its buffer already held); on a quiet
                        # connection this also finds out, within seconds, that the server is gone
                        con.run("SELECT 1")
                        quiet = 0.0
                    while con.notifications:
                        _pid, _channel, payload = con.notifications.popleft()
                        if self.payload is None or payload == self.payload:
                            self.event.set()
            except Exception:
                self._stop.wait(RECONNECT_S)  # lost meanwhile: the caller's polling covers it
            finally:
                if con is not None:
                    with contextlib.suppress(Exception):
                        con.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._interrupt_w.send(b"x")
        self._thread.join(timeout=2)
        for end in (self._interrupt_r, self._interrupt_w):
            end.close()


def _read_arrived(con: Any) -> None:
    """Read the messages the server sent unasked (notifications, notices, parameter changes) into the driver, up
    to what has arrived: a notification lands in `con.notifications` as the driver's own reading puts it."""
    while True:
        head = con._sock.read(5)
        if len(head) < 5:
            raise ConnectionError("the journal closed the listening connection")
        code, size = head[:1], struct.unpack("!i", head[1:])[0] - 4
        body = con._sock.read(size) if size > 0 else b""
        if len(body) < size:
            raise ConnectionError("the journal closed the listening connection")
        if code == b"A":
            con.handle_NOTIFICATION_RESPONSE(body, None)
        elif code == b"S":
            con.handle_PARAMETER_STATUS(body, None)
        elif code != b"N":  # an error (the server shutting down, say) or anything unasked: connect again
            raise ConnectionError(f"the listening connection got an unexpected message {code!r}")
        if not _buffered(con):
            return


def _buffered(con: Any) -> bool:
    """Whether more of what the server sent is at hand: in the driver's read buffer (which a `select` on the
    socket does not see) or the socket's. Peeks without blocking."""
    sock = con._usock
    timeout = sock.gettimeout()
    sock.settimeout(0.0)
    try:
        return bool(con._sock.peek(1))
    finally:
        sock.settimeout(timeout)


class Notifier:
    """Sends `pg_notify(channel, payload)` for writes that did not notify in their own statement, from a thread of
    its own so the writer does not wait for it. Its connection and thread start with the first notification:
    akm's one-statement queue writes and finishes notify themselves, so on most runs none comes, and a connection
    opened ahead was a backend started (and a password exchange) for nothing — in a coordinator, in its run's first
    moments."""

    def __init__(self, target: Target, channel: str) -> None:
        self.target = target
        self.channel = channel
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def notify(self, payload: str) -> None:
        with self._lock:
            self._pending.add(payload)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name=f"akm-notify-{self.channel}", daemon=True)
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        con: Any = None
        while not self._stop.is_set():
            with self._lock:
                pending, self._pending = self._pending, set()
            if pending:
                try:
                    if con is None:
                        con = connect(self.target, timeout=10.0, role="akm-notify")
                    for payload in sorted(pending):
                        wire.query(con, "SELECT pg_notify(:c, :p)", c=self.channel, p=payload)
                except Exception:
                    if con is not None:
                        with contextlib.suppress(Exception):
                            con.close()
                    con = None  # dropped: listeners poll anyway
            self._wake.wait(1.0)
            self._wake.clear()
        if con is not None:
            with contextlib.suppress(Exception):
                con.close()

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=2)
