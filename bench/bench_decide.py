"""The decision after a fan-out's dispatch pass, and the run view, as ratios to a bare read of the same rows.

After its one dispatch pass over a map the driver reads the step's rows back, decides the step from them
(`finalize.decide_step`: classify every unit, reduce the outcomes to the evidence), writes the step's end
(`stepctx.finish_step`: the evidence bounded, the spine advanced) and reloads the spine; `workflow run`
then answers with the run view (`api._views._run_view`). All of it is single-threaded wall time of every
run, outside the pass. This measures that work on a journal holding one completed N-unit map of `true`
(default 1000), with the step reset to pending before each round so the same write is measured each time.

Baseline, in the same rounds: `SELECT *` of the step's rows (`fetchall`, nothing built from them).
Each figure: median (range) over interleaved rounds of the cost per unit, and the ratio to the baseline.

`--root DIR` imports akm from another source tree (a checkout of main, say: `git archive main | tar -x -C
DIR`) instead of this one, so two trees can be compared by their ratios to the same kind of baseline.

Usage: python bench/bench_decide.py [--units 1000] [--rounds 9] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import fan_workflow, interleaved, spread  # noqa: E402 - after the path it is found on


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--root", help="import akm from this source tree instead")
    args = ap.parse_args()
    if args.root:
        sys.path.insert(0, str(Path(args.root).resolve()))
    n = args.units
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["AKM_DATA_DIR"] = str(Path(tmp) / "data")
        work = Path(tmp)
        (work / ".akm").mkdir()
        from akm import api
        from akm.api import _views
        from akm.engine import finalize, stepctx
        from akm.engine.state import load_run
        from akm.store import runs as runs_store

        print(f"akm from {Path(api.__file__).resolve().parent.parent}")
        wf = work / "fan.md"
        wf.write_text(fan_workflow())
        res = api.run_workflow(str(wf), params={"xs": list(range(n))}, cwd=str(work))
        assert res.run.status == "completed", res.run.status
        run_id = res.run.run_id
        db = _views._open_db()
        loaded = load_run(db, run_id)
        plan, step = loaded.plan, loaded.plan.steps[0]
        native = frozenset({"exec"})

        def reset() -> None:
            # What the run looked like when its pass had just settled: every unit journaled, the step pending.
            with db.tx() as conn:
                conn.execute(
                    "UPDATE steps SET status='pending', evidence_json=NULL, summary=NULL, completed_at=NULL "
                    "WHERE run_id=?",
                    (run_id,),
                )
                conn.execute(
                    "UPDATE runs SET status='active', current_step_id=?, completed_at=NULL WHERE id=?",
                    (step.step_id, run_id),
                )

        def gate_and_spine() -> tuple[Any, Any]:
            spine = stepctx.load_spine(db, run_id, plan)
            return spine, stepctx.load_gate(db, run_id, step, spine, [])

        reset()
        spine, gate = gate_and_spine()
        common = dict(
            run_id=run_id,
            step=step,
            params=loaded.params,
            outputs=spine.outputs,
            engines=plan.execution.engines,
            gate=gate,
            native_kinds=native,
        )
        if "hash_version" in finalize.decide_step.__code__.co_varnames:  # a tree before hash versions: none
            common["hash_version"] = loaded.run.hash_version
        work_list = finalize.decide_step(**common, rows=[]).work_list  # the pre-pass decision's (not measured)
        parts: dict[str, float] = {}

        def decision() -> None:
            t = time.perf_counter()
            rows, gate_rows = stepctx.step_rows(db, run_id, step.step_id)
            g = stepctx.load_gate(db, run_id, step, spine, gate_rows)
            t1 = time.perf_counter()
            d = finalize.decide_step(
                **{**common, "gate": g}, rows=rows, settled=True, fail_fast=True, work_list=work_list
            )
            assert d.kind == "complete", d.kind
            t2 = time.perf_counter()
            stepctx.finish_step(
                db,
                run_id,
                step.step_id,
                "completed",
                summary=d.summary,
                notes=None,
                evidence=d.evidence,
                lease_holder=None,
            )
            stepctx.load_spine(db, run_id, plan)
            t3 = time.perf_counter()
            parts.update(rows=t1 - t, decide=t2 - t1, finish=t3 - t2)

        def view() -> None:
            _views._run_view(db, runs_store.get_run(db, run_id))

        def bare() -> None:
            db.query("SELECT * FROM units WHERE run_id = ? AND step_id = ?", (run_id, step.step_id))

        samples: dict[str, list[float]] = {"rows": [], "decide": [], "finish": []}

        def measured_decision() -> float:
            reset()
            took = timed(decision)
            for k, v in parts.items():
                samples[k].append(v)
            return took

        for _ in range(2):  # warm-up: imports, statement cache, pages
            measured_decision(), timed(view), timed(bare)
        for v in samples.values():
            v.clear()
        got = interleaved(
            args.rounds, {"bare": lambda: timed(bare), "decision": measured_decision, "view": lambda: timed(view)}
        )
        db.close()
    base = got["bare"]
    us = 1e6 / n
    print(f"{n}-unit map of `true`, {args.rounds} interleaved rounds (per unit; ratio to `SELECT *` of the rows):")
    print(f"  baseline SELECT * of the step's rows: {spread(base, '.2f', us, ' us')}")
    for name, label in (("decision", "post-pass decision (rows + decide + finish)"), ("view", "run view")):
        ratios = [x / b for x, b in zip(got[name], base, strict=True)]
        print(f"  {label}: {spread(got[name], '.2f', us, ' us')}; / baseline {spread(ratios)}")
    for name in ("rows", "decide", "finish"):
        ratios = [x / b for x, b in zip(samples[name], base, strict=True)]
        print(f"    {name}: {spread(samples[name], '.2f', us, ' us')}; / baseline {spread(ratios)}")

    def median_ratio(xs: list[float]) -> float:
        rs = sorted(x / b for x, b in zip(xs, base, strict=True))
        return round(rs[len(rs) // 2], 3)

    print(json.dumps({"decisionRatio": median_ratio(got["decision"]), "viewRatio": median_ratio(got["view"])}))


if __name__ == "__main__":
    main()
