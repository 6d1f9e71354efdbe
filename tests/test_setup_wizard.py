"""The `akm setup` wizard, driven end to end in a real pseudo-terminal (pexpect).

Keys are what a user presses: arrow keys as escape sequences, Enter, Ctrl-C.
Each test waits for the text it answers, so nothing depends on timing.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests import fake_harness
from tests.fake_openai import FakeOpenAI
from tests.helpers import ROOT, running_in_ci
from tests.test_setup import KEY, SIGNAL_VARS, closed_port_url

if running_in_ci():  # the test extra installs it: CI must never pass the wizard by skipping it
    import pexpect
else:
    pexpect = pytest.importorskip("pexpect", reason="pexpect is not installed (pip install -e '.[test]')")

DOWN, UP, ENTER, CTRL_C = "\x1b[B", "\x1b[A", "\r", "\x03"


@pytest.fixture
def machine(tmp_path, project):
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in SIGNAL_VARS and not k.startswith("AKM_")}
    env.update(
        {
            "HOME": str(home),
            "PATH": str(bin_dir),
            "PYTHONPATH": str(ROOT),
            "TERM": "xterm",
            "LANG": "C.UTF-8",
            "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"),
            "AKM_DATA_DIR": str(tmp_path / "akm-data"),
            "AKM_SETUP_PROBE_URLS": closed_port_url(),
        }
    )
    env.pop("NO_COLOR", None)

    class Machine:
        config = tmp_path / "xdg-config" / "akm" / "config.json"

        def spawn(self) -> "pexpect.spawn":
            child = pexpect.spawn(
                sys.executable,
                ["-m", "akm", "setup"],
                env=env,
                cwd=str(project),
                encoding="utf-8",
                timeout=60,
                dimensions=(50, 140),
            )
            child.logfile_read = self.transcript = _Transcript()
            return child

    m = Machine()
    m.env, m.bin = env, bin_dir
    return m


class _Transcript:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, s: str) -> None:
        self.parts.append(s)

    def flush(self) -> None:
        pass

    def __str__(self) -> str:
        return "".join(self.parts)


def finish(child, status: int) -> None:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == status, child.before


def test_accept_the_recommended_config(machine):
    srv = FakeOpenAI(shape="ollama", models=["qwen2.5:7b"], behaviour={"qwen2.5:7b": "smart"})
    try:
        machine.env["AKM_SETUP_PROBE_URLS"] = srv.base
        fake_harness.install(str(machine.bin), ["claude"])
        child = machine.spawn()
        child.expect("Ollama: qwen2.5:7b at")
        child.expect("Cancel \\(write nothing\\)")
        child.send(ENTER)  # the highlighted default: accept
        child.expect("LLM units on qwen2.5:7b via Ollama")
        child.expect("Save to .*config.json\\?")
        child.send(ENTER)  # Y is the default
        child.expect("Saved ")
        finish(child, 0)
        assert json.loads(machine.config.read_text()) == {
            "engines": {
                "ollama": {
                    "kind": "llm",
                    "provider": "ollama",
                    "endpoint": srv.url,
                    "model": "qwen2.5:7b",
                    "supportsJsonSchema": True,
                },
                "claude": {"kind": "agent", "platform": "claude"},
            },
            "defaults": {"llmEngine": "ollama", "agentEngine": "claude"},
            "workflow": {"judgeEngine": "ollama"},
        }
    finally:
        srv.close()


def test_custom_endpoint_with_a_key_variable(machine):
    srv = FakeOpenAI(shape="openai", models=["coder"], behaviour={"coder": "smart"}, require_key=KEY)
    try:
        machine.env["LAB_KEY"] = KEY
        child = machine.spawn()
        child.expect("none found")
        child.expect("Cancel \\(write nothing\\)")
        child.send(DOWN + ENTER)  # adjust
        child.expect("Which LLM connection")
        child.expect("LLM units will be done by the calling agent")
        child.send(UP + ENTER)  # from the default (None) up to "Custom OpenAI-compatible endpoint"
        child.expect("Endpoint URL")
        child.sendline(f"{srv.base}/v1")
        child.expect("Model")
        child.sendline("coder")
        child.expect("API key")
        child.sendline("sk live value")  # a key value, not a name: refused
        child.expect("Use an environment variable NAME")
        child.sendline("LAB_KEY")
        child.expect("answered")
        child.expect("No agent CLI found on PATH")
        child.expect("Who judges gates")
        child.expect("The calling agent")
        child.send(ENTER)  # the LLM engine
        child.expect("LLM units on coder via a custom endpoint")
        child.expect("Save to")
        child.sendline("y")
        child.expect("Saved ")
        finish(child, 0)
        assert json.loads(machine.config.read_text()) == {
            "engines": {
                "custom": {
                    "kind": "llm",
                    "provider": "custom",
                    "endpoint": srv.url,
                    "model": "coder",
                    "apiKey": "${LAB_KEY}",
                    "supportsJsonSchema": True,
                }
            },
            "defaults": {"llmEngine": "custom"},
            "workflow": {"judgeEngine": "custom"},
        }
        assert srv.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
        assert KEY not in str(machine.transcript)
        for f in machine.config.parent.rglob("*"):
            assert not f.is_file() or KEY.encode() not in f.read_bytes()
    finally:
        srv.close()


@pytest.mark.parametrize("where", ["select", "text", "decline"])
def test_cancel_midway_leaves_the_file_untouched(machine, where):
    fake_harness.install(str(machine.bin), ["codex"])
    machine.config.parent.mkdir(parents=True)
    original = '// mine\n{"workflow": {"maxConcurrency": 3}}\n'
    machine.config.write_text(original)
    child = machine.spawn()
    child.expect("Cancel \\(write nothing\\)")
    child.send(DOWN + ENTER)
    child.expect("Which LLM connection")
    child.expect("LLM units will be done by the calling agent")
    if where == "select":
        child.send(CTRL_C)
    else:
        child.send(UP + ENTER)
        child.expect("Endpoint URL")
        if where == "text":
            child.send(CTRL_C)
        else:
            child.sendline("http://127.0.0.1:9")
            child.expect("Model")
            child.sendline("m")
            child.expect("API key")
            child.sendline("")
            child.expect("What now")
            child.expect("Use it anyway")
            child.send(DOWN + ENTER)
            child.expect("Which agent engine")
            child.expect("agent units will be done by the calling agent")
            child.send(ENTER)
            child.expect("Who judges gates")
            child.expect("The calling agent")
            child.send(ENTER)
            child.expect("Save to")
            child.sendline("n")
            child.expect("Nothing was written")
            finish(child, 0)
    if where != "decline":
        child.expect("Cancelled: nothing was written")
        finish(child, 130)
    assert machine.config.read_text() == original
    assert sorted(p.name for p in machine.config.parent.iterdir()) == ["config.json"]
