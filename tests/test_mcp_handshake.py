"""Issue 21 item 3: `akm mcp` answers a plain `initialize` before the SDK is imported, with the SDK's own bytes.

The server is a real process (`python -m akm mcp`); each case writes its lines and closes stdin (the server answers
what was asked, then stops). The SDK still receives the `initialize` and its answer is compared with the one sent
early: a difference is printed on stderr, which these cases require to be silent.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from akm.mcp import handshake
from akm.mcp.stdio import Prefixed
from tests.helpers import ROOT
from tests.mcp_wire import source_env


def _serve(
    tmp_path: Path, *lines: bytes, akm_bin: Path | None = None, cache: Path | None = None
) -> tuple[list[bytes], str]:
    """Serve `lines` then end of input: `python -m akm mcp`, or the built file `akm_bin` with its cache root."""
    env = source_env(tmp_path)
    if cache is not None:
        env["AKM_CACHE_DIR"] = str(cache)
    proc = subprocess.run(
        [sys.executable, *([str(akm_bin)] if akm_bin else ["-m", "akm"]), "mcp"],
        input=b"".join(line + b"\n" for line in lines),
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    return proc.stdout.splitlines(keepends=True), proc.stderr.decode("utf-8", "replace")


def _init(rid, version="2025-06-18", capabilities=None, client=None) -> bytes:
    params = {
        "protocolVersion": version,
        "capabilities": {} if capabilities is None else capabilities,
        "clientInfo": client or {"name": "t", "version": "0"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "initialize", "params": params}).encode()


INITIALIZED = b'{"jsonrpc": "2.0", "method": "notifications/initialized"}'
TOOLS = b'{"jsonrpc": "2.0", "id": "tools", "method": "tools/list"}'
# A request of the 2026-07-28 protocol as Claude Code 2.1.332 writes it (its key order, its envelope).
CLAUDE_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {
        "name": "claude-code",
        "title": "Claude Code",
        "version": "2.1.332",
        "description": "Anthropic's agentic coding tool",
        "websiteUrl": "https://claude.com/claude-code",
    },
    "io.modelcontextprotocol/clientCapabilities": {
        "roots": {"listChanged": True},
        "elicitation": {"form": {}, "url": {}},
    },
}


def _modern(rid, method: str, **params) -> bytes:
    return json.dumps(
        {"method": method, "jsonrpc": "2.0", "id": rid, "params": {"_meta": CLAUDE_META, **params}}
    ).encode()


def test_the_handshake_constants_are_the_sdks():
    import mcp_types
    from mcp_types import version

    assert handshake.HANDSHAKE_PROTOCOL_VERSIONS == version.HANDSHAKE_PROTOCOL_VERSIONS
    assert handshake.LATEST_HANDSHAKE_VERSION == version.LATEST_HANDSHAKE_VERSION
    assert handshake.MODERN_PROTOCOL_VERSIONS == version.MODERN_PROTOCOL_VERSIONS
    assert handshake.PROTOCOL_VERSION_KEY == mcp_types.PROTOCOL_VERSION_META_KEY
    assert handshake.CLIENT_INFO_KEY == mcp_types.CLIENT_INFO_META_KEY
    assert handshake.CLIENT_CAPABILITIES_KEY == mcp_types.CLIENT_CAPABILITIES_META_KEY
    assert handshake.SERVER_INFO_KEY == mcp_types.SERVER_INFO_META_KEY
    assert handshake.sdk_in_tested_range()


@pytest.mark.parametrize(
    "version, spec, meets",
    [
        ("2.3", ">=2.3.0", True),  # padded: 2.3 is 2.3.0 (it used to turn the early answer off)
        ("2.3", "<2.4", True),
        ("2.3.0", "==2.3", True),
        ("2.3.0rc1", ">=2.3.0", True),  # the release part is compared
        ("2.3.9.post2", "<2.4", True),
        ("2.4", "<2.4", False),
        ("2.4.0rc1", "<2.4", False),
        ("2.10", "<2.4", False),  # numbers, not text
        ("2.2.99", ">=2.3.0", False),
        ("3", "> 2.3", True),
        ("2.3", "<= 2.3.0.0", True),
    ],
)
def test_one_version_rule_for_the_sdk_range(version, spec, meets):
    """handshake.version_satisfies is the rule sdk_in_tested_range and tests/test_mcp_sdk_pin.py both use."""
    assert handshake.version_satisfies(version, spec) is meets


def test_the_tested_range_takes_a_short_version_and_refuses_what_it_cannot_read():
    assert handshake.in_tested_range("2.3") and handshake.in_tested_range("2.3.0")
    assert not handshake.in_tested_range("2.4") and not handshake.in_tested_range("2.2")
    for version, spec in (("v2.3", ">=2.3.0"), ("", "<2.4"), ("2.3", "~=2.3"), ("2.3", ">=x")):
        with pytest.raises(ValueError):
            handshake.version_satisfies(version, spec)


@pytest.mark.parametrize(
    "line",
    [
        _init(1),
        _init("a", "2024-11-05"),
        _init(7, "2025-11-25", {"roots": {"listChanged": True}, "sampling": {}, "elicitation": {"form": {}}}),
        _init(8, "1999-01-01", {"experimental": {"x": {"y": 1}}}, {"name": "c", "version": "1", "title": "C"}),
        _init(9, "2026-07-28"),
    ],
)
def test_a_plain_initialize_is_answered_early_with_the_sdks_bytes(tmp_path, line):
    early = handshake.early_answer(line)
    assert early is not None
    frames, stderr = _serve(tmp_path, line, INITIALIZED, TOOLS)
    assert frames[0] == early[1]  # the early answer, exactly
    assert "differs" not in stderr, stderr  # and the SDK's own answer to the same request was the same bytes
    assert [json.loads(f).get("id") for f in frames] == [json.loads(line)["id"], "tools"]  # written once
    assert len(json.loads(frames[1])["result"]["tools"]) == 13


@pytest.mark.parametrize(
    "line",
    [
        _init(1, capabilities={"roots": {"listChanged": "yes"}}),  # the SDK refuses it: no early answer
        _init(True),
        _init(2, client={"name": "t"}),
        b'{"jsonrpc": "2.0", "id": 3, "method": "ping"}',
        b'{"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {"protocolVersion": 5}}',
        b"not json",
    ],
)
def test_anything_else_first_is_left_to_the_sdk(tmp_path, line):
    assert handshake.early_answer(line) is None
    frames, stderr = _serve(tmp_path, line, _init("second"), TOOLS)
    assert "differs" not in stderr, stderr[:2000]
    assert json.loads(frames[-1])["id"] == "tools"


def test_the_rest_of_what_was_read_early_is_served_in_order():
    stream = Prefixed(b'{"a": 1}\n{"b"', io.BytesIO(b": 2}\nrest\n"))
    assert stream.readline(1 << 20) == b'{"a": 1}\n'
    assert stream.readline(3) == b'{"b'
    assert stream.readline(1 << 20) == b'": 2}\n'
    assert stream.readline(1 << 20) == b"rest\n"
    assert stream.readline(1 << 20) == b""
    assert Prefixed(b"ab", io.BytesIO(b"")).readline(2) == b"ab"


def test_the_package_and_the_handshake_import_nothing_of_the_sdk():
    """What runs before the `initialize` answer: no `mcp`, `mcp_types`, pydantic or anyio (they load after it)."""
    code = (
        "import sys, akm.cli, akm.mcp, akm.mcp.handshake as h\n"
        "assert h.early_answer(" + repr(_init(1)) + ") is not None\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types', 'pydantic', 'anyio'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("line", "plain"),
    [
        (b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}', True),
        (b'{"jsonrpc": "2.0", "id": "t-1", "method": "tools/list", "params": {}}', True),
        (b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": null}', True),
        (b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": "x"}}', False),
        (b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {}}}', False),
        (b'{"jsonrpc": "2.0", "id": "caf\\u00e9", "method": "tools/list"}', False),  # an id json.dumps escapes
        (b'{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', False),
        (b'{"jsonrpc": "2.0", "method": "tools/list"}', False),  # a notification: never answered
        (b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "extra": 1}', False),
        (b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call"}', False),
    ],
)
def test_which_tools_list_requests_are_plain(line, plain):
    assert handshake.plain_tools_list_id(line)[0] is plain


def _early_only(tmp_path: Path, *lines: bytes) -> list[bytes]:
    """What the early reader alone answers to `lines` (then end of input): a process that never loads the SDK."""
    code = (
        "import sys, akm.mcp.handshake as h\n"
        "early = h.start()\n"
        "early._thread.join(120)\n"  # read to the end of input (the SDK never takes over here)
        "assert 'mcp' not in sys.modules and 'pydantic' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=b"".join(line + b"\n" for line in lines),
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.splitlines(keepends=True)


def test_a_2026_client_is_answered_discover_and_the_lists_before_the_sdk_loads(tmp_path, akm_bin):
    """Claude Code's opening — discover twice, then resources/list and tools/list — answered by the early reader
    alone, with the SDK's bytes; the first request beyond them (a tools/call) is the SDK's."""
    lines = (
        _modern("server-discover-probe-1", "server/discover"),
        _modern(1, "server/discover"),
        _modern(2, "resources/list"),
        _modern(3, "tools/list"),
        _modern(4, "resources/templates/list"),
        _modern(5, "tools/call", name="workflow_list", arguments={}),
    )
    early = _early_only(tmp_path, *lines)
    assert [json.loads(f)["id"] for f in early] == ["server-discover-probe-1", 1, 2, 3, 4]
    discover = json.loads(early[0])["result"]
    assert discover["supportedVersions"][0] == "2026-07-28" and "2025-11-25" in discover["supportedVersions"]
    for binary in (None, akm_bin):
        frames, stderr = _serve(tmp_path, *lines, akm_bin=binary, cache=tmp_path / "cache")
        assert "differs" not in stderr, stderr[:2000]
        assert frames[:5] == early  # written once: the early answers are the SDK's own
        assert json.loads(frames[5])["result"]["structuredContent"] == {"runs": []}


def test_capabilities_are_the_same_in_both_eras_and_claim_nothing_unserved(tmp_path):
    frames = _early_only(tmp_path, _init(1, "2025-11-25"))
    legacy = json.loads(frames[0])["result"]["capabilities"]
    modern = json.loads(_early_only(tmp_path, _modern(1, "server/discover"))[0])["result"]["capabilities"]
    assert legacy == {"resources": {"listChanged": False, "subscribe": False}, "tools": {"listChanged": False}}
    assert {k: v for k, v in modern.items() if k != "extensions"} == legacy  # extensions exist in 2026 only
    assert modern["extensions"] == {"io.modelcontextprotocol/tasks": {}}  # served for workflow_run (mcp.md)


@pytest.mark.parametrize(
    "lines",
    [
        (_modern(1, "tools/list", cursor="x"),),  # a cursor: the SDK's
        (_modern(1, "server/discover"), _modern(1, "tools/list")),  # an id used twice
        (_modern(1, "server/discover"), _init(2)),  # initialize on a 2026 connection: the SDK refuses it
        (_modern(1, "ping"),),
        (
            json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {**CLAUDE_META, "x": 1}}}
            ).encode(),
        ),
    ],
)
def test_other_2026_requests_are_left_to_the_sdk(tmp_path, lines):
    early = _early_only(tmp_path, *lines)
    assert len(early) <= 1 and all(json.loads(f)["id"] == 1 for f in early)  # at most the first, never the rest
    frames, stderr = _serve(tmp_path, *lines)
    assert "differs" not in stderr, stderr[:2000]
    assert len(frames) == len(lines)  # each request answered, once


def test_tools_list_is_answered_early_from_the_models_with_the_sdks_bytes(tmp_path, akm_bin):
    """The early reader answers `tools/list` from akm/mcp/tools.json (generated from the request models) without
    the SDK, and those are the bytes the SDK answers with — from the source tree and from the built file."""
    lines = (_init(1), INITIALIZED, TOOLS)
    early = _early_only(tmp_path, *lines)
    assert [json.loads(f)["id"] for f in early] == [1, "tools"]
    assert len(json.loads(early[1])["result"]["tools"]) == 13
    for binary in (None, akm_bin):
        frames, stderr = _serve(tmp_path, *lines, akm_bin=binary, cache=tmp_path / "cache")
        assert "differs" not in stderr, stderr[:2000]
        assert frames == early  # written once: the early answers are the SDK's own


@pytest.mark.parametrize(
    "lines",
    [
        (_init(1), TOOLS, INITIALIZED),  # a request before `initialized`: the SDK judges it
        (
            _init(1),
            INITIALIZED,
            b'{"jsonrpc": "2.0", "id": "tools", "method": "tools/list", "params": {"cursor": "a"}}',
        ),
        (_init(1), INITIALIZED, b'{"jsonrpc": "2.0", "id": 5, "method": "ping"}', TOOLS),  # only the first request
        (_init(1, capabilities={"roots": {"listChanged": "yes"}}), INITIALIZED, TOOLS),  # no early initialize
        (_init("tools"), INITIALIZED, TOOLS),  # an id reused: the SDK's to refuse
    ],
)
def test_other_tools_list_requests_are_left_to_the_sdk(tmp_path, akm_bin, lines):
    early = _early_only(tmp_path, *lines)
    assert all(json.loads(f).get("result", {}).get("tools") is None for f in early)  # none answered early
    frames, stderr = _serve(tmp_path, *lines, akm_bin=akm_bin, cache=tmp_path / "cache")
    assert "differs" not in stderr, stderr[:2000]
    listed = [json.loads(f) for f in frames if json.loads(f).get("id") == "tools"]
    assert 1 <= len(listed) <= 2  # the SDK's own answer (or its error); a reused id gets one per request
