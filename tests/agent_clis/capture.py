"""Capture what the real agent CLIs print, for the fake CLIs to replay (tests/fake_harness.py).

    .venv/bin/python -m tests.agent_clis.capture            # all four; rewrites tests/agent_clis/captured/

Each case runs the real CLI (installed here by `npm ci --prefix tests/agent_clis`) with the argv akm
builds for it (akm.dispatch.harnesses.build), configured as tests/real_clis.py does, against the loopback
model API fake in one scenario, and keeps its stdout, stderr and exit status. A case marked `cut` is a CLI
that would retry for minutes: it is stopped after `seconds` and keeps what it printed until then.

What differs from run to run is replaced by placeholders the fake fills in: the project directory
(@@CWD@@), the HOME (@@HOME@@), the API's base URL (@@BASE@@) and the answer (@@ANSWER@@ inside a JSON
string, @@ANSWER_JSON@@ where a CLI re-printed it as a JSON value). Re-run this after bumping a CLI in
package.json; tests/test_agent_clis_real.py checks that every capture comes from the version it pins.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from akm.dispatch import harnesses as hz
from tests import real_clis
from tests.fake_model_apis import DEFAULT_ANSWER, FakeModelApis

OUT = Path(__file__).resolve().parent / "captured"
PROMPT = 'Answer with the JSON object {"ok": true} and nothing else.'
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}

# Each CLI's session id in the captures (the real one differs per run; tests compare against these).
SESSIONS = {
    "claude": "5f0c7a9e-2b1d-4e8a-9c3f-akmcapture01",
    "codex": "01a24d93-9e5b-73d1-a386-akmcapture02",
    "opencode": "ses_akmcapture03OhrNJmCge5xwp",
    "gemini": "9a1e6c2d-7f3b-4d8e-b5a0-akmcapture04",
}

# (case, scenario, extra environment, stop after seconds or None, with the output schema)
CASES: dict[str, list[tuple[str, str, dict[str, str], float | None, bool]]] = {
    "claude": [
        ("ok", "ok", {}, None, False),
        ("ok-schema", "ok", {}, None, True),
        ("api-401", "401", {"CLAUDE_CODE_MAX_RETRIES": "0"}, None, False),
        ("retry-401", "401", {"CLAUDE_CODE_MAX_RETRIES": "1"}, None, False),
        ("api-429", "429", {"CLAUDE_CODE_MAX_RETRIES": "0"}, None, False),
        ("api-500", "500", {"CLAUDE_CODE_MAX_RETRIES": "0"}, None, False),
    ],
    "codex": [
        ("ok", "ok", {}, None, False),
        ("api-401", "401", {}, None, False),
        ("api-429", "429", {}, None, False),
        ("api-500", "500", {}, 30.0, False),
    ],
    "opencode": [
        ("ok", "ok", {}, None, False),
        ("api-401", "401", {}, None, False),
        ("api-429", "429", {}, None, False),
        ("retry-500", "500", {}, 25.0, False),
    ],
    "gemini": [
        ("ok", "ok", {}, None, False),
        ("api-401", "401", {}, None, False),
        ("retry-429", "429", {}, 15.0, False),
        ("untrusted", "ok", {"GEMINI_CLI_TRUST_WORKSPACE": "false"}, None, False),
    ],
}


RETRY_MARKS = ("Attempt ", 'message="stream error"')


def _normalize(text: str, subs: list[tuple[str, str]]) -> str:
    for real, placeholder in subs:
        text = text.replace(real, placeholder)
    return text


def capture(platform: str, case: str, scenario: str, extra: dict[str, str], cut: float | None, schema: bool) -> dict:
    api = FakeModelApis()
    try:
        with tempfile.TemporaryDirectory(prefix=f"akm-capture-{platform}-") as tmp:
            home, project = Path(tmp) / "home", Path(tmp) / "project"
            project.mkdir()
            base = api.base(f"{scenario}.capture")
            conf = real_clis.setup(platform, home, project, base)
            profile = hz.PROFILES[platform]
            built = hz.build(
                platform,
                hz.Call(
                    bin=str(real_clis.BIN / platform),
                    args=list(profile.base_args),
                    prompt=PROMPT,
                    model=real_clis.MODEL[platform] if platform != "opencode" else None,
                    schema=SCHEMA if schema else None,
                    schema_path=str(Path(tmp) / "schema.json"),
                ),
            )
            if built.schema_file:
                Path(built.schema_file[0]).write_text(built.schema_file[1])
            env = {"LANG": "C.UTF-8", "TERM": "dumb", **conf["env"], **built.env}
            for k, v in built.env_defaults.items():
                env.setdefault(k, v)
            env.update(extra)
            started = time.monotonic()
            proc = subprocess.Popen(
                built.argv,
                cwd=project,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            try:
                out, err = proc.communicate(timeout=cut or 180)
                code: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                code = None
            seconds = round(time.monotonic() - started, 1)
            answer = json.dumps(DEFAULT_ANSWER)[1:-1]
            stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
            session = hz.extract(platform, stdout, stderr).session_id
            logged = re.search(r"\bsession\.id=(\S+)", stderr)  # opencode's error log, when it printed nothing else
            session = session or (logged.group(1) if logged else None)
            subs = [(session, SESSIONS[platform])] if session else []
            subs += [
                (base, "@@BASE@@"),
                (str(project.resolve()), "@@CWD@@"),
                (str(project), "@@CWD@@"),
                (str(home), "@@HOME@@"),
                (answer, "@@ANSWER@@"),
                (json.dumps(json.loads(DEFAULT_ANSWER), separators=(",", ":")), "@@ANSWER_JSON@@"),
            ]
            return {
                "platform": platform,
                "version": real_clis.version(platform),
                "case": case,
                "scenario": scenario,
                "exit": code,
                "cut_after_s": cut if code is None else None,
                "seconds": seconds,
                "stdout": _normalize(stdout, subs),
                "stderr": _normalize(stderr, subs),
            }
    finally:
        api.close()


def main(argv: list[str]) -> int:
    real_clis.require()
    platforms = argv or list(CASES)
    for platform in platforms:
        (OUT / platform).mkdir(parents=True, exist_ok=True)
        for case, scenario, extra, cut, schema in CASES[platform]:
            got: dict[str, Any] = capture(platform, case, scenario, extra, cut, schema)
            if cut is not None and not any(mark in got["stderr"] for mark in RETRY_MARKS):
                raise SystemExit(f"{platform} {case}: no retry was printed within {cut} s; capture it again")
            (OUT / platform / f"{case}.json").write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
            print(f"{platform} {case}: exit {got['exit']} in {got['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
