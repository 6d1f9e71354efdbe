"""Reuse (issue 33) against running, measured in the same run: a fan-out of N exec units run fresh, then the
same workflow with its last step edited run `--from` the first run (every fan-out unit restored, nothing
spawned), and its `--plan` preview. Prints the medians over interleaved rounds and the `--from` run and the
preview as ratios to the fresh run.

Usage: python bench/bench_reuse.py [--units 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORKFLOW = """---
params:
  n: {{ type: integer }}
steps:
  - id: make
    unit: {{ exec: {{ command: {make} }} }}
    output: {{ type: array }}
  - id: fan
    map:
      over: steps.make.output
      concurrency: 8
      unit: {{ exec: {{ command: ["true"] }} }}
    output: {{ type: array }}
  - id: last
    inputs: [steps.fan.output]
    unit: {{ exec: {{ command: [echo, {last}] }} }}
---

## make
M

## fan
F

## last
L
"""


def _round(units: int) -> tuple[float, float, float]:
    """(fresh s, --plan s, --from s) of one round in a fresh data dir."""
    from akm import api

    make = json.dumps(
        [
            sys.executable,
            "-c",
            "import json,os; print(json.dumps(list(range(json.loads(os.environ['AKM_PARAMS'])['n']))))",
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["AKM_DATA_DIR"] = str(Path(tmp) / "data")
        wf = Path(tmp) / "wf.md"
        wf.write_text(WORKFLOW.format(make=make, last="first"))
        t0 = time.perf_counter()
        first = api.run_workflow(str(wf), params={"n": units}, cwd=tmp)
        fresh = time.perf_counter() - t0
        assert first.run.status == "completed", first.run.status
        wf.write_text(WORKFLOW.format(make=make, last="second"))
        t0 = time.perf_counter()
        preview = api.plan_run(str(wf), params={"n": units}, from_run=first.run.run_id, cwd=tmp)
        planned = time.perf_counter() - t0
        assert preview.reused == units + 1, preview.reused
        t0 = time.perf_counter()
        second = api.run_workflow(str(wf), params={"n": units}, from_run=first.run.run_id, cwd=tmp)
        reused = time.perf_counter() - t0
        assert second.run.status == "completed" and second.run.steps[1].reused_units == units
    return fresh, planned, reused


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = [_round(args.units) for _ in range(args.rounds)]
    fresh, planned, reused = (statistics.median(r[i] for r in rows) for i in range(3))
    print(f"{args.units}-unit exec fan-out, median of {args.rounds} rounds")
    print(f"  fresh run        {fresh:8.3f} s   1.00")
    print(f"  --plan --from    {planned:8.3f} s   {planned / fresh:.3f}")
    print(f"  run --from       {reused:8.3f} s   {reused / fresh:.3f}  (0 of {args.units} units spawned)")


if __name__ == "__main__":
    main()
