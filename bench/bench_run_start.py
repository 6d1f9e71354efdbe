"""A short `workflow run` from a cold process, as a ratio to a bare 2-thread pool measured in the same run.

Both sides are fresh interpreter processes that spawn the same 20 `true` processes two at a
time: the baseline is a script with a `ThreadPoolExecutor(2)` and `subprocess.run`, the other is
`akm workflow run` of a 20-item map at width 2 (its journal, plan, lint and start-up included).
Rounds are interleaved (which goes first alternates); each figure is a median with its range.
Goal (issue 21): ratio <= 2.

Usage: python bench/bench_run_start.py [--rounds 9] [--units 20] [--zipapp | --akm FILE] [--compare FILE] [--config]
(--zipapp: dist/akm, build first; --akm: another built file; --compare: a second built file measured in
the same rounds against the same baseline, e.g. a build of main)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import interleaved, spread  # noqa: E402 - after the path it is found on

WF = """---
params:
  xs: {{ type: array, default: {items} }}
steps:
  - id: fan
    map:
      over: params.xs
      concurrency: 2
      unit:
        exec: {{ command: ["true"] }}
    output: {{ type: array }}
---

## fan

Run `true` once per item.
"""

BARE = """import subprocess, sys
from concurrent.futures import ThreadPoolExecutor
def spawn(_):
    subprocess.run(["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                   start_new_session=True, check=True)
with ThreadPoolExecutor(max_workers=2) as pool:
    list(pool.map(spawn, range(int(sys.argv[1]))))
"""


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode()[-800:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--units", type=int, default=20)
    ap.add_argument("--zipapp", action="store_true", help="run dist/akm instead of the source tree")
    ap.add_argument("--akm", help="run this built file instead of the source tree")
    ap.add_argument("--compare", help="also run this built file in the same rounds (e.g. a build of main)")
    ap.add_argument("--config", action="store_true", help="with a project config file (an LLM engine, defaults)")
    args = ap.parse_args()
    built = args.akm or (str(ROOT / "dist" / "akm") if args.zipapp else None)
    built = str(Path(built).resolve()) if built else None  # the runs' cwd is a temporary directory
    compare = str(Path(args.compare).resolve()) if args.compare else None
    akm = [sys.executable, built] if built else [sys.executable, "-m", "akm"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / ".akm").mkdir()
        (work / "fan.md").write_text(WF.format(items=json.dumps(list(range(args.units)))))
        (work / "bare.py").write_text(BARE)
        if args.config:
            (work / ".akm" / "config.json").write_text(
                json.dumps(
                    {
                        "engines": {
                            "local": {
                                "kind": "llm",
                                "endpoint": "http://127.0.0.1:11434/v1/chat/completions",
                                "model": "qwen3",
                            }
                        },
                        "defaults": {"llmEngine": "local"},
                        "workflow": {"maxConcurrency": 4},
                    }
                )
            )
        # Bytecode caches as a user has them (a PYTHONDONTWRITEBYTECODE shell would recompile every module).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AKM_", "SHIV_")) and k != "PYTHONDONTWRITEBYTECODE"
        }
        env.update(
            AKM_DATA_DIR=str(work / "data"),
            XDG_CONFIG_HOME=str(work / "config"),
            PYTHONPATH=str(ROOT),
            SHIV_ROOT=str(work / "cache"),
        )
        bare = [sys.executable, "bare.py", str(args.units)]
        run = [*akm, "workflow", "run", "fan.md"]
        other = [sys.executable, compare, "workflow", "run", "fan.md"] if compare else None
        # Its own cache root: a start of one build prunes another build's idle cache under the same root. Its
        # own journal too: an older build refuses a journal a newer one migrated (JOURNAL_TOO_NEW).
        other_env = dict(env, SHIV_ROOT=str(work / "cache-compare"), AKM_DATA_DIR=str(work / "data-compare"))
        timed(bare, env, work), timed(run, env, work)  # warm: bytecode caches, the journal's schema
        if other:
            timed(other, other_env, work)
        contenders = {"bare": lambda: timed(bare, env, work), "akm": lambda: timed(run, env, work)}
        if other is not None:
            other_run = other
            contenders["other"] = lambda: timed(other_run, other_env, work)
        got = interleaved(args.rounds, contenders)
    ratios = [a / b for a, b in zip(got["akm"], got["bare"], strict=True)]
    med = statistics.median(ratios)
    a_med, b_med = statistics.median(got["akm"]), statistics.median(got["bare"])
    print(
        f"`workflow run` of {args.units} x `true` at width 2 ({built or 'source'}), "
        f"{args.rounds} interleaved rounds{', with a config file' if args.config else ''}:"
    )
    print(
        f"  wall: akm / bare 2-thread pool process, {spread(ratios)}; goal <= 2; "
        f"medians {a_med * 1000:.0f} ms / {b_med * 1000:.0f} ms"
    )
    if other:
        other_ratios = [o / b for o, b in zip(got["other"], got["bare"], strict=True)]
        print(f"  {args.compare} in the same rounds: {spread(other_ratios)}")
    print(
        json.dumps({"runStartRatio": round(med, 3), "akmMs": round(a_med * 1000, 1), "bareMs": round(b_med * 1000, 1)})
    )


if __name__ == "__main__":
    main()
