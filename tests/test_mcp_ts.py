"""`akm mcp` driven by the official TypeScript MCP SDK over stdio (a second client language).

The TypeScript client validates every result's structuredContent against the tool's outputSchema, so this
catches schema drift the Python client lets through. `.ci/run` installs the SDK (tests/mcp_ts); elsewhere the
test is skipped with the command that enables it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_mcp import session_wf

HERE = Path(__file__).resolve().parent / "mcp_ts"


def _ready() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (HERE / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        return "the TypeScript SDK is not installed: run `npm ci --prefix tests/mcp_ts`"
    return None


@pytest.mark.skipif(_ready() is not None and not os.environ.get("CI"), reason=_ready() or "")
def test_typescript_sdk_client_drives_a_session_run(akm_bin, shiv_root, tmp_path, project):
    assert _ready() is None, _ready()
    session_wf(project)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SHIV_ROOT": str(shiv_root),
        "AKM_DATA_DIR": str(tmp_path / "akm-data"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
    }
    # `initialize` and `tools/list` are answered before the SDK is loaded (akm.mcp.handshake, from the request
    # models) and the SDK's own answers are compared with them: this client must not tell them apart.
    proc = subprocess.run(
        ["node", str(HERE / "client.mjs"), str(project), str(akm_bin)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{proc.stdout}{proc.stderr}"
    assert proc.stdout.strip().endswith("ok")
    assert "differs" not in proc.stderr, proc.stderr[:2000]
