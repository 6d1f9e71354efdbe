"""Start-up of the built file, each as a ratio to a bare `python3 -c pass` measured in the same run.

Prints the size of dist/akm and, over interleaved rounds (medians):
  - first start with an empty cache (`--version`, and `workflow lint` which also compiles what it
    imports; it imports no pydantic, so for examples/hello.md it unpacks no native extension),
  - `--version`, `workflow list` with 20 runs in the journal, re-running a finished run (warm cache).
Every command goes through the same launcher as the baseline: the shebang's `/usr/bin/env python3`,
or `--python PATH` for both. Build first: ./build.sh
Usage: python3 bench/bench_startup.py [--rounds 15] [--python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AKM = ROOT / "dist" / "akm"
TINY = """---
description: One exec unit, to fill the journal.
steps:
  - id: one
    unit:
      exec: { command: ["true"] }
---

## one

Run `true`.
"""


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cold-rounds", type=int, default=5, help="rounds of the cold `workflow lint` (slow)")
    ap.add_argument("--python", help="interpreter for akm and the baseline (default: the shebang's python3)")
    args = ap.parse_args()
    if not AKM.exists():
        sys.exit("dist/akm not found: run ./build.sh first")
    launcher = [args.python] if args.python else ["/usr/bin/env", "python3"]
    akm = [*launcher, str(AKM)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        project = tmp_path / "project"
        project.mkdir()
        (project / "tiny.md").write_text(TINY)
        shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AKM_", "SHIV_"))}
        env.update(
            AKM_DATA_DIR=str(tmp_path / "data"),
            XDG_CONFIG_HOME=str(tmp_path / "config"),
            SHIV_ROOT=str(tmp_path / "warm-cache"),
        )
        run_id = ""
        for _ in range(20):
            out = subprocess.run(
                [*akm, "workflow", "run", "tiny.md", "--format", "json"],
                env=env,
                cwd=project,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            run_id = json.loads(out)["run"]["runId"]

        def cold(*argv: str):
            def go() -> float:
                cold_env = dict(env, SHIV_ROOT=tempfile.mkdtemp(dir=tmp))
                return timed([*akm, *argv], cold_env, project)

            return go

        cases = {
            "python3 -c pass (baseline)": lambda: timed([*launcher, "-c", "pass"], env, project),
            "first start, empty cache: --version": cold("--version"),
            "--version": lambda: timed([*akm, "--version"], env, project),
            "workflow list (20 runs)": lambda: timed([*akm, "workflow", "list"], env, project),
            "workflow status of a finished run": lambda: timed([*akm, "workflow", "status", run_id], env, project),
            "re-run of a finished run": lambda: timed([*akm, "workflow", "run", run_id], env, project),
        }
        lint_cold = cold("workflow", "lint", "hello.md")
        samples: dict[str, list[float]] = {name: [] for name in cases}
        samples["first start, empty cache: workflow lint"] = []
        for i in range(args.rounds):
            for name, case in cases.items():
                samples[name].append(case())
            if i < args.cold_rounds:
                samples["first start, empty cache: workflow lint"].append(lint_cold())
    size = AKM.stat().st_size
    print(f"dist/akm: {size / 2**20:.2f} MiB ({size} bytes)")
    print(f"launcher: {' '.join(launcher)}; {args.rounds} interleaved rounds, medians")
    base = statistics.median(samples["python3 -c pass (baseline)"])
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:45s} {median * 1000:8.1f} ms  ratio {median / base:5.2f}  (n={len(values)})")


if __name__ == "__main__":
    main()
