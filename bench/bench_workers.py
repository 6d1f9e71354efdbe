"""One fan-out spread over `akm worker` processes across a network, against the single-host SQLite run (issues 19, 40).

Every contender is a set of separate `akm` processes, each with its own HOME and `AKM_HOST_ID` (as if each were a
host of its own), reaching a throwaway PostgreSQL (tests/pgcluster.py, or `--url`) through a TCP relay that adds
a round-trip time (bench/relay.py, one listening port per process):

  * baseline: `workflow run` on the SQLite journal, units run by the driver itself at width W (`--width 2`, what
    one 2-core host runs at once), no network;
  * `driver`: the same `workflow run`, on PostgreSQL through the relay;
  * 1, 2, 4: `workflow run --workers` (the coordinator, step width 64) and that many `akm worker --concurrency W`.

For each RTT (`--rtt-ms 0,2,10,50`) and round, every contender runs once, in an order that rotates every round,
and each is printed as units/s and as a ratio to the baseline run in the same round. A run's time is its span
in its own journal (the run's `created_at` to its `completed_at`): what the processes spend starting Python is
left out on both sides. Also printed, from the server's `pg_stat_statements` (reset before each run), the
statements per unit of everything the processes sent (BEGIN, COMMIT, SET and LISTEN included); and from the
relay, the round trips per unit of the coordinator and of all workers together. The relay's own cost is measured
once: a `SELECT 1` loop direct and through the relay at 0 ms; and each RTT as the relay really delivers it.

`--baseline-tree DIR` runs each PostgreSQL setup a second time with the akm of another checkout (say, main
before a change: `git archive main | tar -x -C DIR`), in the same rounds, so a before and an after meet the
same load and the same SQLite baseline.

The workers run on this one machine: past its cores the ratio says what the queue costs, not what more hosts
would give; with units that wait (an agent, a model) rather than compute, it scales as the hosts do.

Usage: python bench/bench_workers.py [--rtt-ms 0,2,10,50] [--units 200] [--sleep 0.05] [--width 2] [--rounds 3]
                                     [--setups driver,1,2,4] [--url URL] [--verbose]
                                     [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import fan_workflow, server  # noqa: E402 - after the path it is found on

COORDINATOR_WIDTH = 64  # the step's concurrency with workers: units in flight across all of them
OWN_QUERIES = ("pg_stat_statements", "pg_stat_activity", "pg_database")  # the bench's, not akm's


@dataclass
class Outcome:
    """One contender's run: units/s, and for PostgreSQL what it cost on the wire."""

    rate: float
    statements: float | None = None  # per unit, all processes (pg_stat_statements)
    rt_coordinator: float | None = None  # round trips per unit, the coordinator (or the one driver)
    rt_workers: float | None = None  # round trips per unit, all workers together
    top: list[tuple[float, str]] = field(default_factory=list)  # (calls per unit, statement)


# ---------------------------------------------------------------------------------------------- the relay


class Relay:
    """bench/relay.py as a process: `ports` listening ports forwarding to `upstream` with `rtt_ms` added."""

    def __init__(self, upstream: tuple[str, int], rtt_ms: float, ports: int) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "relay.py"),
                "--upstream",
                f"{upstream[0]}:{upstream[1]}",
                "--rtt-ms",
                str(rtt_ms),
                "--ports",
                str(ports),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.ports: list[int] = json.loads(self.proc.stdout.readline())["ports"]

    def stop(self) -> dict[int, dict[str, int]]:
        """Stop it; what crossed each port."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        stats = json.loads(out.strip().splitlines()[-1])["stats"]
        return {int(p): v for p, v in stats.items()}


def via(url: str, port: int, schema: str | None = None) -> str:
    """`url` pointed at the relay's `port` on this machine (and at `schema`)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    netloc_s = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
    query = parts.query
    if schema is not None:
        query = (query + "&" if query else "") + f"schema={schema}"
    return urlunsplit((parts.scheme, netloc_s, parts.path, query, ""))


def upstream_of(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5432


def ping_ms(url: str, n: int = 40) -> float:
    """Median `SELECT 1` round trip (ms) on one connection to `url`."""
    from akm.store.postgres.connect import connect, parse_url

    con = connect(parse_url(url))
    try:
        con.run("SELECT 1")
        took = []
        for _ in range(n):
            began = time.perf_counter()
            con.run("SELECT 1")
            took.append((time.perf_counter() - began) * 1000)
        return statistics.median(took)
    finally:
        con.close()


def relayed_ping_ms(base_url: str, rtt_ms: float) -> float:
    relay = Relay(upstream_of(base_url), rtt_ms, 1)
    try:
        return ping_ms(via(base_url, relay.ports[0]))
    finally:
        relay.stop()


# ---------------------------------------------------------------------------------------------- processes


def akm_env(home: Path, host: str, url: str | None, tree: Path = ROOT) -> dict[str, str]:
    """The environment of one "host": its own HOME (config, data dir) and host id, the journal it shares, and the
    checkout whose akm it runs (`tree`: this one, or `--baseline-tree`)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_")}
    env.update(HOME=str(home), AKM_HOST_ID=host, AKM_DATA_DIR=str(home / "data"), PYTHONPATH=str(tree))
    env.pop("XDG_CONFIG_HOME", None)
    env.pop("XDG_DATA_HOME", None)
    if url is not None:
        env["AKM_JOURNAL_URL"] = url
    return env


def run_workflow(work: Path, env: dict[str, str], units: int, *, workers: bool) -> float:
    """`akm workflow run fan.md` in its own process (it must complete); the run's span in its journal (s)."""
    argv = [sys.executable, "-m", "akm", "workflow", "run", "fan.md", "--xs", json.dumps(list(range(units)))]
    argv += ["--format", "json", "--quiet"] + (["--workers"] if workers else [])
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"workflow run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    run = json.loads(proc.stdout)["run"]
    assert run["status"] == "completed", run
    from akm.store.clock import parse_iso

    return (parse_iso(run["completedAt"]) - parse_iso(run["createdAt"])).total_seconds()


@contextlib.contextmanager
def workers_up(work: Path, homes: Path, urls: list[str], width: int, admin: Any, tree: Path) -> Iterator[None]:
    """`akm worker` processes, one per URL (each a host of its own), until the block ends (then SIGTERM)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "akm", "worker", "--concurrency", str(width), "--poll", "200ms", "--quiet"],
            cwd=work,
            env=akm_env(homes / f"worker-{i}", f"bench-worker-{i}", url, tree),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, url in enumerate(urls)
    ]
    try:
        deadline = time.monotonic() + 120
        while True:  # every worker listens for queued units: it is up
            (n,) = admin.run("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'akm-listen'")[0]
            if n >= len(procs):
                break
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                err = dead[0].stderr.read() if dead and dead[0].stderr else ""
                raise SystemExit(f"a worker did not come up: {err[-2000:]}")
            time.sleep(0.05)
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def statements(admin: Any) -> list[tuple[int, str]]:
    """(calls, statement) of every statement the server ran since the last reset, but the bench's own."""
    rows = admin.run(
        "SELECT s.calls, s.query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
        "WHERE d.datname = current_database() ORDER BY s.calls DESC"
    )
    return [(int(c), q) for c, q in rows if not any(own in q for own in OWN_QUERIES)]


# ---------------------------------------------------------------------------------------------- contenders


def native_sqlite(root: Path, units: int) -> Outcome:
    home = root / "homes" / f"sqlite-{secrets.token_hex(3)}"
    env = akm_env(home, "bench-sqlite", None)
    return Outcome(units / run_workflow(root / "native", env, units, workers=False))


def on_postgres(
    root: Path, units: int, n_workers: int, width: int, rtt_ms: float, base_url: str, admin: Any, tree: Path = ROOT
) -> Outcome:
    """The one driver (`n_workers` 0) or a coordinator and `n_workers` workers, through a relay adding `rtt_ms`."""
    schema = "bench_" + secrets.token_hex(4)
    homes = root / "homes" / schema
    relay = Relay(upstream_of(base_url), rtt_ms, 1 + n_workers)
    urls = [via(base_url, port, schema) for port in relay.ports]
    stats: dict[int, dict[str, int]] = {}
    from akm.store.postgres.db import open_pg

    sep = "&" if "?" in base_url else "?"
    open_pg(f"{base_url}{sep}schema={schema}").close()  # a journal in use is migrated already: not counted
    try:
        up = workers_up(root / "work", homes, urls[1:], width, admin, tree) if n_workers else contextlib.nullcontext()
        with up:
            admin.run("SELECT pg_stat_statements_reset()")
            work = root / ("work" if n_workers else "native")
            env = akm_env(homes / "coordinator", "bench-coordinator", urls[0], tree)
            span = run_workflow(work, env, units, workers=bool(n_workers))
            seen = statements(admin)
    finally:
        stats = relay.stop()
        with contextlib.suppress(Exception):
            admin.run(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    total = sum(c for c, _ in seen)
    coordinator = stats[relay.ports[0]]["round_trips"]
    workers = sum(stats[p]["round_trips"] for p in relay.ports[1:])
    return Outcome(
        units / span,
        statements=total / units,
        rt_coordinator=coordinator / units,
        rt_workers=workers / units if n_workers else None,
        top=[(c / units, " ".join(q.split())[:110]) for c, q in seen[:12]],
    )


# ---------------------------------------------------------------------------------------------- report


def shown(values: list[float], fmt: str = ".2f") -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:{fmt}}"
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


BEFORE = " (before)"  # a setup run with the akm of `--baseline-tree`


def label(setup: str) -> str:
    base, tag = (setup[: -len(BEFORE)], BEFORE) if setup.endswith(BEFORE) else (setup, "")
    return ("PG, one driver" if base == "driver" else f"{base} worker{'s' if base != '1' else ''}") + tag


def workers_of(setup: str) -> int:
    base = setup.removesuffix(BEFORE)
    return 0 if base == "driver" else int(base)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtt-ms", default="0,2,10,50", help="round-trip times to add, comma-separated (ms)")
    ap.add_argument("--units", type=int, default=200)
    ap.add_argument("--sleep", type=float, default=0.05)
    ap.add_argument("--width", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--setups", default="driver,1,2,4", help="driver and/or worker counts")
    ap.add_argument("--url", help="a PostgreSQL server with pg_stat_statements loaded (default: a throwaway one)")
    ap.add_argument("--verbose", action="store_true", help="the statements each run sent most, per unit")
    ap.add_argument(
        "--baseline-tree",
        type=Path,
        help="another akm checkout (say, main before a change): each PG setup also runs with its akm, in the same rounds",
    )
    args = ap.parse_args()
    rtts = [float(x) for x in args.rtt_ms.split(",") if x.strip()]
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    if args.baseline_tree is not None:
        setups = [x for s in setups for x in (s + BEFORE, s)]
    contenders = ["sqlite", *setups]
    for tree in {ROOT, *([args.baseline_tree.resolve()] if args.baseline_tree is not None else [])}:
        # bytecode as an installed akm (or the zipapp) has it, whatever PYTHONDONTWRITEBYTECODE says: otherwise
        # every process compiles each module it imports, some of it inside the runs' spans
        compileall.compile_dir(str(tree / "akm"), quiet=1)
    results: dict[tuple[float, str], list[Outcome]] = {}
    ratios: dict[tuple[float, str], list[float]] = {}
    from akm.store.postgres.connect import connect, parse_url

    settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track_utility": "on"}
    with tempfile.TemporaryDirectory() as tmp, server(args.url, settings) as base_url:
        root = Path(tmp)
        for name, width in (("work", COORDINATOR_WIDTH), ("native", args.width)):
            (root / name).mkdir()
            (root / name / "fan.md").write_text(
                fan_workflow(width=width, command=f'["sleep", "{args.sleep}"]', does="Sleep once per item."),
                encoding="utf-8",
            )
        admin = connect(parse_url(base_url))
        admin.run("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        direct = ping_ms(base_url)
        relayed = {rtt: relayed_ping_ms(base_url, rtt) for rtt in sorted({0.0, *rtts})}
        print(
            f"relay cost: a SELECT 1 round trip takes {direct * 1000:.0f} µs direct, {relayed[0.0] * 1000:.0f} µs "
            f"through the relay at 0 ms; measured RTT through the relay: "
            + ", ".join(f"{rtt:g} ms → {relayed[rtt]:.1f} ms" for rtt in rtts),
            flush=True,
        )
        for r in range(args.rounds):
            for rtt in rtts:
                k = (r + rtts.index(rtt)) % len(contenders)
                order = contenders[k:] + contenders[:k]
                this: dict[str, Outcome] = {}
                for s in order:
                    if s == "sqlite":
                        this[s] = native_sqlite(root, args.units)
                    else:
                        tree = args.baseline_tree.resolve() if s.endswith(BEFORE) else ROOT
                        n = workers_of(s)
                        this[s] = on_postgres(root, args.units, n, args.width, rtt, base_url, admin, tree)
                    results.setdefault((rtt, s), []).append(this[s])
                for s in setups:
                    ratios.setdefault((rtt, s), []).append(this[s].rate / this["sqlite"].rate)
                print(
                    f"round {r + 1}, RTT {rtt:g} ms: "
                    + ", ".join(
                        f"{'SQLite' if s == 'sqlite' else label(s)} {this[s].rate:.1f}/s"
                        + (f" ({this[s].statements:.1f} st/u)" if this[s].statements is not None else "")
                        for s in contenders
                    ),
                    flush=True,
                )
                if args.verbose:
                    for s in setups:
                        print(f"  {label(s)}: top statements (calls per unit)")
                        for per, q in this[s].top:
                            print(f"    {per:6.2f}  {q}")
        admin.close()
    print(
        f"\n{args.units} units of `sleep {args.sleep}`, width {args.width} per host (coordinator {COORDINATOR_WIDTH}), "
        f"{args.rounds} rounds; median (range). Ratio: units/s over the single-host SQLite run of the same round."
    )
    print("| RTT | SQLite units/s | " + " | ".join(label(s) for s in setups) + " |")
    print("|---|---|" + "---|" * len(setups))
    for rtt in rtts:
        cells = []
        for s in setups:
            rate = [o.rate for o in results[(rtt, s)]]
            cells.append(f"{shown(ratios[(rtt, s)])} ({statistics.median(rate):.1f}/s)")
        base = [o.rate for o in results[(rtt, "sqlite")]]
        print(f"| {rtt:g} ms | {shown(base, '.1f')} | " + " | ".join(cells) + " |")
    print("\nStatements per unit (pg_stat_statements, all processes); round trips per unit, coordinator + workers:")
    print("| RTT | " + " | ".join(label(s) for s in setups) + " |")
    print("|---|" + "---|" * len(setups))
    for rtt in rtts:
        cells = []
        for s in setups:
            outs = results[(rtt, s)]
            st = shown([o.statements for o in outs if o.statements is not None], ".1f")
            rc = statistics.median([o.rt_coordinator for o in outs if o.rt_coordinator is not None])
            rw = [o.rt_workers for o in outs if o.rt_workers is not None]
            trips = f"{rc:.1f}" + (f" + {statistics.median(rw):.1f}" if rw else "")
            cells.append(f"{st} st; {trips} RT")
        print(f"| {rtt:g} ms | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
