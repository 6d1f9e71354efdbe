"""Native structured output of the real claude CLI (`--json-schema`): how often akm must re-ask.

claude (tests/agent_clis, `npm ci --prefix tests/agent_clis`) runs agent units with an output schema against
the loopback Anthropic fake (tests/fake_model_apis.py), whose model answers prose instead of JSON on P % of
its calls (`prose<P>`, seeded). Two contenders, interleaved:

  prompt  the schema only in the prompt (how akm called claude before): a prose answer is a parse_error,
          and akm's corrective re-ask (a second claude process) follows;
  native  `--json-schema`: claude offers its model a StructuredOutput tool and, when the model answers
          without calling it, re-asks it once itself (a second miss returns the prose: akm re-asks then).

Prints per contender: units, akm parse errors (= akm re-asks) and their rate, model calls per unit, and
seconds per unit (median and range of the rounds).

Usage: python bench/bench_agent_schema.py [--units 8] [--prose 40] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from akm.dispatch import harnesses as hz  # noqa: E402
from akm.dispatch.agents import AgentDispatcher  # noqa: E402
from akm.dispatch.base import UnitRequest  # noqa: E402
from akm.engine.structured import run_structured  # noqa: E402
from bench._common import interleaved  # noqa: E402
from tests import real_clis  # noqa: E402
from tests.fake_model_apis import FakeModelApis  # noqa: E402

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
REASK = "could not be read as JSON"


def contender(native: bool, apis: FakeModelApis, args: argparse.Namespace, counter: list[int]):
    def one_round() -> dict[str, float]:
        counter[0] += 1
        scenario = f"prose{args.prose}.{'native' if native else 'prompt'}-{counter[0]}"
        limit = hz.SCHEMA_ARG_LIMIT
        hz.SCHEMA_ARG_LIMIT = limit if native else -1  # -1: no schema fits the command line
        try:
            with tempfile.TemporaryDirectory(prefix="akm-bench-schema-") as tmp:
                home, project = Path(tmp) / "home", Path(tmp) / "project"
                project.mkdir()
                conf = real_clis.setup("claude", home, project, apis.base(scenario))
                started = time.monotonic()
                ok = 0
                for i in range(args.units):
                    res = run_structured(
                        AgentDispatcher(),
                        UnitRequest(
                            run_id="bench",
                            step_id="s",
                            unit_id=f"s:{i}",
                            attempt_id=f"s:{i}",
                            kind="agent",
                            cwd=str(project),
                            prompt="Answer with the JSON object the schema describes: set ok to true.\n"
                            + "Respond with only a JSON value matching this JSON Schema: "
                            + str(SCHEMA),
                            output_schema=SCHEMA,
                            timeout_ms=120_000,
                            engine_name="claude",
                            engine=conf["engine"],
                            parent_env={"LANG": "C.UTF-8", **conf["env"]},
                        ),
                        threading.Event(),
                    )
                    ok += bool(res.ok)
                seconds = time.monotonic() - started
        finally:
            hz.SCHEMA_ARG_LIMIT = limit
        calls = apis.of(scenario)
        reasks = sum(REASK in str(r["body"]) for r in calls)
        return {"ok": ok, "reasks": reasks, "calls": len(calls), "s_per_unit": seconds / args.units}

    return one_round


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=8)
    ap.add_argument("--prose", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    real_clis.require()
    apis = FakeModelApis()
    counter = [0]
    try:
        got = interleaved(
            args.rounds,
            {
                "prompt": contender(False, apis, args, counter),
                "native": contender(True, apis, args, counter),
            },
        )
    finally:
        apis.close()
    units = args.units * args.rounds
    print(f"claude {real_clis.version('claude')}, {units} units per contender, the model answers prose {args.prose} %")
    for name, rounds in got.items():
        reasks = sum(r["reasks"] for r in rounds)
        ok = sum(r["ok"] for r in rounds)
        calls = sum(r["calls"] for r in rounds) / units
        secs = [r["s_per_unit"] for r in rounds]
        print(
            f"  {name:<7} completed {ok}/{units}  akm parse errors {reasks} ({100 * reasks / units:.0f} %)  "
            f"model calls/unit {calls:.2f}  s/unit {statistics.median(secs):.2f} ({min(secs):.2f}-{max(secs):.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
