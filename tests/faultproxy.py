"""A TCP proxy that breaks connections on demand, between akm and a throwaway PostgreSQL (tests/pgcluster.py).

Why a proxy and not `pg_terminate_backend` alone: a server that ends a session sends a FATAL message and a FIN,
which a client notices at once. The faults that hurt are the ones no message announces: a connection that
stalls (a partition, a dead middlebox), one whose server side is gone while the client still believes in it,
and one whose client side is gone while the server still holds its transaction open ("idle in transaction"
for minutes, the run row locked). Each `Link` is one client connection through the proxy, and each can be
made to fail in one of those ways while akm is in the middle of a transaction.

* `stall()` / `resume()`: nothing is forwarded either way (the bytes wait in the kernels' buffers) until
  `resume()`; both sockets stay open, so neither end learns anything;
* `drop()`: both sides are reset (RST), as a crashed middlebox or a NAT that forgot the flow;
* `half_open_server()`: the client side is reset, the server side is kept open and silent: the server's
  backend lives on, holding whatever its transaction locked (our kernel answers its keepalives);
* `half_open_client()`: the server side is closed (the backend ends and its locks go), the client side is
  kept open and silent: the client waits for an answer that never comes.

A link is told apart from others by the port its upstream socket uses (`server_port`), which the server shows
as `client_port` in `pg_stat_activity`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Iterator


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN (SO_LINGER 0)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class Link:
    """One proxied connection: a client socket, an upstream socket, and how bytes move between them now."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.server_port = server.getsockname()[1]
        self.state = "pass"  # pass | stall | half_open_server | half_open_client | closed
        # Round trips: the client's sends that follow an answer of the server (or open the link), however many
        # messages or packets each carries; `tests/test_pg_wire.py` counts a statement's with it.
        self.exchanges = 0
        self._last_from_client = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._pump, name=f"faultproxy-{self.server_port}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def open(self) -> bool:
        return self.state != "closed"

    def _set(self, state: str) -> None:
        with self._cond:
            self.state = state
            self._cond.notify_all()

    def stall(self) -> None:
        self._set("stall")

    def resume(self) -> None:
        if self.state == "stall":
            self._set("pass")

    def drop(self) -> None:
        self._set("closed")
        _reset(self.client)
        _reset(self.server)

    def half_open_server(self) -> None:
        """The client is reset; the server keeps a connection nobody reads or writes (until `close`)."""
        self._set("half_open_server")
        _reset(self.client)

    def half_open_client(self) -> None:
        """The server side is closed; the client keeps a connection nobody answers (until `close`)."""
        self._set("half_open_client")
        with contextlib.suppress(OSError):
            self.server.close()

    def close(self) -> None:
        """End whatever is left of the link (a half-open side included)."""
        self._set("closed")
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.close()

    def _pump(self) -> None:
        pairs = {self.client: self.server, self.server: self.client}
        try:
            while True:
                with self._cond:
                    while self.state == "stall":
                        self._cond.wait()
                    if self.state != "pass":
                        return
                try:
                    readable, _, _ = select.select(list(pairs), [], [], 0.05)
                except (OSError, ValueError):
                    break
                for src in readable:
                    if self.state != "pass":
                        break
                    try:
                        data = src.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        raise EOFError
                    from_client = src is self.client
                    if from_client and not self._last_from_client:
                        self.exchanges += 1
                    self._last_from_client = from_client
                    try:
                        pairs[src].sendall(data)
                    except OSError:
                        raise EOFError from None
        except EOFError:
            pass
        if self.state == "pass":
            self.close()


class FaultProxy:
    """Listens on 127.0.0.1 (a free port) and forwards each connection to `upstream` as a `Link`."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._links: list[Link] = []
        self._lock = threading.Lock()
        self._closed = False
        self.refusing = False  # while set, new connections are reset at once (the server "unreachable")
        self._thread = threading.Thread(target=self._accept, name="faultproxy-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            link = Link(self, client, server)
            with self._lock:
                self._links.append(link)
            link.start()

    def links(self) -> list[Link]:
        """The links still open (in the order they were made)."""
        with self._lock:
            self._links = [x for x in self._links if x.open]
            return list(self._links)

    def link_of(self, server_port: int) -> Link | None:
        return next((x for x in self.links() if x.server_port == server_port), None)

    def url(self, base_url: str) -> str:
        """`base_url` (a cluster URL) with its host and port replaced by the proxy's."""
        head, rest = base_url.split("@", 1)
        tail = rest.split("/", 1)[1]
        return f"{head}@127.0.0.1:{self.port}/{tail}"

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for link in self.links():
            link.close()


@contextlib.contextmanager
def fault_proxy(upstream_host: str, upstream_port: int) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream_host, upstream_port)
    try:
        yield proxy
    finally:
        proxy.close()
