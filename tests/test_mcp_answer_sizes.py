"""Every answer line fits a context window (issue 37 item 2): every tool of the built `dist/akm mcp`, driven over
stdio as Claude Code drives it (the 2026-07-28 protocol), against a 1000-unit run, a 190 KB output and a 200 KB
brief; each line on the wire is at most 64 KiB, and what was cut is fetched in pages that add up to the whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from akm import api
from tests.helpers import py, write_wf
from tests.mcp_wire import McpWire, meta_2026, server_env

LINE_LIMIT = 64 * 1024
UNITS = 1000
BIG = 190 * 1024
META = meta_2026("sizes")


class Wire(McpWire):
    """`dist/akm mcp` spoken to in raw 2026-07-28 lines; each answer comes with its line's size in bytes."""

    def sized(self, method: str, **params: Any) -> tuple[dict[str, Any], int]:
        frame = self.request(method, params, meta=META)
        return frame, len(self.line_of(frame))

    def call(self, tool: str, **arguments: Any) -> tuple[dict[str, Any], int]:
        frame, size = self.sized("tools/call", name=tool, arguments=arguments)
        assert "result" in frame, frame
        return frame["result"], size


def workflows(project: Path) -> None:
    write_wf(
        project,
        "wide.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              concurrency: 16
              unit: {{ exec: {{ command: {py("import os; print('result of ' + os.environ['AKM_ITEM'] + ' ' + 'r' * 150)")} }} }}
        """,
        "## each\n\nEach.",
    )
    write_wf(
        project,
        "big.md",
        f"""
        steps:
          - id: big
            unit: {{ exec: {{ command: {py(f"print('y' * {BIG})")} }} }}
          - id: read
            inputs: [steps.big.output]
            gate: {{ max_loops: 1 }}
        """,
        "## big\n\nBig.\n\n## read\n\nSummarise the output.\n\n### gate\n\n- Short.",
    )
    write_wf(  # 40 session units with a 5 KB item each: a brief over 200 KB
        project,
        "fan.md",
        "params:\n  xs: { type: array }\nsteps:\n  - id: m\n    map: { over: params.xs }",
        "## m\n\nReview it.",
    )


def test_every_tool_answers_within_64_kib_against_a_large_run(akm_bin, shiv_root, tmp_path, project):
    workflows(project)
    env = server_env(tmp_path, shiv_root)
    wide = api.run_workflow("wide.md", params={"xs": [f"i{n:04d}" for n in range(UNITS)]}, cwd=str(project))
    assert wide.run.status == "completed"
    wire = Wire.built(akm_bin, env, project, timeout=600)
    sizes: dict[str, int] = {}

    def call(label: str, tool: str, **arguments: Any) -> dict[str, Any]:
        result, size = wire.call(tool, **arguments)
        sizes[label] = size
        assert size <= LINE_LIMIT, (label, size)
        return result

    try:
        frame, sizes["server/discover"] = wire.sized("server/discover")
        frame, sizes["tools/list"] = wire.sized("tools/list")
        assert {t["name"] for t in frame["result"]["tools"]} >= {"workflow_wait", "workflow_run"}
        rid = wide.run.run_id
        call("workflow_catalog", "workflow_catalog")
        call("workflow_lint", "workflow_lint", paths=["wide.md", "big.md", "fan.md"])
        call("workflow_list", "workflow_list")

        units = call("workflow_status units", "workflow_status", run_id=rid, units=True)["structuredContent"]
        assert units["unitsPage"]["total"] == UNITS and units["unitsPage"]["nextOffset"] == len(units["units"])
        seen = [u["unitId"] for u in units["units"]]
        while (offset := units["unitsPage"]["nextOffset"]) is not None:
            units = call("workflow_status units page", "workflow_status", run_id=rid, units=True, offset=offset)[
                "structuredContent"
            ]
            seen += [u["unitId"] for u in units["units"]]
        assert len(seen) == len(set(seen)) == UNITS  # every attempt, once, page by page
        units = call("workflow_status units 10000", "workflow_status", run_id=rid, units=True, limit=10000)
        assert units["structuredContent"]["unitsPage"]["nextOffset"] is not None  # cut to fit, the cursor says so

        events = call("workflow_events", "workflow_events", run_id=rid, limit=10000)["structuredContent"]
        assert events["hasMore"] is True and events["nextOffset"] == events["events"][-1]["id"]
        html = call("workflow_status html", "workflow_status", run_id=rid, format="html")
        link = html["content"][-1]
        assert link["type"] == "resource_link" and link["uri"] == f"akm://runs/{rid}/report.html"
        page, _ = wire.sized("resources/read", uri=link["uri"])
        assert page["result"]["contents"][0]["text"].startswith("<!DOCTYPE html>")  # read, not inlined

        run = call("workflow_run big", "workflow_run", target="big.md", timeout="120s")["structuredContent"]
        big = run["run"]["runId"]
        assert run["run"]["status"] == "awaiting_session"
        text = ""
        offset = 0
        while offset is not None:
            step = call("workflow_status step", "workflow_status", run_id=big, step="big", output_offset=offset)
            view = step["structuredContent"]["steps"][0]
            text += view["output"]
            offset = view["outputPage"]["nextOffset"]
        assert text == "y" * BIG  # the 190 KB output, whole, in pages
        brief = call("workflow_next", "workflow_next", run_id=big)["structuredContent"]
        unit = brief["units"][0]
        prompt, offset = "", 0
        while offset is not None:
            whole = call(
                "workflow_next unit", "workflow_next", run_id=big, unit_id=unit["unitId"], prompt_offset=offset
            )
            got = whole["structuredContent"]["units"][0]
            prompt += got["prompt"]
            offset = (got.get("promptPage") or {}).get("nextOffset")
        assert prompt.count("y" * 1000) == BIG // 1000
        call("workflow_wait", "workflow_wait", run_id=big, timeout="1s")
        report = call("unit_report", "unit_report", **unit["report"], result="a summary")
        assert report["structuredContent"]["brief"]["kind"] == "judge"

        fan = call(
            "workflow_run fan",
            "workflow_run",
            target="fan.md",
            params={"xs": [f"{n} " + "z" * 5000 for n in range(40)]},
        )
        fan_brief = fan["structuredContent"]["run"]["awaiting"]
        assert fan_brief["unitCount"] == 40 and len(fan_brief["units"]) < 40  # the rest follow once these are done
        assert "structuredContent" in fan and fan["content"][0]["text"].startswith("workflow_run: ")  # a summary

        call("workflow_rewind", "workflow_rewind", run_id=rid, to_step="each", redo=True)
        call("workflow_resume", "workflow_resume", run_id=big)
        call("workflow_abandon", "workflow_abandon", run_id=big)
        call("setup", "setup")
    finally:
        wire.close()
    print("\nanswer line sizes (bytes):", json.dumps(sizes, indent=1))
    assert max(sizes.values()) <= LINE_LIMIT
