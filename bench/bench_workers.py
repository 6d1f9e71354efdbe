"""One fan-out spread over `akm worker` processes, against the single-host SQLite run (issue 19).

Prints, as medians (and ranges) over interleaved rounds, the units per second of a U-unit fan-out whose
units each sleep S seconds (`--units 200 --sleep 0.05`):
  * baseline: `workflow run` on the SQLite journal, units run by the driver itself at width W (`--width 2`,
    what one 2-core host runs at once);
  * `workflow run --workers` on a PostgreSQL journal with 1, 2 and 4 worker processes, each
    `akm worker --concurrency W`, as if each were a host of its own (own `AKM_HOST_ID`);
and each as a ratio to the baseline measured in the same round. The order of the setups rotates every
round. The workers run on this one machine, so past its cores the ratio says what the queue costs, not what
more hosts would give; with units that wait (an agent, a model) rather than compute, it scales as the hosts do.

PostgreSQL is a throwaway local cluster (tests/pgcluster.py) unless `--url postgresql://…` names a server.

Usage: python bench/bench_workers.py [--units 200] [--sleep 0.05] [--width 2] [--rounds 3] [--url URL]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import server  # noqa: E402 - after the path it is found on

WF = """---
params:
  xs: {{ type: array }}
steps:
  - id: fan
    map:
      over: params.xs
      concurrency: {width}
      unit:
        exec: {{ command: ["sleep", "{sleep}"] }}
---

## fan

Sleep once per item.
"""


@contextlib.contextmanager
def fresh_schema(base_url: str) -> Iterator[str]:
    schema = "bench_" + secrets.token_hex(4)
    sep = "&" if "?" in base_url else "?"
    try:
        yield f"{base_url}{sep}schema={schema}"
    finally:
        from akm.store.postgres.connect import connect, parse_url

        con = connect(parse_url(base_url))
        con.run(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        con.close()


def run_fan(work: Path, units: int, *, workers: bool) -> float:
    from akm import api

    began = time.perf_counter()
    res = api.run_workflow(str(work / "fan.md"), params={"xs": list(range(units))}, cwd=str(work), workers=workers)
    took = time.perf_counter() - began
    assert res.run.status == "completed", res.run.status
    return took


def native_sqlite(work: Path, units: int) -> float:
    os.environ["AKM_DATA_DIR"] = str(work / f"data-{secrets.token_hex(4)}")
    os.environ.pop("AKM_JOURNAL_URL", None)
    return run_fan(work, units, workers=False)


def with_workers(work: Path, units: int, n: int, width: int, base_url: str) -> float:
    with fresh_schema(base_url) as url:
        os.environ["AKM_JOURNAL_URL"] = url
        os.environ["AKM_DATA_DIR"] = str(work / f"data-{secrets.token_hex(4)}")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "akm", "worker", "--concurrency", str(width), "--poll", "200ms", "--quiet"],
                cwd=work,
                env=dict(env, AKM_HOST_ID=f"bench-host-{i}"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(n)
        ]
        try:
            time.sleep(1.0)  # the workers are up (imports, connection) before the clock starts
            return run_fan(work, units, workers=True)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=60)
            os.environ.pop("AKM_JOURNAL_URL", None)


def shown(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=200)
    ap.add_argument("--sleep", type=float, default=0.05)
    ap.add_argument("--width", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--url")
    args = ap.parse_args()
    setups = ["sqlite", 1, 2, 4]
    rates: dict[object, list[float]] = {s: [] for s in setups}
    ratios: dict[object, list[float]] = {s: [] for s in setups if s != "sqlite"}
    with tempfile.TemporaryDirectory() as tmp, server(args.url) as base_url:
        work = Path(tmp)
        (work / "fan.md").write_text(WF.format(width=max(64, args.width), sleep=args.sleep), encoding="utf-8")
        native = work / "native"
        native.mkdir()
        (native / "fan.md").write_text(WF.format(width=args.width, sleep=args.sleep), encoding="utf-8")
        for r in range(args.rounds):
            order = setups[r % len(setups) :] + setups[: r % len(setups)]
            this: dict[object, float] = {}
            for s in order:
                took = (
                    native_sqlite(native, args.units)
                    if s == "sqlite"
                    else with_workers(work, args.units, int(s), args.width, base_url)
                )
                this[s] = args.units / took
                rates[s].append(this[s])
            for s in ratios:
                ratios[s].append(this[s] / this["sqlite"])
            print(f"round {r + 1}: " + ", ".join(f"{s}: {this[s]:.1f}/s" for s in setups), flush=True)
    print(f"\n{args.units} units of `sleep {args.sleep}`, width {args.width} per host, {args.rounds} rounds")
    print(f"  single host, SQLite, native: {shown(rates['sqlite'])} units/s (baseline)")
    for s in ratios:
        print(f"  {s} worker(s), PostgreSQL:    {shown(rates[s])} units/s, ratio {shown(ratios[s])}")


if __name__ == "__main__":
    main()
