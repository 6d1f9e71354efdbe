"""One contract per tool: the api request model. The schema a client sees, the validation a call meets, the early
answers (akm/mcp/answers.json) and the reference in spec/mcp-tools.md all come from it."""

from __future__ import annotations

import json

import anyio
from mcp import Client

from akm.api import _models
from akm.engine.budget import MAX_UNIT_TOKENS
from akm.mcp import build_server, handshake, reference
from akm.mcp.tools import TOOLS


def test_the_generated_reference_files_are_current():
    assert reference.ANSWERS_JSON.read_text(encoding="utf-8") == reference.render_answers_json(), (
        "akm/mcp/answers.json is stale: python -m akm.mcp.reference"
    )
    assert reference.TOOLS_MD.read_text(encoding="utf-8") == reference.render_tools_md(), (
        "spec/mcp-tools.md is stale: python -m akm.mcp.reference"
    )


def test_what_a_client_lists_is_the_generated_reference(project):
    server = build_server(cwd=str(project))

    async def main():
        async with Client(server) as client:
            return (await client.list_tools()).tools

    try:
        tools = anyio.run(main)
    finally:
        server.drives.shutdown()
    listed = [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools]
    assert listed == reference.tools_result()["tools"]
    assert handshake.tools_list_result() == json.dumps(
        reference.tools_result(), ensure_ascii=False, separators=(",", ":")
    ).encode("utf-8")


def test_each_tool_takes_exactly_its_request_models_fields():
    """No field table: a tool's arguments are its request model's fields, no more and no fewer."""
    listed = {t["name"]: t for t in reference.tools_result()["tools"]}
    assert list(listed) == list(TOOLS)
    for name, tool in TOOLS.items():
        assert issubclass(tool.request, _models.Request), name
        assert set(listed[name]["inputSchema"]["properties"]) == set(tool.request.model_fields), name


def test_the_bound_a_client_sees_is_the_bound_a_call_meets(project):
    """`tokens` once had `le=MAX_REPORT_TOKENS` in the enforced schema only: one model, one bound."""
    schema = TOOLS["unit_report"].input_schema()
    assert schema["properties"]["tokens"]["anyOf"][0]["maximum"] == MAX_UNIT_TOKENS
    server = build_server(cwd=str(project))

    async def main():
        async with Client(server) as client:
            args = {"run_id": "00000000-0000-4000-8000-000000000000", "unit_id": "a:solo"}
            over = await client.call_tool("unit_report", {**args, "tokens": MAX_UNIT_TOKENS + 1})
            at = await client.call_tool("unit_report", {**args, "tokens": MAX_UNIT_TOKENS})
            return over, at

    try:
        over, at = anyio.run(main)
    finally:
        server.drives.shutdown()
    assert json.loads(over.content[-1].text)["code"] == "INVALID_ARGUMENT"
    assert json.loads(at.content[-1].text)["code"] == "RUN_NOT_FOUND"  # the bound itself is taken


def test_the_tool_list_fits_an_answer_line_in_both_eras():
    """tools/list is an answer like any other: within 64 KiB on the wire (issue 37), with room to grow."""
    for modern in (False, True):
        result = handshake.list_result("tools/list", modern=modern)
        assert result is not None and len(result) + 100 <= 60 * 1024, len(result or b"")
