"""Engine overhead, measured against a baseline in the same run.

Prints:
  1. a 1000-unit fan-out of `true` at width W (2; `--widths 2,4,8`) vs a bare W-thread pool spawning the
     same processes (`subprocess.run`, output captured), interleaved over rounds:
     the median wall ratio (goal <= 1.2 at width 2, <= 1.3 at 4 and 8) and the CPU per unit of the whole process
     (all threads; `resource.getrusage`, children excluded) of each, and the engine's
     own CPU per unit over the bare pool's (goal <= 0.3 ms);
  2. the time to re-run a completed 2000-unit run (nothing is dispatched), and to
     re-drive a 2000-unit step whose units are all journaled.

Everything is imported and warmed up before the first measured round. The machine
may be shared: every figure is a median over interleaved rounds, and CPU time is
less sensitive to a busy machine than wall time.

`--ahead-off` switches off rows journaled ahead (akm.engine.ahead; `AKM_JOURNAL_AHEAD=0`) in this tree's
engine: every unit then has a transaction of its own, which measures what that module saves.

`--compare DIR` also measures the engine of another source tree (a checkout of main, say:
`git archive main | tar -x -C DIR`) in the same interleaved rounds, against the same bare
pool. Each engine then runs in a child process of its own (its own imports and journal;
wall and CPU measured in the child), this tree's too, so both are measured alike.

Usage: python bench/bench_engine.py [--units 1000] [--rounds 7] [--rerun 2000] [--widths 2,4,8] [--ahead-off]
       [--compare DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import fan_workflow, interleaved, spread  # noqa: E402 - after the path it is found on


@dataclass
class Sample:
    wall: float  # seconds
    cpu: float  # seconds of this process (user + system, every thread)


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(fn: Callable[[], object]) -> Sample:
    cpu, wall = process_cpu(), time.perf_counter()
    fn()
    return Sample(time.perf_counter() - wall, process_cpu() - cpu)


def baseline(n: int, width: int) -> None:
    def spawn(_: int) -> None:
        subprocess.run(
            ["true"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            check=True,
        )

    with ThreadPoolExecutor(max_workers=width) as pool:
        list(pool.map(spawn, range(n)))


def engine(n: int, width: int, workdir: Path) -> str:
    from akm import api

    wf = workdir / f"fan-{n}-{width}-{time.monotonic_ns()}.md"
    wf.write_text(fan_workflow(width=width))
    res = api.run_workflow(str(wf), params={"xs": list(range(n))}, cwd=str(workdir))
    assert res.run.status == "completed", res.run.status
    return res.run.run_id


class Child:
    """An engine of some source tree in a process of its own, driven over its stdin/stdout."""

    def __init__(self, root: Path, work: Path, data: Path) -> None:
        env = dict(os.environ, AKM_DATA_DIR=str(data))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(root), "--work", str(work)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def measure(self, units: int, width: int) -> Sample:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{units} {width}\n")
        self.proc.stdin.flush()
        wall, cpu = json.loads(self.proc.stdout.readline())
        return Sample(wall, cpu)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def serve(root: str, work: Path) -> None:
    """`--serve`: run the engine of `root` for each "UNITS WIDTH" line; answer [wall, cpu] as JSON."""
    sys.path.insert(0, root)
    for line in sys.stdin:
        n, width = map(int, line.split())
        s = measure(lambda: engine(n, width, work))  # noqa: B023 - called at once
        print(json.dumps([s.wall, s.cpu]), flush=True)


def fan_out(
    units: int, rounds: int, work: Path, width: int = 2, children: dict[str, Child] | None = None
) -> dict[str, float]:
    baseline(20, width)  # warm up the spawner and the engine's imports, caches and journal
    if children:
        engines: dict[str, Callable[[], Sample]] = {
            name: (lambda c=c: c.measure(units, width)) for name, c in children.items()
        }
        for c in children.values():
            c.measure(20, width)
    else:
        engine(20, width, work)
        engines = {"engine": lambda: measure(lambda: engine(units, width, work))}
    contenders: dict[str, Callable[[], Sample]] = {"bare": lambda: measure(lambda: baseline(units, width))}
    contenders.update(engines)
    got = interleaved(rounds, contenders)
    bare = got["bare"]
    ratios = [e.wall / b.wall for e, b in zip(got["engine"], bare, strict=True)]
    eng_cpu = [e.cpu / units * 1000 for e in got["engine"]]
    bare_cpu = [b.cpu / units * 1000 for b in bare]
    over = [(e.cpu - b.cpu) / units * 1000 for e, b in zip(got["engine"], bare, strict=True)]
    med = statistics.median
    print(f"fan-out of {units} x `true` at width {width}, {rounds} interleaved rounds:")
    for name in engines:
        if name == "engine":
            continue
        rs = [o.wall / b.wall for o, b in zip(got[name], bare, strict=True)]
        own = [(o.cpu - b.cpu) / units * 1000 for o, b in zip(got[name], bare, strict=True)]
        print(
            f"  {name} in the same rounds: wall / bare pool, {spread(rs)}; "
            f"its own CPU per unit {spread(own, '.3f', unit=' ms')}"
        )
    mid = ratios.index(sorted(ratios)[len(ratios) // 2])
    eng_wall, bare_wall = got["engine"][mid].wall, bare[mid].wall
    goal = 1.2 if width <= 2 else 1.3
    print(
        f"  wall: engine / bare {width}-thread pool, {spread(ratios)}; goal <= {goal}; "
        f"median round {eng_wall:.2f} s / {bare_wall:.2f} s"
    )
    print(
        f"  CPU per unit (whole process, all threads): engine {med(eng_cpu):.3f} ms, bare pool "
        f"{med(bare_cpu):.3f} ms; engine's own {spread(over, '.3f', unit=' ms')}; goal <= 0.3"
    )
    return {
        f"fanoutRatioW{width}": round(med(ratios), 3),
        f"engineCpuMsPerUnitW{width}": round(med(eng_cpu), 3),
        f"bareCpuMsPerUnitW{width}": round(med(bare_cpu), 3),
        f"overheadCpuMsPerUnitW{width}": round(med(over), 3),
    }


def reruns(n: int, work: Path) -> dict[str, float]:
    from akm import api

    run_id = engine(n, 4, work)
    t = time.perf_counter()
    res = api.run_workflow(run_id, cwd=str(work))
    rerun = time.perf_counter() - t
    assert res.done
    t = time.perf_counter()
    api.run_status(run_id, units=True)
    status = time.perf_counter() - t
    print(f"re-run of a completed {n}-unit run: {rerun * 1000:.1f} ms (status --units: {status * 1000:.1f} ms)")

    # A crash after every unit finished but before the step completed: the re-run must
    # reuse all journaled rows (classification + reduction) and dispatch nothing.
    import sqlite3

    from akm import paths

    con = sqlite3.connect(paths.journal_path())
    con.execute(
        "UPDATE steps SET status='pending', evidence_json=NULL, summary=NULL, completed_at=NULL WHERE run_id=?",
        (run_id,),
    )
    con.execute("UPDATE runs SET status='active', current_step_id='fan', completed_at=NULL WHERE id=?", (run_id,))
    con.commit()
    con.close()
    t = time.perf_counter()
    res = api.run_workflow(run_id, cwd=str(work))
    redrive = time.perf_counter() - t
    assert res.done and res.executed[0]["unitCount"] == n
    print(
        f"re-drive of a {n}-unit step whose units are all journaled: {redrive * 1000:.1f} ms "
        f"(0 dispatched, {redrive / n * 1e6:.0f} us/unit)"
    )
    return {"rerunCompletedMs": round(rerun * 1000, 1), "redriveJournaledMs": round(redrive * 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rerun", type=int, default=2000)
    ap.add_argument("--widths", default="2", help="comma-separated pool widths, each measured on its own (e.g. 2,4,8)")
    ap.add_argument("--compare", help="also measure the engine of this source tree (e.g. a checkout of main)")
    ap.add_argument("--ahead-off", action="store_true", help="switch off rows journaled ahead (akm.engine.ahead)")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, Path(args.work))
        return
    if args.ahead_off:  # read at each pass (this process, and the children of --compare, which inherit it)
        os.environ["AKM_JOURNAL_AHEAD"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["AKM_DATA_DIR"] = str(Path(tmp) / "data")
        work = Path(tmp)
        (work / ".akm").mkdir()
        # Without it the host limit (D6: max(2, cpu_count)) would cap a width-8 map at 2 on a 2-core machine
        # while the baseline runs 8 threads: the map's own `concurrency` is then the width.
        (work / ".akm" / "config.json").write_text('{"workflow": {"maxConcurrency": 64}}')
        summary: dict[str, float] = {}
        children: dict[str, Child] = {}
        if args.compare:
            here = Path(__file__).resolve().parent.parent
            children["engine"] = Child(here, work, Path(tmp) / "data-here")
            children[args.compare] = Child(Path(args.compare).resolve(), work, Path(tmp) / "data-compare")
        try:
            for width in (int(w) for w in args.widths.split(",")):
                summary.update(fan_out(args.units, args.rounds, work, width, children))
        finally:
            for c in children.values():
                c.close()
        if args.rerun:
            summary.update(reruns(args.rerun, work))
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
