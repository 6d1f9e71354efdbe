"""The PostgreSQL journal against the SQLite journal, measured in the same run (issue 18).

Prints, as medians over interleaved rounds (which journal goes first alternates per round):
  1. a U-unit fan-out of `true` at width 2 (`--units 1000`): wall time on each journal and the ratio
     PostgreSQL / SQLite (units per second on each);
  2. a `workflow list` round trip (`api.list_runs`, opening the journal each time as every CLI call
     does): milliseconds on each and the ratio.

PostgreSQL is a throwaway local cluster (tests/pgcluster.py; binaries as the tests find them) unless
`--url postgresql://…` names a server (each round then uses a fresh schema, dropped afterwards). The
machine may be shared: read the ratios, not the absolute times.

Usage: python bench/bench_journal.py [--units 1000] [--rounds 3] [--lists 20] [--url URL]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import fan_workflow, interleaved, server, spread  # noqa: E402 - after the path it is found on


@contextlib.contextmanager
def journal(kind: str, base_url: str, tmp: Path) -> Iterator[None]:
    """A fresh journal of this kind for one round (env as the engine reads it)."""
    data = tmp / f"data-{secrets.token_hex(4)}"
    os.environ["AKM_DATA_DIR"] = str(data)
    if kind == "sqlite":
        os.environ.pop("AKM_JOURNAL_URL", None)
        yield
        return
    schema = "bench_" + secrets.token_hex(4)
    sep = "&" if "?" in base_url else "?"
    os.environ["AKM_JOURNAL_URL"] = f"{base_url}{sep}schema={schema}"
    try:
        yield
    finally:
        os.environ.pop("AKM_JOURNAL_URL", None)
        from akm.store.postgres.connect import connect, parse_url

        con = connect(parse_url(base_url))
        con.run(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        con.close()


def fan_out(units: int, work: Path) -> float:
    from akm import api

    wf = work / "fan.md"
    wf.write_text(fan_workflow(), encoding="utf-8")
    began = time.perf_counter()
    res = api.run_workflow(str(wf), params={"xs": list(range(units))}, cwd=str(work))
    took = time.perf_counter() - began
    assert res.run.status == "completed", res.run.status
    return took


def list_round_trip(n: int, work: Path) -> float:
    from akm import api

    times = []
    for _ in range(n):
        began = time.perf_counter()
        api.list_runs(cwd=str(work))
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lists", type=int, default=20)
    ap.add_argument("--url", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name, server(args.url) as url:
        tmp = Path(tmp_name)
        work = tmp / "project"
        work.mkdir()
        os.environ["XDG_CONFIG_HOME"] = str(tmp / "config")
        for kind in ("sqlite", "postgres"):  # warm-up: imports, first connection
            with journal(kind, url, tmp):
                fan_out(20, work)

        def one_round(kind: str) -> tuple[float, float]:
            with journal(kind, url, tmp):
                return fan_out(args.units, work), list_round_trip(args.lists, work)

        # Which journal goes first alternates per round (bench._common), so a drift in the load hits both alike.
        got = interleaved(args.rounds, {kind: (lambda kind=kind: one_round(kind)) for kind in ("sqlite", "postgres")})
        walls = {kind: [w for w, _ in got[kind]] for kind in got}
        lists = {kind: [lst for _, lst in got[kind]] for kind in got}
        s, p = statistics.median(walls["sqlite"]), statistics.median(walls["postgres"])
        print(f"fan-out of {args.units} units, width 2, {args.rounds} interleaved rounds (medians):")
        print(f"  sqlite   {s:7.2f} s  ({args.units / s:6.0f} units/s)")
        print(f"  postgres {p:7.2f} s  ({args.units / p:6.0f} units/s)")
        ratio = [pw / sw for pw, sw in zip(walls["postgres"], walls["sqlite"], strict=True)]
        print(f"  ratio postgres/sqlite: {spread(ratio)}")
        ls, lp = statistics.median(lists["sqlite"]), statistics.median(lists["postgres"])
        list_ratio = [pl / sl for pl, sl in zip(lists["postgres"], lists["sqlite"], strict=True)]
        print("workflow list round trip (open the journal, list, close):")
        print(f"  sqlite {ls * 1000:.1f} ms, postgres {lp * 1000:.1f} ms, ratio {spread(list_ratio)}")


if __name__ == "__main__":
    main()
