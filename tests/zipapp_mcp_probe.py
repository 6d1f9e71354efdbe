"""Runs inside dist/akm (AKM_BUNDLE_EXEC=this file): an MCP client from the bundle (`from mcp import
Client`) starts `akm mcp` from the same file over stdio, initializes, lints and runs a workflow
through the tools, and prints what came back, with where the client's heavy modules were loaded
from, as one JSON line. Arguments: the workflow file, relative to the working directory.
"""

import asyncio
import json
import os
import sys

PROBED = (
    "mcp",
    "mcp.client",
    "mcp_types",
    "pydantic_core._pydantic_core",
    "cryptography.hazmat.bindings._rust",
    "starlette",
    "uvicorn",
    "anyio",
    "httpx2",
)


async def main(workflow: str) -> None:
    import mcp.server.mcpserver  # noqa: F401  (what `akm mcp` imports, importable from the client's side too)
    import mcp.server.stdio  # noqa: F401
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    keep = ("AKM_CACHE_DIR", "SHIV_ROOT", "PATH", "HOME", "AKM_DATA_DIR", "XDG_CONFIG_HOME", "TMPDIR")
    params = StdioServerParameters(
        command=sys.executable,
        args=[os.environ["AKM_PROBE_ZIPAPP"], "mcp"],
        env={k: os.environ[k] for k in keep if k in os.environ},
        cwd=os.getcwd(),
    )
    async with Client(params) as client:
        info = client.server_info
        tools = sorted(t.name for t in (await client.list_tools()).tools)
        lint = await client.call_tool("workflow_lint", {"paths": [workflow]})
        run = await client.call_tool("workflow_run", {"target": workflow, "params": {"count": 2}})
    print(
        json.dumps(
            {
                "server_name": info.name if info else None,
                "tools": tools,
                "python": list(sys.version_info[:2]),
                "lint": {"is_error": bool(lint.is_error), "result": lint.structured_content},
                "run": {"is_error": bool(run.is_error), "result": run.structured_content},
                "origins": {name: getattr(sys.modules.get(name), "__file__", None) or "" for name in PROBED},
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
