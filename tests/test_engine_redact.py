"""secrets from `env:` bindings that reach the journal in another spelling."""

from __future__ import annotations

import json

from tests.helpers import db_rows, journal_bytes, py, run, write_wf


def _state_bytes() -> bytes:
    return journal_bytes()  # the SQLite files, or the PostgreSQL schema's rows


def test_password_inside_a_bound_url_is_redacted(project):
    """spec-engine §9.1: URL userinfo of a bound value is sensitive too (drive.py ignores sensitive_values_from)."""
    password = "Sup3r-S3cret-Pw-991"
    env_dir = project / ".akm" / "env"
    env_dir.mkdir(parents=True)
    (env_dir / "db.env").write_text(f"DATABASE_URL=postgres://app:{password}@db.internal:5432/app\n")
    wf = write_wf(
        project,
        "url.md",
        f"""
        steps:
          - id: connect
            unit:
              env: [env/db]
              exec: {{ command: {py('import os,sys,urllib.parse as u; p=u.urlsplit(os.environ["DATABASE_URL"]).password; print("auth failed for app using", p); sys.exit(1)')} }}
        """,
        "## connect\n\nconnect",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    assert password not in json.dumps(res.to_json())
    assert password.encode() not in _state_bytes(), "URL password leaked into the journal"


def test_secret_escaped_in_raw_json_stdout_is_redacted(project):
    """A schema unit whose stdout fails validation journals the raw stdout, where the secret is JSON-escaped."""
    secret = "pässwörd-ÆØÅ-4471"
    env_dir = project / ".akm" / "env"
    env_dir.mkdir(parents=True)
    (env_dir / "ci.env").write_text(f"TOKEN={secret}\n", encoding="utf-8")
    wf = write_wf(
        project,
        "esc.md",
        f"""
        steps:
          - id: leak
            unit:
              env: [env/ci]
              exec: {{ command: {py('import os,json; print(json.dumps({"token": os.environ["TOKEN"]}))')} }}
              output: {{ type: object, required: [missing] }}
        """,
        "## leak\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    escaped = json.dumps(secret)[1:-1]  # p\u00e4ssw\u00f6rd-...
    assert secret.encode() not in _state_bytes(), "secret leaked verbatim"
    stored = [json.loads(r) for (r,) in db_rows("SELECT result_json FROM units") if r]
    assert stored and not any(escaped in text for text in stored), f"secret stored JSON-escaped: {stored}"
