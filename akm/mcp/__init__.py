"""The MCP front (`akm mcp`): each tool is one `akm.api` call over stdio.

Like the CLI this package holds no workflow logic. It translates arguments,
runs the (blocking) api call in a worker thread, turns `AkmError` into an
`isError` result carrying the same code and message the CLI prints, and adds
its own hints — an agent is told which tool to call next, never a shell
command. `mcp` is imported only here: the CLI never pays for it.

`server` builds the server on the SDK's low-level `Server` and serves it; the
tools are in `tools`, each declared by the api request model it takes (the one
contract: its input schema and its validation), their output models in
`schemas`, the `next` of each answer in `guidance`, progress notifications in
`progress`, errors and hints in `errors`, answers made to fit a context (64 KiB a line) in `fit`, the MCP tasks extension for `workflow_run`
in `tasks` (the one module speaking protocol beyond the SDK), the background drivers in `drives`,
and `stdio` is the transport and the one module touching SDK internals.
`reference` generates the tool reference (`tools.json`, spec/mcp-tools.md)
from the models. `handshake` answers `initialize` and `tools/list` while the
SDK is still being imported (its import is most of a start), so this package's
`__init__` imports nothing of the SDK: its names are loaded from `server` on
first use.

Long runs: the server drives a run in a background thread of its own
(`akm.mcp.drives`), so a unit longer than a call finishes, once. A `workflow_run`
call waits at most its bound (default 45 s, `AKM_MCP_CALL_BOUND` or the
`timeout` argument) and returns with the run finished, awaiting the agent, or
still going (`driving: true`, per-step `progress`); the next call attaches to
the same driver. A cancelled call only stops waiting; `stop=true` stops the
driver. When the session ends (stdin closes, SIGTERM) every driver is stopped
the way a signal stops `workflow run` and waited for: the runs stay
resumable. Progress notifications (per finished unit and step) leave the
driver through a bounded mailbox, never blocking it. Nothing but protocol
frames reaches stdout: units never inherit it (their output is captured) and
logging goes to stderr.
"""

from __future__ import annotations

from typing import Any


def serve() -> int:
    """`akm mcp`: read (and answer, when it is a plain `initialize`) the first line while the SDK loads, then serve."""
    from akm.mcp import handshake

    early = handshake.start()
    try:
        from akm.mcp.server import serve as serve_server

        return serve_server(early)
    except BaseException:
        if early is not None:
            early.stop()  # reading ahead ends: nothing answered early after an error is printed
        raise


# This package's modules: `from akm.mcp import stdio` must import the module, not look it up in `server`.
_MODULES = frozenset(
    {
        "arguments",
        "drives",
        "errors",
        "fit",
        "guidance",
        "handshake",
        "progress",
        "reference",
        "schemas",
        "server",
        "stdio",
        "tasks",
        "tools",
    }
)


def __getattr__(name: str) -> Any:
    """`akm.mcp.build_server`, `akm.mcp._HINTS`, ...: the server module's names, imported on first use."""
    if name.startswith("__") or name in _MODULES:
        raise AttributeError(name)
    import importlib

    server = importlib.import_module("akm.mcp.server")
    try:
        return getattr(server, name)
    except AttributeError:
        raise AttributeError(f"module 'akm.mcp' has no attribute {name!r}") from None
