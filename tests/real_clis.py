"""The real agent CLIs from npm (tests/agent_clis, pinned by its lock file), set up as a user would.

`.ci/run` installs them (`npm ci --prefix tests/agent_clis`). Each is pointed at a loopback fake of the
model API it really speaks (tests/fake_model_apis.py) the way its documentation tells a user to:

  claude    ANTHROPIC_BASE_URL + ANTHROPIC_API_KEY
  codex     a `model_providers` entry in ~/.codex/config.toml (`wire_api = "responses"`), its key in the
            variable the entry names
  opencode  a provider with `@ai-sdk/openai-compatible` and `baseURL` in the project's opencode.json
  gemini    GEMINI_API_KEY + GOOGLE_GEMINI_BASE_URL, `security.auth.selectedType: gemini-api-key` in
            ~/.gemini/settings.json

`setup(platform, home, project, base)` writes those files under a test HOME and returns what akm's
agent engine needs: the environment to run akm with, and the engine's config (`envPassthrough` names the
variables the CLI needs beyond akm's own list, as a user would add them).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import running_in_ci

HERE = Path(__file__).resolve().parent / "agent_clis"
BIN = HERE / "node_modules" / ".bin"
PLATFORMS = ("claude", "codex", "opencode", "gemini")
KEYS = {
    "claude": "sk-ant-akm-test-9f1c2e",
    "codex": "sk-akm-codex-test-4b7d",
    "opencode": "sk-akm-opencode-test-1a2b",
    "gemini": "AIza-akm-gemini-test-77c1",
}
MODEL = {"claude": "claude-sonnet-4-6", "codex": "gpt-fake", "opencode": "fake/fake-model", "gemini": None}


def missing() -> str | None:
    """Why the real CLIs cannot run here (None: they can)."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        return "node/npm are not installed"
    absent = [p for p in PLATFORMS if not (BIN / p).exists()]
    if absent:
        return f"{', '.join(absent)} not installed: run `npm ci --prefix tests/agent_clis`"
    return None


def skip_or_fail() -> pytest.MarkDecorator:
    """Mark tests that need the real CLIs. In CI (CI=1) they must run: missing binaries fail the test.
    Elsewhere they are skipped only when npm itself is absent (else: install them, as the message says)."""
    why = missing()
    if why is None or running_in_ci():
        return pytest.mark.real_clis
    if shutil.which("npm") is None:
        return pytest.mark.skip(reason=f"the real agent CLIs need npm: {why}")
    return pytest.mark.real_clis


def require() -> None:
    """Inside a test: fail with the install command when the CLIs are missing."""
    why = missing()
    assert why is None, why


def setup(platform: str, home: Path, project: Path, base: str, *, key: str | None = None) -> dict[str, Any]:
    """Configure `platform` under `home` (and `project`) against the fake API at `base`.

    Returns {"env": variables to add to akm's environment, "engine": the agent engine's config}.
    """
    home.mkdir(parents=True, exist_ok=True)
    key = key or KEYS[platform]
    env: dict[str, str] = {"HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    engine: dict[str, Any] = {"kind": "agent", "platform": platform}
    if platform == "claude":
        env.update(ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY=key)
    elif platform == "codex":
        (home / ".codex").mkdir(exist_ok=True)
        (home / ".codex" / "config.toml").write_text(
            f'model = "{MODEL["codex"]}"\nmodel_provider = "fake"\n\n'
            f'[model_providers.fake]\nname = "fake"\nbase_url = "{base}/v1"\n'
            'env_key = "FAKE_OPENAI_KEY"\nwire_api = "responses"\n',
            encoding="utf-8",
        )
        env["FAKE_OPENAI_KEY"] = key
        engine["envPassthrough"] = ["FAKE_OPENAI_KEY"]
    elif platform == "opencode":
        (project / "opencode.json").write_text(
            json.dumps(
                {
                    "$schema": "https://opencode.ai/config.json",
                    "model": MODEL["opencode"],
                    "provider": {
                        "fake": {
                            "npm": "@ai-sdk/openai-compatible",
                            "name": "fake",
                            "options": {"baseURL": f"{base}/v1", "apiKey": "{env:FAKE_OPENAI_KEY}"},
                            "models": {"fake-model": {}},
                        }
                    },
                }
            ),
            encoding="utf-8",
        )
        # offline: no models.dev catalogue fetch (opencode would wait for it on every start)
        env.update(FAKE_OPENAI_KEY=key, OPENCODE_DISABLE_MODELS_FETCH="true", OPENCODE_DISABLE_AUTOUPDATE="true")
        engine["envPassthrough"] = ["FAKE_OPENAI_KEY", "OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_AUTOUPDATE"]
    elif platform == "gemini":
        (home / ".gemini").mkdir(exist_ok=True)
        (home / ".gemini" / "settings.json").write_text(
            json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}), encoding="utf-8"
        )
        env.update(GEMINI_API_KEY=key, GOOGLE_GEMINI_BASE_URL=base)
    else:
        raise ValueError(platform)
    return {"env": env, "engine": engine}


def version(platform: str) -> str:
    """The installed CLI's version, as its package.json says (no start-up)."""
    pkg = {
        "claude": "@anthropic-ai/claude-code",
        "codex": "@openai/codex",
        "opencode": "opencode-ai",
        "gemini": "@google/gemini-cli",
    }[platform]
    return json.loads((HERE / "node_modules" / pkg / "package.json").read_text())["version"]
