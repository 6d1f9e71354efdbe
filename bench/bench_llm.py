"""LLM fan-out overhead, measured against a bare httpx client in the same run.

A loopback OpenAI-compatible server answers at once. Prints, for N units at
width W (default 200 at 4):

  1. bare: one shared httpx.Client, W threads, the same N requests;
  2. dispatcher: N LlmDispatcher.dispatch calls at width W (no journal);
  3. akm: a `workflow run` of an N-item map on an `llm` engine (journal, prompts, hashes);

and the per-unit overhead of 2 and 3 over 1, plus their ratios.

Usage: python bench/bench_llm.py [--units 200] [--width 4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fake_openai import FakeOpenAI  # noqa: E402

WF = """---
params:
  xs: {{ type: array }}
steps:
  - id: fan
    map:
      over: params.xs
      concurrency: {width}
---

## fan

Answer for the item.
"""


def bare(url: str, n: int, width: int) -> float:
    import httpx

    body = {"model": "plain", "messages": [{"role": "user", "content": "x"}], "temperature": 0.3}
    with httpx.Client(timeout=30) as client:

        def one(_: int) -> None:
            r = client.post(url, json=body)
            r.raise_for_status()
            assert r.json()["choices"][0]["message"]["content"]

        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=width) as pool:
            list(pool.map(one, range(n)))
        return time.perf_counter() - t


def dispatcher(url: str, n: int, width: int) -> float:
    from akm.dispatch.base import UnitRequest
    from akm.dispatch.llm import LlmDispatcher

    d = LlmDispatcher()
    engine = {
        "name": "bench",
        "kind": "llm",
        "endpoint": url,
        "model": "plain",
        "concurrency": width,
        "credential": {"names": [], "required": False},
    }

    def one(i: int) -> None:
        req = UnitRequest(
            run_id="r",
            step_id="s",
            unit_id=f"u{i}",
            attempt_id=f"u{i}",
            kind="llm",
            cwd="/",
            prompt="x",
            timeout_ms=30_000,
            engine_name="bench",
            engine=engine,
            parent_env={},
        )
        assert d.dispatch(req, threading.Event(), None).ok

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=width) as pool:
        list(pool.map(one, range(n)))
    return time.perf_counter() - t


def akm_run(url: str, n: int, width: int, work: Path) -> float:
    from akm import api

    wf = work / f"fan-{time.monotonic_ns()}.md"
    wf.write_text(WF.format(width=width))
    t = time.perf_counter()
    res = api.run_workflow(str(wf), params={"xs": list(range(n))}, cwd=str(work))
    elapsed = time.perf_counter() - t
    assert res.run.status == "completed", res.run.status
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=200)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    server = FakeOpenAI()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            os.environ["AKM_DATA_DIR"] = str(work / "data")
            os.environ["XDG_CONFIG_HOME"] = str(work / "xdg")
            (work / ".akm").mkdir()
            (work / ".akm" / "config.json").write_text(
                json.dumps(
                    {
                        "engines": {
                            "bench": {
                                "kind": "llm",
                                "endpoint": server.url,
                                "model": "plain",
                                "concurrency": args.width,
                            }
                        },
                        "defaults": {"llmEngine": "bench"},
                        "workflow": {"maxConcurrency": args.width},
                    }
                )
            )
            bare(server.url, 20, args.width)  # warm up
            dispatcher(server.url, 20, args.width)
            n, w = args.units, args.width
            b, d, a = [], [], []
            for r in range(args.rounds):
                if r % 2 == 0:  # alternate the order, so a trend in the machine's load hits all alike
                    b.append(bare(server.url, n, w))
                    d.append(dispatcher(server.url, n, w))
                    a.append(akm_run(server.url, n, w, work))
                else:
                    a.append(akm_run(server.url, n, w, work))
                    d.append(dispatcher(server.url, n, w))
                    b.append(bare(server.url, n, w))
            mb, md, ma = (statistics.median(x) for x in (b, d, a))
            rd = [x / y for x, y in zip(d, b, strict=False)]
            ra = [x / y for x, y in zip(a, b, strict=False)]
            print(f"{n} LLM units at width {w}, median of {args.rounds} rounds (loopback server answering at once)")
            print(f"  bare httpx client   {mb * 1000:8.1f} ms  ({mb / n * 1000:.2f} ms/request)")
            print(
                f"  LlmDispatcher       {md * 1000:8.1f} ms  ratio {statistics.median(rd):.2f} "
                f"(range {min(rd):.2f}-{max(rd):.2f}; goal <= 1.3)  overhead {(md - mb) / n * 1000:+.2f} ms/unit"
            )
            print(
                f"  akm workflow run    {ma * 1000:8.1f} ms  ratio {statistics.median(ra):.2f} "
                f"(range {min(ra):.2f}-{max(ra):.2f})  overhead {(ma - mb) / n * 1000:+.2f} ms/unit"
            )
    finally:
        server.close()


if __name__ == "__main__":
    main()
