"""Secrets that slipped past redaction (issue 35 item 4): a param whose value is a known secret, a secret written
literally in a workflow, a malformed or symlinked env file, spellings of a secret, and the journal file's modes.

Everything akm writes is checked, through the real CLI: the journal's bytes (`runs.params_json`, `plan_json`,
steps, events), the `params:` line, JSON output and stderr.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import unicodedata
from pathlib import Path

import pytest

from akm import api, paths
from akm.dispatch.redact import redact_text, sensitive_values_from
from tests.helpers import journal_bytes

SECRET = "hunter2-TopSecretPassphrase-77"
ENV = f"DEPLOY_TOKEN={SECRET}\n"


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "p"
    (root / ".akm" / "env").mkdir(parents=True)
    (root / ".akm" / "env" / "ci.env").write_text(ENV, encoding="utf-8")
    return root


def _everything(cli, *args: str) -> str:
    out = cli(*args)
    return out.stdout + out.stderr


def test_a_param_equal_to_a_secret_is_stored_shown_and_passed_redacted(project, cli, monkeypatch):
    seen = project / "seen.txt"
    (project / "w.md").write_text(
        "---\nparams:\n  token: { type: string }\nsteps:\n  - id: a\n    unit:\n      exec:\n        command: "
        + json.dumps([sys.executable, "-c", f"import os; open({str(seen)!r}, 'w').write(os.environ['AKM_PARAMS'])"])
        + "\n  - id: b\n---\n\n## a\n\nx\n\n## b\n\nthe calling agent's step: the run waits here\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(project)
    text = _everything(cli, "workflow", "run", "w.md", f"--token={SECRET}")
    assert "SECRET_REDACTED" in text or "hold the value of a secret" in text
    assert "params:" in text and "[REDACTED]" in text
    assert json.loads(seen.read_text()) == {"token": "[REDACTED]"}  # what was stored is what runs
    run_id = api.list_runs(cwd=str(project)).runs[0].run_id
    text += _everything(cli, "workflow", "status", run_id, "--format", "json")
    text += _everything(cli, "workflow", "status", run_id)
    text += _everything(cli, "log", "--format", "json")
    assert SECRET not in text
    assert SECRET.encode() not in journal_bytes()
    # the same start again finds its waiting run (the stored params are the redacted ones)
    again = cli("workflow", "run", "w.md", f"--token={SECRET}", "--format", "json")
    assert json.loads(again.stdout)["run"]["runId"] == run_id and SECRET not in again.stdout + again.stderr


def test_a_secret_written_in_a_workflow_is_frozen_redacted(project, cli, monkeypatch):
    seen = project / "argv.txt"
    code = f"import sys; open({str(seen)!r}, 'w').write(sys.argv[1])"
    (project / "w.md").write_text(
        "---\nsteps:\n  - id: deploy\n    unit:\n      exec:\n        command: "
        + json.dumps([sys.executable, "-c", code, f"--token={SECRET}"])
        + f"\n---\n\n## deploy\n\nDeploy with {SECRET}.\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(project)
    text = _everything(cli, "workflow", "run", "w.md", "--format", "json")
    assert "step(s) deploy" in text
    assert seen.read_text() == "--token=[REDACTED]"
    assert SECRET not in text and SECRET.encode() not in journal_bytes()


def test_a_secret_used_as_a_name_in_a_workflow_refuses_the_start(project, cli, monkeypatch):
    (project / ".akm" / "env" / "ci.env").write_text("STEP=deploy-step-77\n", encoding="utf-8")
    (project / "w.md").write_text(
        '---\nsteps:\n  - id: deploy-step-77\n    unit:\n      exec:\n        command: ["true"]\n---\n\n'
        "## deploy-step-77\n\nx\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(project)
    out = cli("workflow", "run", "w.md")
    assert out.returncode == 2 and "WORKFLOW_INVALID" in out.stderr and "as a name" in out.stderr


@pytest.mark.parametrize(
    "content",
    ["A=1\nhunter2:TopSecretPassphrase-77\n", "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/bin/sh\n"],
)
def test_a_malformed_or_symlinked_env_file_is_never_quoted(project, cli, monkeypatch, tmp_path, content):
    target = tmp_path / "elsewhere"
    target.write_text(content, encoding="utf-8")
    (project / ".akm" / "env" / "link.env").symlink_to(target)
    (project / "w.md").write_text(
        '---\nsteps:\n  - id: a\n    unit:\n      env: [env/link]\n      exec:\n        command: ["true"]\n---\n\n'
        "## a\n\nx\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(project)
    text = _everything(cli, "workflow", "run", "w.md", "--format", "json")
    run_id = api.list_runs(cwd=str(project)).runs[0].run_id
    text += _everything(cli, "workflow", "status", run_id)
    assert "link.env:" in text and "its text is not shown" in text  # the file and line are named
    for fragment in ("TopSecretPassphrase", "root:x:0", "/bin/bash", "daemon:x"):
        assert fragment not in text
        assert fragment.encode() not in journal_bytes()


@pytest.mark.parametrize(
    "spelling",
    [
        base64.b64encode(SECRET.encode()).decode(),
        base64.b64encode((SECRET + "\n").encode()).decode(),  # `echo $SECRET | base64`
        base64.urlsafe_b64encode(SECRET.encode()).decode().rstrip("="),
        SECRET.encode().hex(),
        SECRET.encode().hex().upper(),
    ],
)
def test_base64_and_hex_of_a_whole_secret_are_redacted(spelling):
    assert redact_text(f"x {spelling} y", sensitive_values_from([SECRET])) == "x [REDACTED] y"


def test_both_unicode_normal_forms_of_a_secret_are_redacted():
    secret = unicodedata.normalize("NFC", "Pässwörd-Ünïcode")
    values = sensitive_values_from([secret])
    for form in ("NFC", "NFD"):
        assert redact_text(unicodedata.normalize(form, secret), values) == "[REDACTED]"


def test_what_is_documented_as_not_redacted_is_not(tmp_path):
    """spec/engine.md "Secrets" says these are not redacted; if that changes, the spec must say so."""
    values = sensitive_values_from([SECRET])
    inside = base64.b64encode(b"prefix:" + SECRET.encode()).decode()  # the secret at an offset inside a blob
    split = SECRET[:12] + "\n" + SECRET[12:]  # wrapped by a terminal
    for text in (inside, split):
        assert redact_text(text, values) == text


def test_the_sqlite_journal_is_private(project, monkeypatch, tmp_path):
    data = tmp_path / "fresh-data"
    monkeypatch.setenv("AKM_DATA_DIR", str(data))
    old = os.umask(0o022)
    try:
        (project / "w.md").write_text(
            '---\nsteps:\n  - id: a\n    unit:\n      exec:\n        command: ["true"]\n---\n\n## a\n\nx\n',
            encoding="utf-8",
        )
        assert api.run_workflow("w.md", cwd=str(project)).run.status == "completed"
    finally:
        os.umask(old)
    journal = paths.journal_path()
    assert journal.parent == data
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    for f in data.iterdir():
        if f.name.startswith(journal.name):
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f.name
    assert {f.name for f in data.iterdir()} >= {journal.name}
