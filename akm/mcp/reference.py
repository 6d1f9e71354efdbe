"""The MCP tool reference, generated from the tools' request and output models: one contract, three readers.

`tools/list` is answered from `akm.mcp.tools.TOOLS` by the server (`akm.mcp.server.list_tools`). Two files are
generated from that same answer, and tests/test_mcp_reference.py keeps both equal to it:

* `akm/mcp/tools.json`: the `tools/list` result, which `akm.mcp.handshake` answers with before the SDK is
  loaded (reading a file costs a millisecond; building the answer from the models costs an import of pydantic
  and the SDK, most of a start);
* `spec/mcp-tools.md`: the reference a person reads.

Regenerate both after changing a tool: `python -m akm.mcp.reference`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
TOOLS_JSON = Path(__file__).resolve().parent / "tools.json"
TOOLS_MD = ROOT / "spec" / "mcp-tools.md"


def tools_result() -> dict[str, Any]:
    """The `tools/list` result as the SDK puts it on the wire for a handshake-era client (the modern era wraps
    the same `tools` in its envelope, `akm.mcp.handshake.modern_result`)."""
    from mcp_types import ListToolsResult
    from mcp_types.methods import serialize_server_result
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    from akm.mcp.server import list_tools

    dumped = ListToolsResult(tools=list_tools()).model_dump(by_alias=True, mode="json", exclude_none=True)
    shapes = {json.dumps(serialize_server_result("tools/list", v, dumped)) for v in HANDSHAKE_PROTOCOL_VERSIONS}
    if len(shapes) != 1:  # akm.mcp.handshake answers every handshake version with one list
        raise AssertionError("the SDK serializes tools/list differently across handshake versions")
    result: dict[str, Any] = json.loads(shapes.pop())
    return result


def render_tools_json() -> str:
    """akm/mcp/tools.json: the result as compact JSON, one tool a line (a diff shows which tool changed); the
    early answer is these bytes without the newlines (no JSON string holds a raw one)."""
    compact = {"ensure_ascii": False, "separators": (",", ":")}
    tools = [json.dumps(tool, **compact) for tool in tools_result()["tools"]]  # type: ignore[arg-type]
    return '{"tools":[\n' + ",\n".join(tools) + "\n]}\n"


def _type_of(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "anyOf" in prop:
        kinds = [_type_of(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " \\| ".join(kinds) + (" \\| null" if len(kinds) < len(prop["anyOf"]) else "")
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items")
        return f"array of {_type_of(items)}" if isinstance(items, dict) and items else "array"
    if isinstance(kind, str):
        bounds = [
            f"≥ {prop['minimum']}" if "minimum" in prop else "",
            f"≤ {prop['maximum']}" if "maximum" in prop else "",
        ]
        shown = ", ".join(b for b in bounds if b)
        return kind + (f" ({shown})" if shown else "")
    return "any JSON value"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _hints(annotations: dict[str, Any]) -> str:
    words = [
        "read-only" if annotations.get("readOnlyHint") else "writes",
        *(["destructive"] if annotations.get("destructiveHint") else []),
        *(["idempotent"] if annotations.get("idempotentHint") else []),
        *(["open world"] if annotations.get("openWorldHint") else []),
    ]
    return ", ".join(words)


def render_tools_md() -> str:
    """spec/mcp-tools.md: every tool's arguments, generated from its request model."""
    from akm.mcp.tools import TOOLS

    lines = [
        "# MCP tool reference",
        "",
        "Generated from the tools' api request models (`python -m akm.mcp.reference`); "
        "tests/test_mcp_reference.py keeps this file, `akm/mcp/tools.json` and the server's `tools/list` equal. "
        "How the tools behave together: [mcp.md](mcp.md).",
        "",
        "Every argument may also be spelt in camelCase (`runId`), once; an unknown one is `INVALID_ARGUMENT`.",
        "",
    ]
    for tool in tools_result()["tools"]:
        spec = TOOLS[tool["name"]]
        schema = tool["inputSchema"]
        required = set(schema.get("required", []))
        lines += [
            f"## `{tool['name']}` — {tool['title']}",
            "",
            _cell(tool["description"]),
            "",
            f"Request model `akm.api.{spec.request.__name__}`; {_hints(tool.get('annotations') or {})}. "
            f"Answers `{{{', '.join(tool.get('outputSchema', {}).get('properties', {}))}}}`.",
            "",
            "| argument | type | default | description |",
            "|---|---|---|---|",
        ]
        for name, prop in schema.get("properties", {}).items():
            default = "required" if name in required else f"`{json.dumps(prop.get('default'))}`"
            lines.append(f"| `{name}` | {_type_of(prop)} | {default} | {_cell(prop.get('description', ''))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Write (or with --check, compare) the two generated files."""
    check = "--check" in argv
    stale = []
    for path, text in ((TOOLS_JSON, render_tools_json()), (TOOLS_MD, render_tools_md())):
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(str(path))
        if not check:
            path.write_text(text, encoding="utf-8")
    if check and stale:
        sys.stderr.write(f"stale: {', '.join(stale)} (python -m akm.mcp.reference)\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
