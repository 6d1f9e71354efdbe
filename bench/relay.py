"""A TCP relay that puts a network between akm processes and the journal server (bench_workers.py, issue 40).

Why a relay and not `tc netem`: it needs no privileges and no kernel module, runs the same on any machine, and
it can tell which process a connection belongs to — each process gets a port of its own — so the bench can
count round trips per side. Each byte waits half the round-trip time on its way in and half on its way back,
in order; a chunk read at t is written at t + RTT/2. At 0 ms nothing waits: what remains is the relay's own
cost, which the bench measures (a `SELECT 1` loop direct and through the relay).

Round trips are counted as the network sees them: a client's send that follows an answer of the server (or
opens the connection) is one, however many protocol messages it carries — akm sends a statement's Parse, Bind,
Execute and Sync, and a transaction's BEGIN before them, in one flight (akm/store/postgres/wire.py). A
connection's start-up and authentication count too.

Run as a process of its own (so its work does not take the GIL of anything measured):

    python bench/relay.py --upstream 127.0.0.1:5432 --rtt-ms 10 --ports 5

It prints one JSON line, {"ports": [...]}, once it listens, and on SIGTERM or SIGINT one more,
{"stats": {port: {"connections", "round_trips", "bytes_up", "bytes_down"}}}, and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import sys
from typing import Any


class Counter:
    """What crossed one listening port: connections, bytes each way, and the client's round trips."""

    def __init__(self) -> None:
        self.connections = 0
        self.round_trips = 0
        self.bytes_up = 0
        self.bytes_down = 0

    def as_json(self) -> dict[str, int]:
        return {
            "connections": self.connections,
            "round_trips": self.round_trips,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
        }


class Exchanges:
    """One connection's round trips: the client's sends that follow an answer of the server (or open it)."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.client_spoke_last = False

    def up(self, data: bytes) -> None:
        self.counter.bytes_up += len(data)
        if not self.client_spoke_last:
            self.counter.round_trips += 1
            self.client_spoke_last = True

    def down(self, data: bytes) -> None:
        self.counter.bytes_down += len(data)
        self.client_spoke_last = False


class _Side(asyncio.Protocol):
    """One socket of a relayed connection: what it reads goes to the other side (`_Link.forward`)."""

    def __init__(self, link: _Link, feed: Any) -> None:
        self.link = link
        self.feed = feed
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.link.attached(self)

    def data_received(self, data: bytes) -> None:
        self.feed(data)
        self.link.forward(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.lost()


class _Link:
    """A client connection and its upstream one. Each chunk read on one side is written to the other `delay`
    seconds later, in order (a queue per direction, one timer for its head); at 0 it is written at once.

    asyncio protocols, not streams: the relay shares the machine with what it measures, and its CPU per round
    trip is a quarter to a third lower so (155 against 205 µs at 0 ms, 233 against 337 µs at 2 ms)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        self.loop = loop
        self.delay = delay
        self.sides: list[_Side] = []
        self.queues: tuple[collections.deque[tuple[float, bytes]], ...] = (collections.deque(), collections.deque())
        self.early: list[bytes] = []  # what the client sent before the upstream connection was made
        self.closing = False

    def attached(self, side: _Side) -> None:
        self.sides.append(side)
        if len(self.sides) == 2:
            for data in self.early:
                self.forward(self.sides[0], data)
            self.early.clear()

    def forward(self, src: _Side, data: bytes) -> None:
        if len(self.sides) < 2:
            self.early.append(data)
            return
        to = 1 if src is self.sides[0] else 0
        queue = self.queues[to]
        if self.delay <= 0 and not queue:
            self._write(to, data)
            return
        queue.append((self.loop.time() + self.delay, data))
        if len(queue) == 1:
            self.loop.call_at(queue[0][0], self._drain, to)

    def _drain(self, to: int) -> None:
        queue = self.queues[to]
        now = self.loop.time()
        while queue and queue[0][0] <= now:
            self._write(to, queue.popleft()[1])
        if queue:
            self.loop.call_at(queue[0][0], self._drain, to)
        elif self.closing:
            self._close()

    def _write(self, to: int, data: bytes) -> None:
        transport = self.sides[to].transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def lost(self) -> None:
        """One side ended: end the other once what was on its way there has been written."""
        self.closing = True
        if not any(self.queues):
            self._close()

    def _close(self) -> None:
        for side in self.sides:
            if side.transport is not None:
                side.transport.close()


def _serve(upstream: tuple[str, int], delay: float, counter: Counter) -> Any:
    loop = asyncio.get_running_loop()

    def accepted() -> _Side:
        counter.connections += 1
        link = _Link(loop, delay)
        exchanges = Exchanges(counter)
        client = _Side(link, exchanges.up)

        async def dial() -> None:
            try:
                await loop.create_connection(lambda: _Side(link, exchanges.down), *upstream)
            except OSError:
                if client.transport is not None:
                    client.transport.close()

        loop.create_task(dial())
        return client

    return accepted


async def _main(upstream: tuple[str, int], rtt_ms: float, ports: int) -> None:
    delay = rtt_ms / 2000.0
    counters: dict[int, Counter] = {}
    servers = []
    for _ in range(ports):
        counter = Counter()
        server = await asyncio.get_running_loop().create_server(_serve(upstream, delay, counter), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        counters[port] = counter
        servers.append(server)
    print(json.dumps({"ports": list(counters)}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(json.dumps({"stats": {str(p): c.as_json() for p, c in counters.items()}}), flush=True)
    os._exit(0)  # the connections still open end with the process (no teardown of every pipe to wait for)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    ap.add_argument("--rtt-ms", type=float, default=0.0, help="round-trip time to add (ms)")
    ap.add_argument("--ports", type=int, default=1, help="listening ports, one per process to tell apart")
    args = ap.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    asyncio.run(_main((host, int(port)), args.rtt_ms, args.ports))


if __name__ == "__main__":
    sys.exit(main())
