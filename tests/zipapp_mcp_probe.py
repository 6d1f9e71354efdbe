"""Runs inside dist/akm (AKM_BUNDLE_EXEC=this file): an MCP client from the bundle starts a stdio
MCPServer from the bundle (the same file, argument `serve`), initializes, calls a tool, and prints
what came back, with where the heavy modules were loaded from, as one JSON line.

Stands in for `akm mcp` until that command exists: it proves the built file can import and run
what the MCP front needs (mcp.server.mcpserver, mcp.server.stdio, mcp.client) on this interpreter.
"""

import asyncio
import json
import os
import sys

PROBED = ("mcp", "mcp_types", "pydantic_core._pydantic_core", "cryptography.hazmat.bindings._rust", "starlette",
          "uvicorn", "anyio", "httpx2")


def origins() -> dict[str, str]:
    return {name: getattr(sys.modules.get(name), "__file__", None) or "" for name in PROBED}


def serve() -> None:
    import mcp.server.stdio  # noqa: F401  (what `akm mcp` will use)
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("akm-probe")

    @server.tool()
    def where(word: str) -> str:
        """Echo the word with the server's interpreter and module origins."""
        return json.dumps({"word": word, "python": list(sys.version_info[:2]), "origins": origins()})

    server.run()


async def call() -> None:
    import mcp.client  # noqa: F401
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = {k: os.environ[k] for k in ("SHIV_ROOT", "PATH", "HOME") if k in os.environ}
    params = StdioServerParameters(command=sys.executable, args=[os.environ["AKM_PROBE_ZIPAPP"], "serve"],
                                   env={**env, "AKM_BUNDLE_EXEC": os.path.abspath(__file__)})
    async with Client(params) as client:
        result = await client.call_tool("where", {"word": "hello"})
        info = client.server_info
    print(json.dumps({"server_name": info.name if info else None, "is_error": bool(result.is_error),
                      "server": json.loads(result.content[0].text), "client_python": list(sys.version_info[:2]),
                      "client_origins": origins()}))


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        asyncio.run(call())
