"""The agent-facing surface, measured against baselines in the same run.

Prints:
  1. MCP server start to its first answer and to its `tools/list` answer, in both protocol eras — a 2025
     client's `initialize` and a 2026-07-28 client's `server/discover` (Claude Code's and the Python SDK's) —
     as ratios to a bare `python3 -c pass` start through the same interpreter (interleaved rounds, median and
     range; with `--akm dist/akm` also with an empty cache, AKM_CACHE_DIR a fresh directory each round);
     goals: each <= 3x a bare start (issue 37), initialize <= 2 s with an empty cache (issue 21);
  2. a `workflow_status` round trip on a running server (median);
  3. reports per second through the api for one 1000-unit session step (and the
     brief of that step), the path an agent's `unit_report` calls take.

Usage: python bench/bench_mcp.py [--akm dist/akm] [--units 1000] [--rounds 5]
(`--akm` defaults to `python3 -m akm` from this checkout; pass dist/akm after ./build.sh.)
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


def _start_server(cmd: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen:
    return subprocess.Popen(
        cmd + ["mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        text=True,
        bufsize=1,
    )


def _rpc(proc: subprocess.Popen, rid: int, method: str, params: dict | None = None) -> dict:
    assert proc.stdin and proc.stdout
    proc.stdin.write(
        json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params else {})}) + "\n"
    )
    proc.stdin.flush()
    while True:
        frame = json.loads(proc.stdout.readline())
        if frame.get("id") == rid:
            return frame


INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}
# What Claude Code 2.1.332 sends in every request of the 2026-07-28 protocol (spec/mcp.md, start-up).
META = {
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {"roots": {"listChanged": True}},
    }
}


def time_initialize(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Seconds from start to the `initialize` answer, and to the `tools/list` answer after it."""
    t = time.perf_counter()
    proc = _start_server(cmd, env, cwd)
    _rpc(proc, 1, "initialize", INIT)
    dt = time.perf_counter() - t
    assert proc.stdin
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
    _rpc(proc, 2, "tools/list")
    dl = time.perf_counter() - t
    proc.kill()
    proc.wait()
    return dt, dl


def time_discover(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Seconds from start to the `server/discover` answer, and to the `tools/list` answer after it (2026-07-28)."""
    t = time.perf_counter()
    proc = _start_server(cmd, env, cwd)
    _rpc(proc, 1, "server/discover", META)
    dt = time.perf_counter() - t
    _rpc(proc, 2, "tools/list", META)
    dl = time.perf_counter() - t
    proc.kill()
    proc.wait()
    return dt, dl


def _spread(xs: list[float], unit: float = 1.0, fmt: str = ".2f") -> str:
    return f"median {statistics.median(xs) * unit:{fmt}} (range {min(xs) * unit:{fmt}}-{max(xs) * unit:{fmt}})"


def time_bare(python: str) -> float:
    t = time.perf_counter()
    subprocess.run([python, "-c", "pass"], check=True)
    return time.perf_counter() - t


def reports_per_second(units: int, work: Path) -> tuple[float, float]:
    from akm import api

    wf = work / "session.md"
    wf.write_text(
        "---\nparams:\n  xs: { type: array }\nsteps:\n  - id: m\n    map: { over: params.xs }\n---\n## m\n\nDo it.\n",
        encoding="utf-8",
    )
    res = api.run_workflow(str(wf), params={"xs": list(range(units))}, cwd=str(work))
    rid = res.run.run_id
    t = time.perf_counter()
    brief = api.next_brief(rid)
    brief_s = time.perf_counter() - t
    t = time.perf_counter()
    for i, u in enumerate(brief.units):
        api.report_unit(rid, u.unit_id, status="completed", result=f"r{i}", cwd=str(work))
    dt = time.perf_counter() - t
    assert api.run_status(rid).steps[0].status == "completed"
    return units / dt, brief_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--akm", default=None)
    ap.add_argument("--units", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    # The same interpreter as the baseline (a file's shebang may go through a slow launcher such as a pyenv shim).
    # Resolved: the servers start in a temporary directory, where `dist/akm` names nothing.
    cmd = [sys.executable, str(Path(args.akm).resolve())] if args.akm else [sys.executable, "-m", "akm"]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, AKM_DATA_DIR=str(Path(tmp) / "data"), PYTHONPATH=str(ROOT))
        os.environ["AKM_DATA_DIR"] = env["AKM_DATA_DIR"]
        time_initialize(cmd, env, tmp)  # warm (zipapp extraction, page cache)
        inits, lists, discovers, dlists, bares, colds = [], [], [], [], [], []
        cold = args.akm is not None  # the zipapp unpacks its native parts into an empty cache
        for r in range(args.rounds):  # interleaved, so load on the machine hits both alike
            if r % 2:
                bares.append(time_bare(sys.executable))
            i, t = time_initialize(cmd, env, tmp)
            inits.append(i)
            lists.append(t)
            d, dl = time_discover(cmd, env, tmp)
            discovers.append(d)
            dlists.append(dl)
            if not r % 2:
                bares.append(time_bare(sys.executable))
            if cold:
                empty = tempfile.mkdtemp(dir=tmp)
                colds.append(time_initialize(cmd, dict(env, AKM_CACHE_DIR=empty), tmp)[0])
        init_s, bare_s = statistics.median(inits), statistics.median(bares)

        def ratios(xs: list[float]) -> list[float]:
            return [x / b for x, b in zip(xs, bares, strict=True)]

        print(
            f"python3 -c pass: {_spread(bares, 1000, '.0f')} ms ({args.rounds} interleaved rounds; goal: each "
            "answer <= 3x a bare start)"
        )
        for label, xs in (
            ("2025 era: start to the initialize answer", inits),
            ("          to the tools/list answer after it", lists),
            ("2026 era: start to the server/discover answer", discovers),
            ("          to the tools/list answer after it", dlists),
        ):
            print(f"{label}: {_spread(xs, 1000, '.0f')} ms; ratio {_spread(ratios(xs))}")
        if colds:
            print(
                f"  initialize with an empty cache: {_spread(colds, 1000, '.0f')} ms; ratio "
                f"{_spread(ratios(colds))} (goal <= 2000 ms)"
            )

        wf = Path(tmp) / "one.md"
        wf.write_text('---\nsteps:\n  - id: a\n    unit: { exec: { command: ["true"] } }\n---\n## a\n\nA.\n')
        proc = _start_server(cmd, env, tmp)
        _rpc(proc, 1, "initialize", INIT)
        run = _rpc(proc, 2, "tools/call", {"name": "workflow_run", "arguments": {"target": "one.md"}})
        rid = run["result"]["structuredContent"]["run"]["runId"]
        trips = []
        for i in range(30):
            t = time.perf_counter()
            _rpc(proc, 10 + i, "tools/call", {"name": "workflow_status", "arguments": {"run_id": rid}})
            trips.append(time.perf_counter() - t)
        proc.kill()
        proc.wait()
        status_ms = statistics.median(trips) * 1000
        print(f"workflow_status round trip: {status_ms:.1f} ms (median of 30)")

        rate, brief_s = reports_per_second(args.units, Path(tmp))
        print(f"{args.units}-unit session step: brief {brief_s * 1000:.0f} ms; {rate:.0f} reports/s through the api")
        print(
            json.dumps(
                {
                    "mcpInitRatio": round(statistics.median(ratios(inits)), 2),
                    "mcpToolsListRatio": round(statistics.median(ratios(lists)), 2),
                    "mcpDiscoverRatio": round(statistics.median(ratios(discovers)), 2),
                    "mcpDiscoverToolsListRatio": round(statistics.median(ratios(dlists)), 2),
                    "mcpInitMs": round(init_s * 1000),
                    "mcpToolsListMs": round(statistics.median(lists) * 1000),
                    "mcpDiscoverMs": round(statistics.median(discovers) * 1000),
                    "mcpInitEmptyCacheMs": round(statistics.median(colds) * 1000) if colds else None,
                    "bareMs": round(bare_s * 1000),
                    "statusRoundTripMs": round(status_ms, 1),
                    "reportsPerSecond": round(rate),
                    "briefMs": round(brief_s * 1000),
                }
            )
        )


if __name__ == "__main__":
    main()
