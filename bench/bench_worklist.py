"""The work list of a fan-out: what a step costs before its first unit is dispatched.

A 1000-unit map over `params.xs` (a 1000-item list) of `exec: ["true"]` — bench_engine.py's workflow —
builds its work list (`akm.engine.worklist.build_work_list`: every unit's id and input hash) in each
contender, interleaved over rounds; each figure is the median CPU time of one build (`time.process_time`,
best of a few builds per round so a preempted one does not count), with its range over the rounds.

Contenders:
  * `v5`: the work list of a new run (`hash_version` 5: each unit hashes its item and a digest of the rest);
  * `v4`: the same step for a run created with `hash_version` 4 (each unit hashes the whole preimage,
    params included: O(units x params) bytes);
  * `floor`: what any work list must do per item — its canonical JSON and its content id
    (`item_unit_id`), plus one `WorkUnit` record each — the baseline the others are printed as ratios to.

Goal: `v5` <= 3 ms at 1000 units (it was ~12 ms with v4 hashing and a prompt record per unit).
A tree whose `build_work_list` has no `hash_version` (main before v5) is measured as `tree`.

`--compare DIR` measures another source tree (e.g. `git archive main | tar -x -C DIR`) in the same
interleaved rounds, each tree in a child process of its own per round, and prints this tree's work list
as a ratio to the other's.

Usage: python bench/bench_worklist.py [--units 1000] [--rounds 15] [--compare DIR]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
else:  # bench/_common.py is this tree's, the engine measured is PYTHONPATH's
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench._common import interleaved, spread  # noqa: E402 - after the path it is found on


def step_plan(width: int = 4) -> Any:
    """bench_engine.py's fan-out step, as the plan freezes it."""
    from akm.plan.model import StepPlan

    return StepPlan.model_validate(
        {
            "stepId": "fan",
            "title": "fan",
            "sequenceIndex": 0,
            "root": {
                "kind": "map",
                "id": "fan.map",
                "over": "params.xs",
                "concurrency": width,
                "template": {
                    "kind": "unit",
                    "id": "fan.unit",
                    "instructions": "Run `true` once per item.",
                    "exec": {"command": ["true"], "timeoutMs": 600000},
                },
            },
            "gate": {"kind": "gate", "id": "fan.gate", "stepId": "fan", "criteria": [], "maxLoops": 1},
        }
    )


def contenders(units: int) -> dict[str, Callable[[], Any]]:
    from akm.canonical import canonical_json
    from akm.engine.worklist import WorkUnit, build_work_list
    from akm.plan.identity import item_unit_id

    step = step_plan()
    params = {"xs": list(range(units))}
    template = step.unit_template

    def build(**extra: Any) -> Callable[[], Any]:
        def one() -> Any:
            wl = build_work_list(step, run_id="r", params=params, step_outputs={}, **extra)
            assert len(wl.units) == units, wl
            return wl

        return one

    def floor() -> Any:
        out = []
        for i, it in enumerate(params["xs"]):
            key = canonical_json(it)
            uid = item_unit_id(template.id, it, key)
            # (positional, as the work list builds them: fields in declaration order)
            out.append(WorkUnit(uid, uid, template.id, "fan.map", i, it, template, "exec", None, None, 600000, [], key))
        return out

    got: dict[str, Callable[[], Any]] = {}
    if "hash_version" in inspect.signature(build_work_list).parameters:
        got["v5"] = build(hash_version=5)
        got["v4"] = build(hash_version=4)
    else:
        got["tree"] = build()
    got["floor"] = floor
    return got


def cpu_of(fn: Callable[[], Any], repeat: int = 3) -> float:
    """The least CPU time of `repeat` calls (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def one_round(units: int) -> dict[str, float]:
    """Every contender of this process's tree, measured once (after a warm-up)."""
    fns = contenders(units)
    for fn in fns.values():  # imports, first-call caches
        fn()
    return {name: cpu_of(fn, 5) for name, fn in fns.items()}


def child_round(tree: str | None, units: int) -> dict[str, float]:
    """`one_round` in a fresh interpreter importing akm from `tree` (None: this one)."""
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    else:
        env.pop("PYTHONPATH", None)
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--units", str(units)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return {k: float(v) for k, v in json.loads(out.stdout).items()}


def print_lines(got: dict[str, list[float]], floor: list[float], prefix: str = "") -> None:
    for name, xs in got.items():
        line = f"{prefix}{name:>5}: work list CPU {spread(xs, '.2f', 1000, ' ms')}"
        if name != "floor":
            line += f"; / floor {spread([x / f for x, f in zip(xs, floor, strict=True)])}"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--compare", help="another source tree (an export of main, say) measured in the same rounds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_round(args.units)))
        return
    import akm

    print(f"akm from {Path(akm.__file__).resolve().parent}; {args.units} units over a {args.units}-item param")
    if not args.compare:
        fns = contenders(args.units)
        for fn in fns.values():  # imports, first-call caches
            fn()
        got = interleaved(args.rounds, {name: (lambda fn=fn: cpu_of(fn)) for name, fn in fns.items()})
        print_lines(got, got["floor"])
        return
    # Each tree in a child of its own per round (its own imports), the two interleaved.
    rounds = interleaved(
        args.rounds,
        {"this": lambda: child_round(None, args.units), "other": lambda: child_round(args.compare, args.units)},
    )
    mine = {k: [r[k] for r in rounds["this"]] for k in rounds["this"][0]}
    other = {k: [r[k] for r in rounds["other"]] for k in rounds["other"][0]}
    print_lines(mine, mine["floor"], "this tree ")
    print_lines(other, other["floor"], f"{args.compare} ")
    theirs = other.get("tree") or other["v5"]
    for name in ("v5", "v4", "tree"):
        if name in mine:
            ratios = [a / b for a, b in zip(mine[name], theirs, strict=True)]
            print(f"this tree {name} / the other tree's work list: {spread(ratios)}")


if __name__ == "__main__":
    main()
