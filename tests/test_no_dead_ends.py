"""No dead ends (issue 33 item 4): every state a run can stop in proposes a remedy that works.

Each case drives a run over MCP (the official Python client, `from mcp import Client`) into a terminal state —
failed, blocked, abandoned — or into an error a report meets, takes the `next` text (or the error's hint) the
agent is given, executes every tool call it proposes in order, and checks each one succeeds; then a scripted
agent does what the briefs ask, and the run must complete. A remedy that is accepted but cannot move the run
on (resuming a step that fails the same way again) fails here too: the run would never complete.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from akm import cli
from akm.mcp import build_server
from tests.helpers import write_wf

_CALL = re.compile(r"\b(workflow_\w+|unit_report)\(([^()]*)\)")


def proposed_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls a `next` text or hint proposes, in order, with their JSON arguments. Calls the agent fills
    in itself (`unit_report(**unit.report, result=...)`) and alternatives ("Alternatively …") are left out."""
    text = text.split("Alternatively", 1)[0]
    calls = []
    for name, raw in _CALL.findall(text):
        args: dict[str, Any] = {}
        try:
            for part in re.split(r",\s*(?=\w+=)", raw.strip()):
                if not part:
                    continue
                key, _, value = part.partition("=")
                args[key.strip()] = json.loads(value)
        except ValueError:
            continue  # a template for the agent, not a call
        calls.append((name, args))
    return calls


class Agent:
    """An MCP client that follows `next` and does what briefs ask with `answer(step, unit) -> result`."""

    def __init__(self, client: Client, answer: Any) -> None:
        self.c = client
        self.answer = answer

    async def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        r = await self.c.call_tool(name, args)
        assert not r.is_error, f"{name}({args}) was refused: {r.content[0].text}"
        return r.structured_content

    async def follow(self, text: str | None) -> list[str]:
        """Execute every call `text` proposes; returns their names. A call whose answer proposes more (the
        status of a stopped run: its `next`) is followed on, as an agent would."""
        assert text, "no remedy was proposed"
        calls = proposed_calls(text)
        assert calls, f"no tool call in: {text}"
        names = []
        for name, args in calls:
            answer = await self.call(name, args)
            names.append(name)
            if name == "workflow_status":
                names += await self.follow(answer["next"])
        return names

    async def refused(self, name: str, args: dict[str, Any], code: str) -> str:
        """Call a tool that must be refused with `code`; returns the hint the agent gets."""
        r = await self.c.call_tool(name, args)
        assert r.is_error and f"error[{code}]" in r.content[0].text, r.content[0].text
        return json.loads(r.content[-1].text)["hint"]

    async def finish(self, rid: str, rounds: int = 30) -> dict[str, Any]:
        """Do the briefs' work until the run completes (a run that stops again is a dead end)."""
        for _ in range(rounds):
            brief = await self.call("workflow_next", {"run_id": rid})
            if brief["kind"] == "units":
                for u in brief["units"]:
                    await self.call("unit_report", {**u["report"], "result": self.answer(brief["stepId"], u)})
                continue
            if brief["kind"] == "judge":
                await self.call("unit_report", {**brief["judge"]["report"], "verdict": {"complete": True}})
                continue
            if brief["kind"] == "done":
                return brief
            assert brief["kind"] in ("engine", "none"), brief
            res = await self.call("workflow_run", {"target": rid})
            assert res["run"]["status"] not in ("failed", "blocked", "abandoned"), (res["run"], res["next"])
        raise AssertionError(f"run {rid} did not complete")


def drive(project: Path, script: Any) -> Any:
    server = build_server(cwd=str(project))

    async def main() -> Any:
        async with Client(server) as c:
            return await script(c)

    try:
        return anyio.run(main)
    finally:
        server.drives.shutdown()


def _answer(fixed: dict[str, Any]) -> Any:
    def answer(step: str, unit: dict[str, Any]) -> Any:
        value = fixed.get(step, "done")
        return value(unit) if callable(value) else value

    return answer


# ------------------------------------------------------------------ the cases


def test_a_result_a_later_step_cannot_use_is_corrected_by_a_rewind(project):
    """The issue's case: `plan` reports `{"order": [...]}`, schema-valid; `work` fans out over
    `plan.output.ordered` and fails. The remedy names `plan`, not a resume that fails again."""
    write_wf(
        project,
        "wf.md",
        """
        steps:
          - id: plan
            output: { type: object }
          - id: work
            map: { over: steps.plan.output.ordered }
        """,
        "## plan\nOrder.\n\n## work\nDo one.",
    )

    async def script(c):
        agent = Agent(c, _answer({"plan": {"ordered": [1, 2]}}))
        run = await agent.call("workflow_run", {"target": "wf.md"})
        rid = run["run"]["runId"]
        await agent.call("unit_report", {**run["run"]["awaiting"]["units"][0]["report"], "result": {"order": [1, 2]}})
        failed = await agent.call("workflow_run", {"target": rid})
        assert failed["run"]["status"] == "failed"
        assert failed["run"]["recovery"]["action"] == "rewind" and failed["run"]["recovery"]["stepId"] == "plan"
        assert "workflow_resume" not in failed["next"]
        assert await agent.follow(failed["next"]) == ["workflow_rewind", "workflow_run"]
        done = await agent.finish(rid)
        return done

    assert drive(project, script)["kind"] == "done"


def test_a_unit_the_agent_reported_failed_is_offered_again_after_resume(project):
    write_wf(project, "wf.md", "steps:\n  - id: one\n", "## one\nDo it.")

    async def script(c):
        agent = Agent(c, _answer({}))
        run = await agent.call("workflow_run", {"target": "wf.md"})
        rid = run["run"]["runId"]
        rep = await agent.call(
            "unit_report", {**run["run"]["awaiting"]["units"][0]["report"], "status": "failed", "failure_reason": "x"}
        )
        assert rep["runStatus"] == "failed" and rep["recovery"]["action"] == "resume"
        assert await agent.follow(rep["next"]) == ["workflow_resume", "workflow_run"]
        return await agent.finish(rid)

    assert drive(project, script)["kind"] == "done"


def test_results_the_step_cannot_take_are_done_again_after_a_rewind(project):
    """Every unit completed, the step fails on their results (its output schema): a resume would reuse them
    and fail again; the remedy is a rewind of the step, whose session units are offered again."""
    write_wf(
        project,
        "wf.md",
        """
        params:
          xs: { type: array }
        steps:
          - id: each
            map: { over: params.xs }
            output: { type: array, items: { type: object, required: [ok] } }
        """,
        "## each\nCheck one.",
    )

    async def script(c):
        agent = Agent(c, _answer({"each": {"ok": True}}))
        run = await agent.call("workflow_run", {"target": "wf.md", "params": {"xs": [1, 2]}})
        rid = run["run"]["runId"]
        last = None
        for u in run["run"]["awaiting"]["units"]:
            last = await agent.call("unit_report", {**u["report"], "result": "fine"})
        assert last["runStatus"] == "failed"
        assert last["recovery"] == {
            "action": "rewind",
            "stepId": "each",
            "redo": False,
            "then": "run",
            "why": last["recovery"]["why"],
        }
        assert await agent.follow(last["next"]) == ["workflow_rewind", "workflow_run"]
        return await agent.finish(rid)

    assert drive(project, script)["kind"] == "done"


def test_an_exhausted_gate_gets_a_fresh_budget(project):
    write_wf(project, "wf.md", "steps:\n  - id: one\n    gate: { max_loops: 1 }\n", "## one\nDo.\n\n### gate\n- good")

    async def script(c):
        agent = Agent(c, _answer({}))
        run = await agent.call("workflow_run", {"target": "wf.md"})
        rid = run["run"]["runId"]
        rep = await agent.call("unit_report", {**run["run"]["awaiting"]["units"][0]["report"], "result": "x"})
        no = {"complete": False, "missing": ["good"], "feedback": "better"}
        rep = await agent.call("unit_report", {**rep["brief"]["judge"]["report"], "verdict": no})
        assert rep["runStatus"] == "blocked"
        assert await agent.follow(rep["next"]) == ["workflow_resume", "workflow_run"]
        return await agent.finish(rid)

    assert drive(project, script)["kind"] == "done"


def test_a_judge_engine_that_fails_can_be_stood_in_for(project, fake_openai, capsys):
    """A judge engine answering what is not a verdict blocks the step (fail-closed). After the proposed resume,
    the calling agent can give the verdict itself (it was NOT_AWAITING_VERDICT before)."""
    code = cli.main(
        ["config", "set", "engines.judge", json.dumps({"kind": "llm", "endpoint": fake_openai.url, "model": "plain"})]
    )
    assert code == 0 and cli.main(["config", "set", "workflow.judgeEngine", "judge"]) == 0
    capsys.readouterr()
    write_wf(project, "wf.md", "steps:\n  - id: one\n", "## one\nDo.\n\n### gate\n- good")

    async def script(c):
        agent = Agent(c, _answer({}))
        run = await agent.call("workflow_run", {"target": "wf.md"})
        rid = run["run"]["runId"]
        rep = await agent.call("unit_report", {**run["run"]["awaiting"]["units"][0]["report"], "result": "x"})
        assert rep["runStatus"] == "blocked", rep
        assert rep["recovery"]["then"] == "judge"
        assert await agent.follow(rep["next"]) == ["workflow_resume", "workflow_next"]
        brief = await agent.call("workflow_next", {"run_id": rid})
        assert brief["kind"] == "judge" and "judge engine" in brief["message"]
        return await agent.finish(rid)

    assert drive(project, script)["kind"] == "done"


def test_a_spent_budget_starts_a_new_run_from_the_old_one(project):
    wf = write_wf(
        project,
        "wf.md",
        """
        params:
          xs: { type: array }
        budget: { max_units: 2 }
        steps:
          - id: ask
          - id: each
            map: { over: params.xs }
        """,
        "## ask\nAsk.\n\n## each\nDo.",
    )

    async def script(c):
        agent = Agent(c, _answer({}))
        run = await agent.call("workflow_run", {"target": "wf.md", "params": {"xs": [1, 2]}})
        rid = run["run"]["runId"]
        await agent.call("unit_report", {**run["run"]["awaiting"]["units"][0]["report"], "result": "asked"})
        run = await agent.call("workflow_run", {"target": rid})
        units = run["run"]["awaiting"]["units"]
        await agent.call("unit_report", {**units[0]["report"], "result": "one"})
        hint = await agent.refused("unit_report", {**units[1]["report"], "result": "two"}, "BUDGET_EXCEEDED")
        assert "from_run" in hint
        status = await agent.call("workflow_status", {"run_id": rid})
        rec = status["recovery"]
        assert rec["action"] == "new_run" and rec["fromRun"] == rid and rec["params"] == {"xs": [1, 2]}
        hint = await agent.refused("workflow_run", {"target": rid}, "RUN_NOT_ACTIVE")
        wf.write_text(wf.read_text().replace("max_units: 2", "max_units: 5"))  # the change the remedy asks for
        assert await agent.follow(hint) == ["workflow_status", "workflow_run"]
        new = (await agent.call("workflow_list", {}))["runs"][0]
        assert new["runId"] != rid
        brief = await agent.call("workflow_next", {"run_id": new["runId"]})
        assert [u["context"]["item"] for u in brief["units"]] == [2]  # `ask` and item 1 were reused
        return await agent.finish(new["runId"])

    assert drive(project, script)["kind"] == "done"


def test_an_abandoned_run_is_continued_by_a_new_run(project):
    write_wf(project, "wf.md", "steps:\n  - id: a\n  - id: b\n", "## a\nA.\n\n## b\nB.")

    async def script(c):
        agent = Agent(c, _answer({}))
        run = await agent.call("workflow_run", {"target": "wf.md"})
        rid = run["run"]["runId"]
        await agent.call("unit_report", {**run["run"]["awaiting"]["units"][0]["report"], "result": "a done"})
        await agent.call("workflow_abandon", {"run_id": rid})
        hint = await agent.refused("workflow_run", {"target": rid}, "RUN_ABANDONED")
        assert await agent.follow(hint) == ["workflow_status", "workflow_run"]
        new = (await agent.call("workflow_list", {}))["runs"][0]["runId"]
        brief = await agent.call("workflow_next", {"run_id": new})
        assert brief["stepId"] == "b"  # `a` was reused
        return await agent.finish(new)

    assert drive(project, script)["kind"] == "done"


def test_a_report_for_a_finished_step_is_told_to_rewind(project):
    """STEP_CLOSED and the unknown unit after a resume (the issue's UNKNOWN_UNIT) point at the rewind that works."""
    write_wf(project, "wf.md", "steps:\n  - id: a\n  - id: b\n", "## a\nA.\n\n## b\nB.")

    async def script(c):
        agent = Agent(c, _answer({"a": "better"}))
        run = await agent.call("workflow_run", {"target": "wf.md"})
        rid = run["run"]["runId"]
        first = run["run"]["awaiting"]["units"][0]["report"]
        await agent.call("unit_report", {**first, "result": "first"})
        await agent.call("workflow_run", {"target": rid})
        for extra in ({}, {"rerun": True}):
            r = await c.call_tool("unit_report", {**first, "result": "second", **extra})
            assert r.is_error and "STEP_CLOSED" in r.content[0].text, r.content[0].text
            body = json.loads(r.content[-1].text)
            assert body["details"]["stepId"] == "a" and "workflow_rewind" in body["hint"]
        await agent.call("workflow_rewind", {"run_id": rid, "to_step": "a"})
        done = await agent.finish(rid)
        status = await agent.call("workflow_status", {"run_id": rid})
        assert status["steps"][0]["output"] == "better"
        return done

    assert drive(project, script)["kind"] == "done"


@pytest.mark.parametrize("text", ["x", "y"])
def test_proposed_calls_parse(text):
    assert proposed_calls(f'Do it. Call workflow_resume(run_id="{text}"), then workflow_run(target="{text}").') == [
        ("workflow_resume", {"run_id": text}),
        ("workflow_run", {"target": text}),
    ]
    assert proposed_calls("report it with unit_report(**judge.report, verdict={...}). Alternatively workflow_run") == []


def test_a_command_that_failed_runs_again_after_resume(project):
    """A unit failed for a cause outside the workflow (here a missing file): the remedy is a resume, which runs
    the failed unit again — and once the cause is gone, the run completes."""
    flag = project / "ready"
    cmd = json.dumps([sys.executable, "-c", f"import os, sys; sys.exit(0 if os.path.exists({str(flag)!r}) else 3)"])
    write_wf(project, "wf.md", f"steps:\n  - id: go\n    unit: {{ exec: {{ command: {cmd} }} }}\n", "## go\nGo.")

    async def script(c):
        agent = Agent(c, _answer({}))
        failed = await agent.call("workflow_run", {"target": "wf.md"})
        assert failed["run"]["status"] == "failed" and failed["run"]["recovery"]["action"] == "resume"
        flag.write_text("")
        assert await agent.follow(failed["next"]) == ["workflow_resume", "workflow_run"]
        return await agent.finish(failed["run"]["runId"])

    assert drive(project, script)["kind"] == "done"


def test_a_command_whose_output_the_step_cannot_take_needs_the_workflow_changed(project):
    """Commands that completed with an output the step refuses would print the same again: the remedy is to
    change the workflow and start a new run from the old one."""
    cmd = json.dumps([sys.executable, "-c", "print('[1, 2]')"])
    wf = write_wf(
        project,
        "wf.md",
        f"steps:\n  - id: go\n    unit: {{ exec: {{ command: {cmd} }} }}\n    output: {{ type: object }}\n",
        "## go\nGo.",
    )

    async def script(c):
        agent = Agent(c, _answer({}))
        failed = await agent.call("workflow_run", {"target": "wf.md"})
        assert failed["run"]["status"] == "failed" and failed["run"]["recovery"]["action"] == "new_run", failed
        wf.write_text(wf.read_text().replace("type: object", "type: array"))
        assert await agent.follow(failed["next"]) == ["workflow_run"]
        new = (await agent.call("workflow_list", {}))["runs"][0]
        assert new["runId"] != failed["run"]["runId"] and new["status"] == "completed"
        return await agent.finish(new["runId"])

    assert drive(project, script)["kind"] == "done"


def test_the_cli_says_the_commands_that_work(akm, project):
    """`workflow status` of a stopped run prints what moves it on, as commands; running them works."""
    import shlex

    write_wf(
        project,
        "wf.md",
        "steps:\n  - id: plan\n    output: { type: object }\n  - id: work\n    map: { over: steps.plan.output.ordered }\n",
        "## plan\nOrder.\n\n## work\nDo one.",
    )
    rid = akm.json("workflow", "run", "wf.md", check=3)["run"]["runId"]
    akm("workflow", "report", rid, "plan:solo", "--status", "completed", "--result", '{"order": [1]}', check=0)
    failed = akm("workflow", "run", rid, check=1)
    line = next(ln for ln in failed.stdout.splitlines() if ln.startswith("to go on: "))
    assert line == f"to go on: akm workflow rewind {rid} --to plan && akm workflow run {rid}", line
    for command in line.removeprefix("to go on: ").split(" && "):
        argv = shlex.split(command)
        assert argv[0] == "akm"
        akm(*argv[1:], check=3 if argv[2] == "run" else 0)  # the run now awaits the corrected report
    refused = akm("workflow", "report", rid, "work.unit:x", "--status", "completed", "--result", "x")
    assert refused.returncode == 2
    akm(
        "workflow",
        "report",
        rid,
        "plan:solo",
        "--status",
        "completed",
        "--result",
        '{"ordered": [1]}',
        "--rerun",
        check=0,
    )
    assert akm.json("workflow", "run", rid, check=3)["run"]["awaiting"]["stepId"] == "work"


def test_a_report_that_fails_the_run_says_what_moves_it_on(akm, project):
    write_wf(project, "wf.md", "steps:\n  - id: one\n", "## one\nDo it.")
    rid = akm.json("workflow", "run", "wf.md", check=3)["run"]["runId"]
    out = akm("workflow", "report", rid, "one:solo", "--status", "failed", "--failure-reason", "x", check=0)
    assert f"to go on: akm workflow resume {rid} && akm workflow run {rid}" in out.stdout, out.stdout
    akm("workflow", "resume", rid, check=0)
    brief = akm.json("workflow", "next", rid)
    assert brief["units"][0]["action"] == "rerun"
