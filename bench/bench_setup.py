"""`akm setup --yes` wall time, measured against `akm --version` in the same run.

Prints the median of N runs (a fresh config dir each run, so every run writes) for:
  1. nothing to find: the probe ports refuse, no CLI on PATH;
  2. a loopback Ollama-shaped server that verifies + fake claude/codex/opencode on PATH;
  3. the same plus a port that accepts and never answers (bounded by the 2 s probe timeout);
  4. a second run of 2 in the same environment (nothing written);
and the ratio of (1) to `akm --version` (the interpreter + CLI start cost).

Usage: python bench/bench_setup.py [--runs 5] [--akm "python3 -m akm" | --akm dist/akm]
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import fake_harness  # noqa: E402
from tests.fake_openai import FakeOpenAI, Silent  # noqa: E402


def closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}):\n{proc.stderr}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--akm", default=f"{sys.executable} -m akm")
    args = ap.parse_args()
    akm = shlex.split(args.akm)
    if os.path.exists(akm[0]):
        akm[0] = os.path.abspath(akm[0])
    tmp = Path(tempfile.mkdtemp(prefix="akm-bench-setup-"))
    empty_bin, clis_bin, home = tmp / "empty-bin", tmp / "bin", tmp / "home"
    for d in (empty_bin, clis_bin, home):
        d.mkdir()
    fake_harness.install(str(clis_bin), ["claude", "codex", "opencode"])
    server = FakeOpenAI(shape="ollama", models=["qwen2.5:7b", "nomic-embed-text"], behaviour={"qwen2.5:7b": "smart"})
    silent = Silent()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_") and not k.endswith("_API_KEY")}
    base_env.update({"HOME": str(home), "PYTHONPATH": str(ROOT), "AKM_DATA_DIR": str(tmp / "data")})
    base_env.pop("OLLAMA_HOST", None)

    def env_for(path: Path, probes: str, cfg: str) -> dict[str, str]:
        return {
            **base_env,
            "PATH": f"{path}{os.pathsep}{os.path.dirname(sys.executable)}",
            "AKM_SETUP_PROBE_URLS": probes,
            "AKM_CONFIG_DIR": str(tmp / cfg),
        }

    def series(name: str, path: Path, probes: str, fresh: bool = True) -> float:
        times = []
        for i in range(args.runs):
            cfg = f"cfg-{name}-{i}" if fresh else f"cfg-{name}"
            times.append(timed([*akm, "setup", "--yes"], env_for(path, probes, cfg), str(tmp)))
        return statistics.median(times)

    try:
        version = statistics.median(
            timed([*akm, "--version"], env_for(empty_bin, closed_port(), "v"), str(tmp)) for _ in range(args.runs)
        )
        nothing = series("nothing", empty_bin, ",".join(closed_port() for _ in range(3)))
        found = series("found", clis_bin, f"{server.base},{closed_port()},{closed_port()}")
        with_silent = series("silent", clis_bin, f"{server.base},{silent.base},{closed_port()}")
        timed([*akm, "setup", "--yes"], env_for(clis_bin, f"{server.base},{closed_port()}", "cfg-again"), str(tmp))
        again = series("again", clis_bin, f"{server.base},{closed_port()}", fresh=False)
    finally:
        server.close()
        silent.close()
    print(f"akm --version                          {version * 1000:7.0f} ms (baseline)")
    print(f"setup --yes, nothing to find           {nothing * 1000:7.0f} ms  ratio {nothing / version:4.2f}")
    print(f"setup --yes, server + 3 CLIs           {found * 1000:7.0f} ms  ratio {found / version:4.2f}")
    print(f"setup --yes, + a port that never answers {with_silent * 1000:5.0f} ms  ratio {with_silent / version:4.2f}")
    print(f"setup --yes again (nothing written)    {again * 1000:7.0f} ms  ratio {again / version:4.2f}")


if __name__ == "__main__":
    main()
