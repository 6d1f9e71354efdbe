"""Capture memory and journal growth of a 16-wide fan-out of big-output exec units.

Each of 16 units (all running at once) writes `--mb` MiB to stdout and as much
to stderr, well over the capture caps. Measured, for one `akm workflow run` in
a fresh data directory:

* peak RSS of the akm process (getrusage of the waited child: akm itself; the
  units are small Python processes),
* journal size on disk (the SQLite file plus its WAL).

Baseline, same run, same machine: the identical fan-out whose units print one
line. The ratios say what big outputs add on top of akm's own footprint.
Usage: python bench/bench_capture.py [--width 16] [--mb 12] [--akm-root OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKFLOW = """\
---
params:
  xs: {{ type: array }}
steps:
  - id: fan
    map:
      over: params.xs
      concurrency: {width}
      unit:
        exec:
          command: {command}
    output: {{ type: array }}
---

## fan

Write a lot.
"""

BIG = (
    "import sys\nchunk = b'x' * 65536\nfor _ in range({blocks}):\n"
    "    sys.stdout.buffer.write(chunk)\n    sys.stderr.buffer.write(chunk)\n"
)
SMALL = "print('small')"


def measure(width: int, code: str, root: Path) -> tuple[float, int, str]:
    """(peak RSS MiB of akm, journal bytes, run status) for one run in a fresh data dir."""
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "p"
        project.mkdir()
        command = json.dumps([sys.executable, "-c", code])
        (project / "w.md").write_text(WORKFLOW.format(width=width, command=command), encoding="utf-8")
        data = Path(tmp) / "data"
        env = dict(os.environ, AKM_DATA_DIR=str(data), PYTHONPATH=str(root), AKM_PROGRESS="0")
        # One waited child per measurement, so RUSAGE_CHILDREN's max is this akm run's peak.
        probe = (
            "import resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
            "sys.stdout.write(str(rss) + '\\n' + p.stdout)\n"
        )
        # The host limit (D6) is max(2, cpu_count); lift it so `width` units really run at once
        # (config `workflow.maxConcurrency` does the same for users).
        engine = (
            "import sys\nimport akm.engine.passes as passes\n"
            f"passes.host_concurrency_limit = lambda: {width}\n"
            "from akm.cli import main\nsys.exit(main(sys.argv[1:]))\n"
        )
        xs = json.dumps([f"item-{i}" for i in range(width)])
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                probe,
                sys.executable,
                "-c",
                engine,
                "workflow",
                "run",
                "w.md",
                "--xs",
                xs,
                "--format",
                "json",
            ],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        rss_line, _, out = proc.stdout.partition("\n")
        status = json.loads(out)["run"]["status"] if out.strip() else f"error: {proc.stderr[-300:]}"
        journal = sum(f.stat().st_size for f in data.iterdir() if f.name.startswith(("akm-journal", "state.db")))
        return int(rss_line) / 1024, journal, status


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--mb", type=int, default=12)
    ap.add_argument("--akm-root", type=Path, default=ROOT, help="the akm checkout to measure (default: this one)")
    args = ap.parse_args()
    small_rss, small_journal, small_status = measure(args.width, SMALL, args.akm_root)
    big_rss, big_journal, big_status = measure(args.width, BIG.format(blocks=args.mb * 16), args.akm_root)
    print(f"{args.width} units at once, each writing {args.mb} MiB to stdout and {args.mb} MiB to stderr")
    print(
        f"baseline (one line each): peak RSS {small_rss:7.1f} MiB, journal {small_journal / 2**20:7.2f} MiB "
        f"[{small_status}]"
    )
    print(
        f"big outputs:              peak RSS {big_rss:7.1f} MiB, journal {big_journal / 2**20:7.2f} MiB [{big_status}]"
    )
    print(
        f"ratio big/baseline:       RSS {big_rss / small_rss:.2f}x, journal {big_journal / small_journal:.1f}x; "
        f"added: {big_rss - small_rss:.1f} MiB RSS, {(big_journal - small_journal) / 2**20:.2f} MiB journal "
        f"({(big_journal - small_journal) / args.width / 2**20:.2f} MiB per unit)"
    )


if __name__ == "__main__":
    main()
