"""Secrets across units (issue 23 item 4): every env file akm can see for a project is secret.

A unit with no `env:` that prints `.akm/env/ci.env` used to put every secret raw into the journal, status,
stdout and MCP results; a CRLF spelling of a multi-line secret and a secret inside a JSON string inside
JSON (escaped twice) leaked even from a unit that binds the file.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from akm import api, paths
from akm.dispatch.redact import redact_text, sensitive_values_from
from akm.engine.env_bindings import visible_secret_values

PEM = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"
CI_ENV = 'DEPLOY_TOKEN=tok-ci-5f3a9b2c7d\nKEY="' + PEM + '"\nQUOTED="pa\\"ss\\\\word-77"\n'
USER_ENV = "USER_SECRET=user-level-secret-42\n"
SECRETS = [
    "tok-ci-5f3a9b2c7d",
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    "BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",
    'pa"ss\\word-77',
    "user-level-secret-42",
]


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "p"
    (root / ".akm" / "env").mkdir(parents=True)
    (root / ".akm" / "env" / "ci.env").write_text(CI_ENV, encoding="utf-8")
    user_env = tmp_path / "xdg-config" / "akm" / "env"
    user_env.mkdir(parents=True)
    (user_env / "user.env").write_text(USER_ENV, encoding="utf-8")
    return root


def _journal_text() -> str:
    con = sqlite3.connect(paths.journal_path())
    try:
        return "\n".join(
            str(row) for table in ("units", "steps", "events", "runs") for row in con.execute(f"SELECT * FROM {table}")
        )
    finally:
        con.close()


def _leaks(text: str) -> list[str]:
    spellings = []
    for secret in SECRETS:
        spellings += [secret, json.dumps(secret)[1:-1], json.dumps(json.dumps(secret)[1:-1])[1:-1]]
    return [s for s in spellings if len(s) >= 8 and s in text]


PRINTER = """
import json, pathlib
env = pathlib.Path('.akm/env/ci.env').read_text()
print(env)
print(env.replace('\\n', '\\r\\n'))
value = {'k': 'tok-ci-5f3a9b2c7d', 'pem': %r, 'q': 'pa"ss\\\\word-77', 'u': 'user-level-secret-42'}
print(json.dumps({'inner': json.dumps(value)}))
print(%r.replace('\\n', '\\r\\n'))
""" % (PEM, PEM)


def test_a_unit_without_env_printing_the_env_file_leaks_nothing(project):
    (project / "printer.py").write_text(PRINTER, encoding="utf-8")
    (project / "w.md").write_text(
        "---\nsteps:\n  - id: a\n    unit:\n      exec:\n        command: "
        + json.dumps([sys.executable, "printer.py"])
        + "\n---\n\n## a\n\nx\n",
        encoding="utf-8",
    )
    res = api.run_workflow("w.md", cwd=str(project))
    assert res.run.status == "completed", res.run
    output = res.run.steps[0].output
    assert "[REDACTED]" in output and "DEPLOY_TOKEN=" in output  # names are not secret, values are
    assert _leaks(output) == []
    status = api.run_status(res.run.run_id, units=True).to_json()
    assert _leaks(json.dumps(status, ensure_ascii=False)) == []
    assert _leaks(_journal_text()) == []


SESSION_WF = "---\nsteps:\n  - id: s\n---\n\n## s\n\nDo s.\n"


def test_a_session_report_is_redacted_against_every_visible_env_file(project):
    (project / "s.md").write_text(SESSION_WF, encoding="utf-8")
    run_id = api.run_workflow("s.md", cwd=str(project)).run.run_id
    text = CI_ENV.replace("\n", "\r\n") + USER_ENV + json.dumps({"x": json.dumps({"pem": PEM})})
    api.report_unit(run_id, "s:solo", status="completed", result=text, cwd=str(project))
    assert _leaks(_journal_text()) == []
    assert _leaks(json.dumps(api.run_status(run_id, units=True).to_json())) == []


def test_an_llm_answer_is_redacted_against_every_visible_env_file(project, fake_openai, capsys, monkeypatch):
    """An LLM unit binds no env at all (it runs no process); an answer echoing a secret is scrubbed too."""
    from akm import cli

    monkeypatch.chdir(project)
    engine = {"kind": "llm", "endpoint": fake_openai.url, "model": "echo"}
    assert cli.main(["config", "set", "engines.talk", json.dumps(engine)]) == 0, capsys.readouterr()
    assert cli.main(["config", "set", "defaults.llmEngine", "talk"]) == 0, capsys.readouterr()
    (project / "l.md").write_text(
        "---\nsteps:\n  - id: a\n---\n\n## a\n\nRepeat: tok-ci-5f3a9b2c7d and user-level-secret-42\n", encoding="utf-8"
    )
    res = api.run_workflow("l.md", cwd=str(project))
    assert res.run.status == "completed", res.run
    assert "Repeat: [REDACTED] and [REDACTED]" in res.run.steps[0].output
    assert _leaks(res.run.steps[0].output) == []


@pytest.mark.parametrize(
    "text",
    [
        "a " + PEM.replace("\n", "\r\n") + " b",  # CRLF spelling of an LF secret
        "a " + PEM + " b",
        json.dumps({"s": json.dumps({"pem": PEM})}),  # a JSON string inside JSON: escaped twice
        json.dumps({"s": json.dumps({"q": 'pa"ss\\word-77'})}),
        "only the second line: BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",
    ],
)
def test_spellings_of_a_multi_line_or_quoted_secret_are_redacted(text):
    values = sensitive_values_from({"KEY": PEM, "Q": 'pa"ss\\word-77'})
    redacted = redact_text(text, values)
    assert "[REDACTED]" in redacted and _leaks(redacted) == [], redacted


def test_a_crlf_env_file_secret_is_redacted_in_its_lf_spelling():
    crlf = PEM.replace("\n", "\r\n")
    assert _leaks(redact_text("x " + PEM + " y", sensitive_values_from({"KEY": crlf}))) == []


def test_only_regular_env_files_are_read_for_redaction(project, tmp_path):
    import os

    os.mkfifo(project / ".akm" / "env" / "pipe.env")  # must not block the run
    (project / ".akm" / "env" / "zero.env").symlink_to("/dev/zero")
    (project / ".akm" / "env" / "notes.txt").write_text("NOT_A_SECRET=plain-words-here\n", encoding="utf-8")
    values = visible_secret_values(project)
    assert "tok-ci-5f3a9b2c7d" in values and "user-level-secret-42" in values
    assert "plain-words-here" not in values
