"""End-to-end: akm driven as a user would, as real processes against a real journal."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT

PY = sys.executable


def write(project: Path, name: str, text: str) -> Path:
    p = project / name
    p.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return p


def db(akm) -> sqlite3.Connection:
    return sqlite3.connect(akm.data_dir / "akm-journal.sqlite3")


# ------------------------------------------------------------------ the zipapp


def test_zipapp_quick_start(akm_zipapp, project):
    """README's first command: the example runs to completion from the single file."""
    import shutil

    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    assert akm_zipapp("--version", check=0).stdout.strip().startswith("akm ")
    lint = akm_zipapp.json("workflow", "lint", "hello.md")
    assert lint["ok"] is True and lint["files"][0]["errors"] == []
    res = akm_zipapp.json("workflow", "run", "hello.md", "--count", "7")
    steps = {s["id"]: s for s in res["run"]["steps"]}
    assert res["run"]["status"] == "completed"
    assert steps["greet"]["output"] == [f"Hello, friend-{i}!" for i in range(1, 8)]
    assert steps["big-party"]["status"] == "completed" and steps["small-party"]["status"] == "skipped"
    status = akm_zipapp.json("workflow", "status", res["run"]["runId"], "--units")
    assert len(status["units"]) == 1 + 7 + 1 + 1
    assert all(u["status"] == "completed" and u["attempts"] == 1 for u in status["units"])


def test_cli_imports_nothing_heavy():
    heavy = ("mcp", "httpx", "pydantic", "yaml", "jsonschema", "sqlite3", "pg8000", "scramp", "asn1crypto")
    code = f"import sys, akm.cli; bad=[m for m in {heavy!r} if m in sys.modules]; print(bad)"
    out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


LINT_EVERYTHING = """\
    ---
    params:
      topics: { type: array, items: { type: string }, default: [x, y] }
      count: { type: integer, minimum: 1, default: 3 }
    defaults: { timeout: 5m, on_error: continue, llm: { temperature: 1 } }
    budget: { max_units: 20 }
    steps:
      - id: prep
        unit:
          exec: { command: [echo, hi], pass_env: [HOME] }
          retry: { max: 2, on: [timeout, non_zero_exit] }
        output: { type: string }
      - id: each
        gate: { max_loops: 2 }
        map:
          over: params.topics
          concurrency: 2
          unit: { model: m, output: { type: object, required: [line], properties: { line: { type: string } } } }
        inputs: [steps.prep.output]
        output: { type: array }
      - id: pick
        route:
          input: params.count
          when: [{ match: 1, step: small }]
          default: big
      - id: small
        unit: { exec: { command: [echo, small] } }
      - id: big
        unit: { exec: { command: [echo, big] } }
        output: { type: string }
    ---

    ## prep

    Prepare.

    ## each

    Write a line.

    ### gate

    - Each line names its topic.

    ## small

    Small.

    ## big

    Big.
    """


def test_lint_imports_no_pydantic(tmp_path):
    """Issue 10: a cold zipapp start of `workflow lint` must not compile pydantic or unpack pydantic_core.

    Linting a file using every container (params with defaults, output schemas, a gate, a map, a
    route, retries, defaults and a budget), a file with errors and a legacy file, as text and as JSON,
    leaves pydantic unimported.
    """
    write(tmp_path, "all.md", LINT_EVERYTHING)
    write(
        tmp_path,
        "bad.md",
        "---\nsteps:\n  - id: a\n    unit: { exec: { command: 'echo hi' }, timeout: 1y }\n---\n\n## b\n",
    )
    write(
        tmp_path, "old.md", "# Workflow: Old one\n\n## Step: Do a thing\nStep ID: do-it\n\n### Instructions\nDo it.\n"
    )
    code = (
        "import json, sys\n"
        "from akm.cli import main\n"
        "codes = [main(['workflow', 'lint', name, *fmt]) for name in ('all.md', 'bad.md', 'old.md', '.', 'gone.md')\n"
        "         for fmt in ([], ['--format', 'json'])]\n"
        "print(json.dumps({'codes': codes, 'loaded': sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "                  ('pydantic', 'pydantic_core', 'annotated_types', 'typing_inspection'))}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([PY, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    result = json.loads(lines[-1])
    assert result["codes"] == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1], done.stdout
    assert result["loaded"] == [], result["loaded"]
    text = done.stdout
    assert 'all.md:26: warning[missing_output_schema]: Step "small"' in text  # the only finding in all.md
    assert "1 file checked: no errors, 1 warning(s)" in text
    assert "bad.md:4:52: error[invalid_duration]" in text and '"code": "invalid_duration"' in text
    assert "old.md:1: error[legacy_format]" in text and "gone.md:1: error[unreadable_file]" in text


def test_a_run_without_params_imports_no_jsonschema_nor_platformdirs(tmp_path):
    """Issue 10: a first start pays for every module it compiles. A run of an exec workflow that declares
    no params (nor output schemas) validates nothing, so it must not import jsonschema (and its
    referencing/rpds stack); the user config dir on Linux needs no platformdirs."""
    write(tmp_path, "t.md", "---\nsteps:\n  - id: a\n    unit: { exec: { command: ['true'] } }\n---\n\n## a\n\nx\n")
    code = (
        "import json, sys\n"
        "from akm.cli import main\n"
        "code = main(['workflow', 'run', 't.md', '--format', 'json'])\n"
        "print(json.dumps({'code': code, 'loaded': sorted({m.split('.')[0] for m in sys.modules} &\n"
        "                  {'jsonschema', 'referencing', 'rpds', 'platformdirs',\n"
        "                   'pg8000', 'scramp', 'asn1crypto', 'dateutil'})}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "AKM_CONFIG_DIR")}
    env.update(PYTHONPATH=str(ROOT), AKM_DATA_DIR=str(tmp_path / "data"), HOME=str(tmp_path / "home"))
    done = subprocess.run([PY, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    expected = [] if sys.platform.startswith("linux") else ["platformdirs"]  # elsewhere platformdirs knows the dirs
    assert result == {"code": 0, "loaded": expected}, (result, done.stderr)


def test_a_run_with_params_and_schemas_imports_no_pydantic_jsonschema_nor_dataclasses(tmp_path):
    """Issue 21: `workflow run` starts like a read. The frozen plan is plain records (no pydantic), valid
    params and outputs are checked without jsonschema, the run path's records and pool need neither
    `dataclasses` (with `inspect`) nor `concurrent.futures` (with `logging`), and YAML is read without the
    parts of PyYAML a valid text does not need."""
    write(
        tmp_path,
        "t.md",
        "---\nparams:\n  xs: { type: array, items: { type: integer }, default: [1, 2, 3] }\n"
        "steps:\n  - id: a\n    map:\n      over: params.xs\n      concurrency: 2\n"
        "      unit: { exec: { command: ['true'] } }\n    output: { type: array }\n---\n\n## a\n\nx\n",
    )
    code = (
        "import json, sys\n"
        "from akm.cli import main\n"
        "code = main(['workflow', 'run', 't.md', '--format', 'json'])\n"
        "print(json.dumps({'code': code, 'loaded': sorted({m.split('.')[0] for m in sys.modules} &\n"
        "                  {'pydantic', 'pydantic_core', 'jsonschema', 'dataclasses', 'inspect', 'concurrent',\n"
        "                   'logging', 'uuid', 'pg8000', 'scramp', 'asn1crypto'}),\n"
        "                  'yamlParts': sorted(set(sys.modules) & {'yaml.reader', 'yaml.resolver', 'yaml.constructor',\n"
        "                   'yaml.loader', 'yaml.cyaml', 'yaml._yaml', 'yaml.emitter', 'yaml.representer'})}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "AKM_CONFIG_DIR")}
    env.update(PYTHONPATH=str(ROOT), AKM_DATA_DIR=str(tmp_path / "data"), HOME=str(tmp_path / "home"))
    done = subprocess.run([PY, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    # nor PyYAML's reader, resolvers, constructors or C bindings (~15 ms of regular expressions at import):
    # a valid workflow is composed by akm.format.yaml_light
    assert result == {"code": 0, "loaded": [], "yamlParts": []}, (result, done.stderr)
    again = subprocess.run(
        [PY, "-c", code.replace("'t.md'", "'t.md', '--xs', '[\"a\"]'")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "expected type integer, got string" in again.stderr, again.stderr  # a refusal is still worded


def test_a_run_leaves_no_child_unreaped_at_exit(akm, project):
    """Python's dev mode warns about a child still running at shutdown (the units' guardian was one)."""
    import shutil

    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    cmd = [PY, "-X", "dev", "-W", "error::ResourceWarning", "-m", "akm", "workflow", "run", "hello.md"]
    done = subprocess.run(cmd, cwd=project, env=akm.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


# ------------------------------------------------------------------ CLI contract


def test_lint_exit_codes_and_json_shape(akm, project):
    write(
        project,
        "good.md",
        """\
        ---
        steps:
          - id: a
            unit: { exec: { command: [echo, hi] } }
            output: { type: string }
        ---

        ## a

        Say hi.
        """,
    )
    write(
        project,
        "bad.md",
        """\
        ---
        steps:
          - id: a
            unit: { exec: { command: "echo hi" } }
        ---

        ## a

        Say hi.
        """,
    )
    ok = akm("workflow", "lint", "good.md", "--format", "json", check=0)
    assert json.loads(ok.stdout)["ok"] is True
    bad = akm("workflow", "lint", "bad.md", "good.md", "--format", "json", check=1)
    report = json.loads(bad.stdout)
    assert report["ok"] is False
    first = report["files"][0]
    assert first["path"].endswith("bad.md") and first["ok"] is False
    err = first["errors"][0]
    assert set(err) >= {"code", "message", "line"} and err["line"] == 4
    text = akm("workflow", "lint", "bad.md", check=1)
    assert "bad.md:4" in text.stdout
    (project / "empty").mkdir()
    nothing = akm("workflow", "lint", "empty", check=2)
    assert "NO_WORKFLOW_FILES" in nothing.stderr
    usage = akm("workflow", "lint", check=2)
    assert "error[" in usage.stderr and "Traceback" not in usage.stderr


def test_errors_are_clear_and_never_tracebacks(akm, project):
    missing = akm("workflow", "run", "nope.md", check=1)
    assert "error[WORKFLOW_NOT_FOUND]" in missing.stderr and "Traceback" not in missing.stderr
    unknown = akm("workflow", "status", "0" * 8 + "-0000-4000-8000-" + "0" * 12, check=1)
    assert "RUN_NOT_FOUND" in unknown.stderr
    as_json = akm("workflow", "status", "nope", "--format", "json", check=1)
    assert json.loads(as_json.stderr)["code"] == "RUN_NOT_FOUND"
    write(
        project,
        "p.md",
        """\
        ---
        params:
          count: { type: integer, minimum: 1 }
        steps:
          - id: a
            unit: { exec: { command: [echo, hi] } }
        ---

        ## a

        x
        """,
    )
    bad_param = akm("workflow", "run", "p.md", "--count", "0", check=2)
    assert "count" in bad_param.stderr
    unknown_param = akm("workflow", "run", "p.md", "--colour", "red", check=2)
    assert "UNKNOWN_FLAG" in unknown_param.stderr and "--count" in unknown_param.stderr
    # nothing was created by the refused invocations
    assert akm.json("workflow", "list")["runs"] == []


def test_status_mermaid_and_log_cursor(akm, project):
    write(
        project,
        "r.md",
        """\
        ---
        params:
          mode: { type: string }
        steps:
          - id: first
            unit: { exec: { command: [echo, one] } }
          - id: pick
            route:
              input: params.mode
              when: [{ match: a, step: a }]
              default: b
          - id: a
            unit: { exec: { command: [echo, a] } }
          - id: b
            unit: { exec: { command: [echo, b] } }
        ---

        ## first

        x

        ## pick

        ## a

        x

        ## b

        x
        """,
    )
    res = akm.json("workflow", "run", "r.md", "--mode", "zzz")
    run_id = res["run"]["runId"]
    mer = akm("workflow", "status", run_id, "--format", "mermaid", check=0).stdout
    assert mer.startswith("flowchart TD")
    assert '-- "a" -->' in mer and "default" in mer and "class s2 skipped" in mer and "class s3 completed" in mer
    page = akm.json("log", "--run", run_id, "--since", "@offset:0")
    types = [e["eventType"] for e in page["events"]]
    assert types[0] == "workflow_started" and types[-1] == "workflow_finished"
    again = akm.json("log", "--run", run_id, "--since", f"@offset:{page['nextOffset']}")
    assert again["events"] == [] and again["nextOffset"] == page["nextOffset"]
    assert akm("log", "--since", "@offset:x", check=2).returncode == 2


def test_resume_and_abandon(akm, project):
    write(
        project,
        "f.md",
        """\
        ---
        steps:
          - id: a
            unit: { exec: { command: ["false"] } }
        ---

        ## a

        x
        """,
    )
    res = akm("workflow", "run", "f.md", "--format", "json", check=1)
    run_id = json.loads(res.stdout)["run"]["runId"]
    assert akm.json("workflow", "resume", run_id)["status"] == "active"
    assert akm.json("workflow", "abandon", run_id)["status"] == "abandoned"
    again = akm("workflow", "abandon", run_id, check=2)
    assert "already abandoned" in again.stderr


def test_sigint_stops_cleanly_with_130(akm, project):
    write(
        project,
        "s.md",
        f"""\
        ---
        steps:
          - id: slow
            unit: {{ exec: {{ command: [{json.dumps(PY)}, -c, "import time; time.sleep(30)"] }} }}
        ---

        ## slow

        x
        """,
    )
    proc = akm.popen("workflow", "run", "s.md", "--format", "json")
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with db(akm) as con:
                if con.execute("SELECT count(*) FROM units WHERE status='running'").fetchone()[0]:
                    break
        except sqlite3.OperationalError:
            pass  # the journal is still being created
        time.sleep(0.05)
    run_id = akm.json("workflow", "list")["runs"][0]["runId"]
    assert [s["status"] for s in akm.json("workflow", "status", run_id)["steps"]] == ["running"]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert [s["status"] for s in akm.json("workflow", "status", run_id)["steps"]] == ["pending"]
    data = json.loads(out)
    assert data["aborted"] is True and data["run"]["status"] == "active"
    with db(akm) as con:
        assert con.execute("SELECT status, failure_reason FROM units").fetchall() == [("failed", "aborted")]
        assert con.execute("SELECT lease_holder FROM runs").fetchall() == [(None,)]


# ------------------------------------------------------------------ one driver at a time


@pytest.mark.parametrize("contenders", [2, 10])
def test_concurrent_runs_of_one_run_exactly_one_drives(akm, project, contenders):
    # The driver's slow unit holds the lease until every other contender has given up: no
    # contender can arrive after the run finished, however slowly the machine starts them.
    release = project / "release"
    hold = (
        f"import os,time\nend = time.time() + 120\n"
        f"while not os.path.exists({str(release)!r}) and time.time() < end: time.sleep(0.05)\nprint('done')"
    )
    write(
        project,
        "c.md",
        f"""\
        ---
        steps:
          - id: first
            unit: {{ exec: {{ command: [echo, go] }} }}
          - id: slow
            unit: {{ exec: {{ command: [{json.dumps(PY)}, -c, {json.dumps(hold)}] }} }}
        ---

        ## first

        x

        ## slow

        x
        """,
    )
    created = akm("workflow", "run", "c.md", "--max-steps", "1", "--format", "json", check=4)
    run_id = json.loads(created.stdout)["run"]["runId"]
    procs = [akm.popen("workflow", "run", run_id, "--format", "json") for _ in range(contenders)]
    deadline = time.time() + 120
    while time.time() < deadline and sum(p.poll() is not None for p in procs) < contenders - 1:
        time.sleep(0.05)
    release.touch()
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    winners = [r for r in results if r[0] == 0]
    losers = [r for r in results if r[0] != 0]
    assert len(winners) == 1, results
    assert all(code == 2 and "LEASE_HELD" in err and "lease holder" in err for code, _, err in losers), losers
    with db(akm) as con:
        assert con.execute("SELECT attempts FROM units WHERE unit_id='slow:solo'").fetchall() == [(1,)]


# ------------------------------------------------------------------ chaos: kill -9 at random instants

CHAOS_WF = """\
---
params:
  xs: {{ type: array }}
steps:
  - id: fan
    map:
      over: params.xs
      concurrency: 4
      unit:
        exec:
          command:
            - {py}
            - -c
            - |
              import json, os, random, time
              item = json.loads(os.environ["AKM_ITEM"])
              with open({log!r}, "a") as f:
                  f.write(item + "\\n")
              time.sleep(random.uniform(0.02, 0.12))
              print(json.dumps(item.upper()))
        output: {{ type: string }}
    output: {{ type: array }}
  - id: total
    inputs: [steps.fan.output]
    unit:
      exec:
        command: [{py}, -c, "import json,os; print(len(json.loads(os.environ['AKM_INPUTS'])['steps.fan.output']))"]
---

## fan

Upper-case one item.

## total

Count them.
"""


def _snapshot(con: sqlite3.Connection, run_id: str) -> dict[str, tuple[str, str]]:
    rows = con.execute("SELECT unit_id, status, started_at FROM units WHERE run_id = ?", (run_id,))
    return {u: (s, st) for u, s, st in rows}


def _chaos_snapshot(akm, backend: str, it: int) -> tuple[str, dict[str, tuple[str, str]]] | None:
    """(run id, every unit's status and start stamp) of iteration `it`'s run, or None before its row exists."""
    if backend == "sqlite":
        if not (akm.data_dir / "akm-journal.sqlite3").exists():
            return None
        with db(akm) as con:
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone() is None:
                return None  # killed while it created the journal: the next driver creates it again
            row = con.execute("SELECT id FROM runs WHERE workflow_path LIKE ?", (f"%chaos-{it}.md",)).fetchone()
            return None if row is None else (row[0], _snapshot(con, row[0]))
    from tests.helpers import open_at

    journal = open_at(akm.env["AKM_JOURNAL_URL"])
    try:
        row = journal.query_one("SELECT id FROM runs WHERE workflow_path LIKE ?", (f"%chaos-{it}.md",))
        if row is None:
            return None
        rows = journal.query("SELECT unit_id, status, started_at FROM units WHERE run_id = ?", (row[0],))
        return row[0], {u: (s, str(st)) for u, s, st in rows}
    finally:
        journal.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_chaos_kill_9_never_loses_or_redoes_completed_work(akm, project, backend, request):
    """kill -9 of the driver at random instants, then a resume: nothing completed is redone, nothing is lost.
    The same on the PostgreSQL journal (a fresh schema on the throwaway cluster), where a killed driver's
    connection dies mid-transaction and the next driver takes over."""
    if backend == "postgres":
        akm.env["AKM_JOURNAL_URL"] = request.getfixturevalue("pg_journal_url")
    iterations = int(os.environ.get("AKM_CHAOS_ITERATIONS", "20"))
    rng = random.Random(int(os.environ.get("AKM_CHAOS_SEED", "1234")))
    items = [f"item-{i:02d}" for i in range(16)]
    xs = json.dumps(items)
    for it in range(iterations):
        log = project / f"starts-{it}.log"
        wf = write(project, f"chaos-{it}.md", CHAOS_WF.format(py=json.dumps(PY), log=str(log)))
        in_flight_at_kills: list[set[str]] = []
        completed_seen: dict[str, str] = {}
        run_id = None
        kills = rng.choice([1, 1, 2, 3])
        for k in range(kills + 1):
            target = run_id or wf.name
            args = ["workflow", "run", target, "--format", "json"] + ([] if run_id else ["--xs", xs])
            if k < kills:
                proc = akm.popen(*args)
                time.sleep(rng.uniform(0.15, 1.0))
                proc.kill()
                proc.wait()
                proc.stdout.close()
                proc.stderr.close()
            else:
                done = akm(*args, timeout=120)
                assert done.returncode == 0, done.stderr
                result = json.loads(done.stdout)
                assert result["run"]["status"] == "completed"
            seen = _chaos_snapshot(akm, backend, it)
            if seen is None:
                continue  # killed before the run row was committed
            run_id, snap = seen
            if k < kills:
                in_flight_at_kills.append({u for u, (s, _) in snap.items() if s == "running"})
            for u, (s, started) in snap.items():
                if u in completed_seen:
                    assert started == completed_seen[u], f"completed unit {u} was dispatched again"
                if s == "completed":
                    completed_seen[u] = started
        # no result lost: every item's output is there, in order
        steps = {s["id"]: s for s in result["run"]["steps"]}
        assert steps["fan"]["output"] == [x.upper() for x in items]
        assert steps["total"]["output"] == "16"
        # only units that were in flight at a kill ran again
        starts: dict[str, int] = {}
        for line in log.read_text().split():
            starts[line] = starts.get(line, 0) + 1
        from akm.plan.identity import item_unit_id

        for item in items:
            uid = item_unit_id("fan.unit", item)
            allowed = 1 + sum(1 for s in in_flight_at_kills if uid in s)
            assert 1 <= starts.get(item, 0) <= allowed, (item, starts.get(item), in_flight_at_kills)
