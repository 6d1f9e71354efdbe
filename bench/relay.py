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


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, feed: Any) -> None:
    """Copy reader → writer, each chunk `delay` seconds late, in order; close the writer at the end."""
    loop = asyncio.get_running_loop()
    pending: collections.deque[tuple[float, bytes]] = collections.deque()
    more = asyncio.Event()
    ended = False

    async def send() -> None:
        while True:
            while not pending:
                if ended:
                    return
                more.clear()
                await more.wait()
            due, data = pending.popleft()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            feed(data)
            if delay <= 0 and not pending:
                writer.write(data)
                await writer.drain()
            else:
                pending.append((loop.time() + delay, data))
                more.set()
    except (ConnectionError, OSError):
        pass
    finally:
        ended = True
        more.set()
        try:
            await sender
        except (ConnectionError, OSError):
            pass
        writer.close()


def _serve(upstream: tuple[str, int], delay: float, counter: Counter) -> Any:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        counter.connections += 1
        try:
            s_reader, s_writer = await asyncio.open_connection(*upstream)
        except OSError:
            c_writer.close()
            return
        exchanges = Exchanges(counter)
        up = _pipe(c_reader, s_writer, delay, exchanges.up)
        down = _pipe(s_reader, c_writer, delay, exchanges.down)
        await asyncio.gather(up, down, return_exceptions=True)

    return handle


async def _main(upstream: tuple[str, int], rtt_ms: float, ports: int) -> None:
    delay = rtt_ms / 2000.0
    counters: dict[int, Counter] = {}
    servers = []
    for _ in range(ports):
        counter = Counter()
        server = await asyncio.start_server(_serve(upstream, delay, counter), "127.0.0.1", 0)
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
