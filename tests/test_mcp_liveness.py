"""A waiting call is never silent, and never leaves the agent without the run id (issue 37 items 4 and 5).

In-process, with the official client: the first `workflow_run` of a new run answers with the run id while its
unit still runs; every call that waits sends a progress notification at least every 10 s naming the run and
what it is on; `workflow_wait` waits for a run another driver drives, and LEASE_HELD points at it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import anyio

from akm import api
from akm.mcp.progress import HEARTBEAT_S
from tests.helpers import py, write_wf
from tests.test_mcp import call, err


def held_unit(project: Path, release: Path, name: str = "held.md") -> Path:
    """A one-step workflow whose unit runs until `release` exists (so no assertion races the clock)."""
    body = (
        f"import pathlib, time; end = time.time() + 300\n"
        f"while not pathlib.Path({str(release)!r}).exists() and time.time() < end: time.sleep(0.05)\n"
        f"print('done')"
    )
    return write_wf(project, name, f"steps:\n  - id: a\n    unit: {{ exec: {{ command: {py(body)} }} }}", "## a\n\nA.")


def test_the_first_call_of_a_new_run_answers_with_its_id_and_heartbeats_meanwhile(project, tmp_path, monkeypatch):
    monkeypatch.delenv("AKM_MCP_CALL_BOUND", raising=False)  # the default bound (45 s), longer than the first answer
    release = tmp_path / "release"
    held_unit(project, release)
    seen: list[tuple[float, float, str]] = []

    async def script(c):
        async def cb(p, total, msg):
            seen.append((time.monotonic(), p, msg))

        t0 = time.monotonic()
        first = await c.call_tool("workflow_run", {"target": "held.md"}, progress_callback=cb)
        first_s = time.monotonic() - t0
        release.write_text("go")
        rid = first.structured_content["run"]["runId"]
        last = await c.call_tool("workflow_run", {"target": rid, "timeout": "120s"})
        return first, first_s, t0, last

    first, first_s, t0, last = call(project, script)
    body = first.structured_content
    assert body["run"]["status"] == "active" and body["driving"] is True  # answered while the unit still ran
    assert first_s < 45  # not the whole bound: the first answer of a new run comes at ~10 s
    rid = body["run"]["runId"]
    beats = [(at, m) for at, _, m in seen if m.startswith(f"run {rid}: ")]
    assert beats, seen
    assert "step a running (0/1 units done)" in beats[0][1] and "waited" in beats[0][1]
    gaps = [b - a for a, b in zip([t0] + [at for at, _ in beats], [at for at, _ in beats], strict=False)]
    assert max(gaps) < 10 + HEARTBEAT_S, gaps  # at least every 10 s (generous on a busy machine)
    values = [p for _, p, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values)  # progress only ever increases
    assert last.structured_content["run"]["status"] == "completed"


def test_workflow_wait_waits_for_a_run_driven_elsewhere_and_lease_held_names_it(project, tmp_path, monkeypatch):
    monkeypatch.setenv("AKM_MCP_CALL_BOUND", "120")
    release = tmp_path / "release"
    held_unit(project, release)
    opened = api.open_run("held.md", cwd=str(project))
    elsewhere = threading.Thread(target=api.run_workflow, args=(opened.run_id,), kwargs={"cwd": str(project)})
    elsewhere.start()  # another driver (as a detached `workflow run` or another session would be)
    deadline = time.monotonic() + 60
    while api.run_status(opened.run_id).engine_lease is None and time.monotonic() < deadline:
        time.sleep(0.05)
    messages: list[str] = []

    async def script(c):
        held = await c.call_tool("workflow_run", {"target": opened.run_id})
        short = await c.call_tool("workflow_wait", {"run_id": opened.run_id, "timeout": "1s"})

        async def cb(p, total, msg):
            messages.append(msg)

        async def let_go():
            # release the unit once the wait has sent a heartbeat (the event, not HEARTBEAT_S + 2 s: a loaded
            # box can send it later, and a run that completes first leaves no heartbeat to assert on)
            deadline = time.monotonic() + 120
            while not any(m.startswith(f"run {opened.run_id}: active at step a") for m in messages):
                assert time.monotonic() < deadline, f"no heartbeat of the wait within 120 s: {messages}"
                await anyio.sleep(0.1)
            release.write_text("go")

        async with anyio.create_task_group() as tg:
            tg.start_soon(let_go)
            waited = await c.call_tool("workflow_wait", {"run_id": opened.run_id[:8]}, progress_callback=cb)
        return held, short, waited

    try:
        held, short, waited = call(project, script)
    finally:
        release.write_text("go")
        elsewhere.join(120)
    e = err(held)
    assert e["code"] == "LEASE_HELD" and "workflow_wait(run_id=" in e["hint"]
    assert short.structured_content["timedOut"] is True and "workflow_wait" in short.structured_content["next"]
    assert short.structured_content["run"]["status"] == "active"
    body = waited.structured_content
    assert body["run"]["status"] == "completed" and body["timedOut"] is False and body["next"] is None
    assert any(m.startswith(f"run {opened.run_id}: active at step a") for m in messages), messages
    assert json.loads(waited.content[0].text) == body
