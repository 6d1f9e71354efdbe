"""Lint on a big file: a 10,000-step workflow (≈ 800 KB, under the 1 MiB cap).

Baseline, measured in the same run: PyYAML's pure-Python composer reading the
same frontmatter (what lint paid for YAML alone before it used libyaml). The
ratio `lint / baseline` below 1 means the whole lint now costs less than the
old YAML step did by itself. CPU time of this process is reported (not wall
clock), so a busy machine does not distort the comparison.
Usage: python bench/bench_lint.py [--steps 10000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from akm.format import yaml_stock  # noqa: E402
from akm.format.lint import lint_text  # noqa: E402


def big_workflow(n: int) -> str:
    front = "".join(f"  - id: s{i}\n    unit:\n      exec:\n        command: [echo, hi]\n" for i in range(n))
    body = "".join(f"## s{i}\n\nDo it.\n\n" for i in range(n))
    return "---\nsteps:\n" + front + "---\n\n" + body


def cpu(fn, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.process_time()
        fn()
        samples.append(time.process_time() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    text = big_workflow(args.steps)
    frontmatter = text.split("\n---\n", 1)[0][4:]

    baseline = cpu(lambda: yaml.compose(frontmatter, Loader=yaml.SafeLoader), args.runs)
    report = lint_text(text, "big.md")
    lint = cpu(lambda: lint_text(text, "big.md"), args.runs)
    saved = yaml_stock._CComposer
    yaml_stock._CComposer = None  # the pure-Python path (a PyYAML without libyaml)
    try:
        slow = cpu(lambda: lint_text(text, "big.md"), args.runs)
    finally:
        yaml_stock._CComposer = saved

    print(
        f"workflow: {args.steps} steps, {len(text) / 1024:.0f} KiB; "
        f"{len(report.warnings)} warning entries for {sum(w.count or 1 for w in report.warnings)} warnings"
    )
    print(f"baseline, pure-Python YAML compose only: {baseline:.2f} s CPU (median of {args.runs})")
    print(f"lint (libyaml path):                     {lint:.2f} s CPU  ratio {lint / baseline:.2f}")
    print(f"lint (pure-Python YAML path):            {slow:.2f} s CPU  ratio {slow / baseline:.2f}")


if __name__ == "__main__":
    main()
