"""CLI start-up: `dist/akm --version` against a bare `python3 -c pass`, same run.

Both go through the same launcher (`/usr/bin/env python3`); the ratio is what
the zipapp (shiv bootstrap + akm.cli import) adds. Build first: ./build.sh
Usage: python bench/bench_startup.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(argv: list[str], env: dict[str, str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    akm = ROOT / "dist" / "akm"
    if not akm.exists():
        sys.exit("dist/akm not found: run ./build.sh first")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SHIV_ROOT=tmp)
        subprocess.run([str(akm), "--version"], env=env, check=True, stdout=subprocess.DEVNULL)  # first-run extraction
        bare = timed(["/usr/bin/env", "python3", "-c", "pass"], env, args.runs)
        version = timed([str(akm), "--version"], env, args.runs)
        lint = timed([str(akm), "workflow", "lint", str(ROOT / "examples" / "hello.md")], env, args.runs // 3 or 1)
    print(f"python3 -c pass: {bare * 1000:.1f} ms (median of {args.runs})")
    print(f"dist/akm --version: {version * 1000:.1f} ms  ratio {version / bare:.2f}")
    print(f"dist/akm workflow lint examples/hello.md: {lint * 1000:.1f} ms  ratio {lint / bare:.2f}")


if __name__ == "__main__":
    main()
