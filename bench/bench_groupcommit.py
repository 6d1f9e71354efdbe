"""Group commit (akm/engine/groupcommit.py) against writing directly, measured in the same run.

W worker threads each journal a fan-out's writes as the engine does (the first insert, then per unit
`units.finish_and_insert`) and "run" each unit by sleeping `--unit-ms` (the GIL is free meanwhile, as
while a child runs). Prints, per width, medians over interleaved rounds of the wall and CPU per unit
with the group commit as ratios to writing directly, and the transactions it ran per unit.
The journal is all that is measured: no process is spawned.

Usage: python bench/bench_groupcommit.py [--units 2000] [--rounds 5] [--widths 2,4,8] [--unit-ms 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _row(i: int) -> dict[str, Any]:
    return dict(
        run_id="r1", unit_id=f"fan.unit:{i:012x}", step_id="fan", node_id="fan.unit", runner="exec", input_hash="a" * 64
    )


def fan_out(units: int, width: int, grouped: bool, unit_s: float) -> tuple[float, float, int]:
    """(wall s, CPU s, transactions) of `units` journaled units on `width` workers."""
    from akm.engine.groupcommit import GroupCommit
    from akm.store import open_db, runs
    from akm.store import units as store

    with tempfile.TemporaryDirectory() as tmp:
        db = open_db(Path(tmp) / "journal.sqlite3")
        runs.create_run(
            db,
            run_id="r1",
            workflow_ref="w",
            workflow_path=None,
            title="t",
            scope_key="s",
            params={},
            plan_json="{}",
            plan_hash="0" * 64,
            hash_version=1,
            step_ids=["fan"],
        )
        group = GroupCommit(db)
        items = iter(range(units))
        claim = threading.Lock()

        def write(fn: Any) -> Any:
            return group.submit(fn) if grouped else fn()

        def worker() -> None:
            prev: tuple[str, str] | None = None
            while True:
                with claim:
                    i = next(items, None)
                if i is None:
                    return
                row = _row(i)
                if prev is None:
                    started = write(lambda: store.insert_unit(db, **row))  # noqa: B023 - called at once
                else:
                    f = store.UnitFinish("r1", prev[0], prev[1], "completed", '{"ok":true}', step_id="fan")
                    started = write(lambda: store.finish_and_insert(db, f, **row)[1])  # noqa: B023
                prev = (row["unit_id"], started)
                time.sleep(unit_s)

        with db.bulk_writes():
            wall, cpu = time.perf_counter(), time.process_time()
            threads = [threading.Thread(target=worker) for _ in range(width)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        db.close()
    return wall, cpu, group.transactions if grouped else units


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--widths", default="2,4,8")
    ap.add_argument("--unit-ms", type=float, default=0.5)
    args = ap.parse_args()
    fan_out(50, 2, True, 0.0)  # imports and caches
    med = statistics.median
    for width in (int(w) for w in args.widths.split(",")):
        walls, cpus, txs = [], [], []
        for r in range(args.rounds):
            order = (True, False) if r % 2 else (False, True)
            got = {g: fan_out(args.units, width, g, args.unit_ms / 1000) for g in order}
            walls.append(got[True][0] / got[False][0])
            cpus.append(got[True][1] / got[False][1])
            txs.append(got[True][2] / args.units)
        print(
            f"width {width}, {args.units} units, {args.rounds} interleaved rounds: group commit / direct writes: "
            f"wall {med(walls):.2f} (range {min(walls):.2f}-{max(walls):.2f}), "
            f"CPU {med(cpus):.2f} (range {min(cpus):.2f}-{max(cpus):.2f}); "
            f"{med(txs):.2f} transactions per unit (direct: 1.00)"
        )


if __name__ == "__main__":
    main()
