"""What one session report costs: N reports through the api finishing one N-unit fan-out, per report.

A calling agent reports each unit of a fan-out it does (`unit_report` over MCP, `akm workflow report`); every
report validates its request, reads the step, writes the unit's row behind its guards and, when that
completes the step's work, finishes the step. Before issue 36 a report decided its step two or three times
(before its write, after it, and again for the brief it answers with); it now decides it once, after its
write. This times the whole api call (`api.report_unit`: the journal opened and closed per call, as each
front does) for every unit of a step of N units (default 500), plus the step's brief.

The figures are per report, and a ratio needs the same work done by another tree: `--compare DIR` runs the
same script against another source tree (a checkout of main, say: `git archive main | tar -x -C DIR`) in the
same interleaved rounds, each tree in a child process of its own (its own imports and journal), this tree's
too, so both are measured alike. Without `--compare` it prints this tree's figures alone.

Usage: python bench/bench_report.py [--units 500] [--rounds 5] [--compare DIR]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

WF = "---\nparams:\n  xs: { type: array }\nsteps:\n  - id: m\n    map: { over: params.xs }\n---\n## m\n\nDo it.\n"


def child(units: int, work: Path) -> dict[str, float]:
    """One measurement in this process, with whatever `akm` is first on the path: a run of one N-unit
    session step, its brief, then every unit reported in turn (the last report finishes the step)."""
    from akm import api

    wf = work / "session.md"
    wf.write_text(WF, encoding="utf-8")
    rid = api.run_workflow(str(wf), params={"xs": list(range(units))}, cwd=str(work)).run.run_id
    t = time.perf_counter()
    brief = api.next_brief(rid)
    brief_s = time.perf_counter() - t
    # Before issue 36 the api took has_result/has_verdict flags beside the values; a tree that still does
    # is measured with them.
    flags: dict[str, Any] = (
        {"has_result": True} if "has_result" in inspect.signature(api.report_unit).parameters else {}
    )
    t = time.perf_counter()
    for i, u in enumerate(brief.units):
        api.report_unit(rid, u.unit_id, status="completed", result=f"r{i}", cwd=str(work), **flags)
    reports_s = time.perf_counter() - t
    assert api.run_status(rid).steps[0].status == "completed"
    return {"reportMs": reports_s / units * 1000, "briefMs": brief_s * 1000}


def measure(tree: Path, units: int, tmp: Path, name: str) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{name}-"))
    env = dict(os.environ, AKM_DATA_DIR=str(work / "data"), PYTHONPATH=str(tree))
    env.pop("AKM_JOURNAL_URL", None)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(work), "--units", str(units)],
        cwd=str(work),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name}: the measurement failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compare", help="also measure this source tree (e.g. a checkout of main)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.units, Path(args.child))))
        return
    sys.path.insert(0, str(ROOT))
    from bench._common import interleaved, spread

    trees = {"this tree": ROOT}
    if args.compare:
        trees["compared"] = Path(args.compare).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        got = interleaved(
            args.rounds,
            {name: (lambda t=tree, n=name: measure(t, args.units, Path(tmp), n)) for name, tree in trees.items()},
        )
    summary: dict[str, Any] = {"units": args.units}
    for name, rounds in got.items():
        per = [r["reportMs"] for r in rounds]
        briefs = [r["briefMs"] for r in rounds]
        print(f"{name}: a report {spread(per, '.2f', unit=' ms')}; the brief {spread(briefs, '.0f', unit=' ms')}")
        summary[name] = {"reportMs": round(statistics.median(per), 2), "briefMs": round(statistics.median(briefs))}
    if args.compare:
        ratios = [a["reportMs"] / b["reportMs"] for a, b in zip(got["this tree"], got["compared"], strict=True)]
        print(f"a report, this tree / compared: {spread(ratios)} ({args.units}-unit step)")
        summary["reportRatio"] = round(statistics.median(ratios), 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
