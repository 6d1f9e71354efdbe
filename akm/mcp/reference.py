"""The MCP tool reference, generated from the server itself: one contract, three readers.

`tools/list` is answered from `akm.mcp.tools.TOOLS` by the server (`akm.mcp.server.list_tools`: each tool's
input schema from its api request model). Two files are generated from the server's own answers, and
tests/test_mcp_reference.py keeps both equal to them:

* `akm/mcp/answers.json`: what `akm.mcp.handshake` answers before the SDK is loaded — the capabilities the
  SDK derives from akm's handlers (in both eras), the instructions, the server info, the protocol versions,
  the resources and the tools, each as the SDK serializes it (reading a file costs a millisecond; building
  the answers costs an import of pydantic and the SDK, most of a start);
* `spec/mcp-tools.md`: the tool reference a person reads.

Regenerate both after changing a tool: `python -m akm.mcp.reference`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
ANSWERS_JSON = Path(__file__).resolve().parent / "answers.json"
TOOLS_MD = ROOT / "spec" / "mcp-tools.md"


def tools_result() -> dict[str, Any]:
    """The `tools/list` result as the SDK puts it on the wire (a 2026 client gets the same `tools`)."""
    return {"tools": json.loads(answers()["tools"])}


def answers() -> dict[str, str]:
    """Each member of answers.json as the compact JSON the SDK writes, from the server's own answers."""
    from mcp_types import (
        Implementation,
        InitializeResult,
        ListResourcesResult,
        ListResourceTemplatesResult,
        ListToolsResult,
    )
    from mcp_types.methods import serialize_server_result
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

    from akm.mcp import server as srv
    from akm.mcp.handshake import LISTS

    def wire(method: str, result: Any, versions: tuple[str, ...] = HANDSHAKE_PROTOCOL_VERSIONS) -> dict[str, Any]:
        """The result as serialized for each of `versions`, which must agree (one early answer for them all)."""
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        shapes = {json.dumps(serialize_server_result(method, v, dumped)) for v in versions}
        if len(shapes) != 1:
            raise AssertionError(f"the SDK serializes {method} differently across protocol versions {versions}")
        out: dict[str, Any] = json.loads(shapes.pop())
        return out

    modern = tuple(MODERN_PROTOCOL_VERSIONS)
    templates = ListResourceTemplatesResult(resource_templates=srv.resource_templates())
    resources = ListResourcesResult(resources=srv.resources())
    tools = ListToolsResult(tools=srv.list_tools())
    server = srv.build_server(cwd=str(ROOT))
    try:
        options = server.create_initialization_options()
        init = wire(
            "initialize",
            InitializeResult(
                protocol_version=LATEST_HANDSHAKE_VERSION,
                capabilities=options.capabilities,
                server_info=Implementation(name=options.server_name, version=options.server_version),
                instructions=options.instructions,
            ),
        )
        discover = wire("server/discover", server.discover(MODERN_PROTOCOL_VERSIONS[-1]), modern)
    finally:
        server.drives.shutdown()
    members = {
        "capabilities": init["capabilities"],
        "discoverCapabilities": discover["capabilities"],
        "instructions": init["instructions"],
        "resourceTemplates": wire("resources/templates/list", templates)["resourceTemplates"],
        "resources": wire("resources/list", resources)["resources"],
        "serverInfo": init["serverInfo"],
        "supportedVersions": discover["supportedVersions"],
        # The 2026 era orders a tool's inputSchema keys otherwise than the 2025 models (its own list, then).
        "modernTools": wire("tools/list", tools, modern)["tools"],
        "tools": wire("tools/list", tools)["tools"],
    }
    for method, result in (("resources/templates/list", templates), ("resources/list", resources)):
        if wire(method, result, modern)[LISTS[method]] != members[LISTS[method]]:
            raise AssertionError(f"the SDK serializes {method} differently in the 2026 era")
    return {name: json.dumps(value, ensure_ascii=False, separators=(",", ":")) for name, value in members.items()}


def render_answers_json() -> str:
    """akm/mcp/answers.json: one member a line, each tool list one tool a line (a diff shows which changed);
    see `akm.mcp.handshake.answer_pieces` for how it is read."""
    compact = {"ensure_ascii": False, "separators": (",", ":")}
    lines = ["{"]
    members = answers()
    lists = [name for name in members if name in ("tools", "modernTools")]
    for name, value in members.items():
        if name not in lists:
            lines.append(f"{json.dumps(name)}:{value},")
    for n, name in enumerate(lists):
        tools = [json.dumps(tool, **compact) for tool in json.loads(members[name])]  # type: ignore[arg-type]
        lines += [
            f"{json.dumps(name)}:[",
            *[t + "," for t in tools[:-1]],
            tools[-1],
            "]," if n < len(lists) - 1 else "]",
        ]
    return "\n".join(lines + ["}"]) + "\n"


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
        return kind + _bounds(prop)
    return "any JSON value"


def _bounds(prop: dict[str, Any]) -> str:
    """ " (≥ 1, ≤ 100)": a number's bounds as the reference shows them beside its type ("" if none)."""
    bounds = [
        f"≥ {prop['minimum']}" if "minimum" in prop else "",
        f"≤ {prop['maximum']}" if "maximum" in prop else "",
    ]
    shown = ", ".join(b for b in bounds if b)
    return f" ({shown})" if shown else ""


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
        "tests/test_mcp_reference.py keeps this file, `akm/mcp/answers.json` and the server's `tools/list` equal. "
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
    for path, text in ((ANSWERS_JSON, render_answers_json()), (TOOLS_MD, render_tools_md())):
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
