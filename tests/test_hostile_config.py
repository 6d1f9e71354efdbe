"""Hostile config and env files (issue 23 item 7): names end where they end; env files are what they are.

Name patterns were anchored with `$`, which also matches before a final newline: `"ci\\n"` passed as an
engine name, `"FOO\\n"` as an environment variable name and `"${KEY}\\n"` as a key reference.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from akm import api, cli
from akm.format import grammar

LLM = {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"}


def config_set(capsys, key: str, value: dict) -> tuple[int, str]:
    code = cli.main(["config", "set", key, json.dumps(value)])
    _, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize(
    "key,value,why",
    [
        ("engines.ci\n", LLM, "engine names are lower-case words"),
        ("engines.x", {**LLM, "apiKey": "${KEY}\n"}, "give the name of an environment variable"),
        ("engines.x", {**LLM, "apiKey": "$KEY\n"}, "give the name of an environment variable"),
        (
            "engines.y",
            {"kind": "agent", "platform": "claude", "envPassthrough": ["FOO\n"]},
            "'FOO\\n' is not an environment variable name",
        ),
    ],
)
def test_names_and_refs_ending_in_a_newline_are_refused(capsys, key, value, why):
    code, err = config_set(capsys, key, value)
    assert code in (2, 78) and why in err, err


def test_every_name_pattern_ends_at_the_end_of_the_text():
    patterns = [v for k, v in vars(grammar).items() if k.endswith("_RE") and hasattr(v, "pattern")]
    assert len(patterns) >= 8
    for pattern in patterns:
        assert pattern.pattern.endswith("\\Z"), pattern.pattern
    from akm import config
    from akm.engine import env_bindings

    assert config.ENGINE_NAME_RE is grammar.CONFIG_ENGINE_NAME_RE and config.ENV_NAME_RE is grammar.ENV_VAR_RE
    assert env_bindings._NAME is grammar.ENV_VAR_RE


def _env_unit(project, ref: str) -> str:
    (project / "e.md").write_text(
        f"---\nsteps:\n  - id: a\n    unit:\n      env: [{ref}]\n      exec:\n        command: "
        + json.dumps([sys.executable, "-c", "print(1)"])
        + "\n---\n\n## a\n\nx\n",
        encoding="utf-8",
    )
    res = api.run_workflow("e.md", cwd=str(project))
    assert res.run.status == "failed"
    return res.run.steps[0].notes or ""


def test_an_env_file_that_is_a_fifo_is_reported_as_one_and_never_blocks(project):
    (project / ".akm" / "env").mkdir(parents=True)
    os.mkfifo(project / ".akm" / "env" / "pipe.env")
    notes = _env_unit(project, "env/pipe")
    assert "is a FIFO (named pipe), not a regular file" in notes and "not found" not in notes


def test_an_env_file_linked_to_dev_zero_is_a_character_device(project):
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "zero.env").symlink_to("/dev/zero")
    notes = _env_unit(project, "env/zero")
    assert "is a character device, not a regular file" in notes


def test_an_env_file_over_1_mib_is_refused_read_no_further(project):
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "big.env").write_text("A=" + "x" * (1024 * 1024) + "\n", encoding="utf-8")
    assert "larger than 1048576 bytes (1 MiB)" in _env_unit(project, "env/big")
