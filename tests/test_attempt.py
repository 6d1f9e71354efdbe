"""One unit attempt (akm.engine.attempt), prepared the same way by a driver and by `akm worker`.

A driver prepares an attempt from the plan and the unit; a worker from the plan and the payload the driver
queued (`to_payload`, read back by `from_payload`). Both must give the dispatcher the same request, and the
payload must carry no secret and no path of the driver's host.
"""

from __future__ import annotations

import json

from akm.engine.attempt import PAYLOAD_VERSION, AttemptSpec, StepAttempts, from_payload, to_payload
from akm.engine.state import load_run
from akm.engine.worklist import WorkList, build_work_list
from tests.helpers import open_test_journal, run, write_wf

SECRET = "Attempt-S3cret-5521"


def _prepared_both_ways(project, unit_yaml: str, params: dict):
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "ci.env").write_text(f"TOKEN={SECRET}\n")
    engine = {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"}  # never called
    (project / ".akm" / "config.json").write_text(json.dumps({"engines": {"local": engine}}))
    wf = write_wf(
        project,
        "one.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: fan
            map:
              over: params.xs
              unit:
                {unit_yaml}
        """,
        "## fan\n\nSay {{ item }}.",
    )
    run_id = run(wf, project, params=params, max_steps=0).run.run_id
    with open_test_journal() as db:
        loaded = load_run(db, run_id)
        step = loaded.plan.steps[0]
        engines = loaded.plan.execution.engines
        wl = build_work_list(
            step, run_id=run_id, params=loaded.params, step_outputs={}, engines=engines, hash_version=1
        )
        assert isinstance(wl, WorkList)
        unit = wl.units[1]
        attempt = unit.base_id + "~r1"
        driver = StepAttempts.open(loaded.plan, step, run_id=run_id, project_root=project, params=loaded.params)
        spec = driver.spec_of(unit)
        text = to_payload(spec, scope_key="scope-1", commit="abc123")
        here = driver.prepare(unit, attempt, db=db, started_at="2026-01-01T00:00:00.000Z")
        worker = StepAttempts.open(loaded.plan, step, run_id=run_id, project_root=project)
        payload = from_payload(text)
        assert payload is not None
        there = worker.prepare(payload.spec, attempt, db=db, started_at="2026-01-01T00:00:00.000Z")
        return spec, text, payload, here.request, there.request


def _same(a, b) -> None:
    left, right = dict(vars(a)), dict(vars(b))
    left.pop("on_activity"), right.pop("on_activity")
    assert left == right


def test_an_exec_attempt_is_the_same_prepared_from_the_unit_or_its_payload(project):
    spec, text, payload, here, there = _prepared_both_ways(
        project, 'env: [env/ci]\n                exec: { command: ["echo", "hi"] }', {"xs": ["a", {"b": 2}]}
    )
    assert payload.spec == spec and (payload.scope, payload.commit) == ("scope-1", "abc123")
    assert spec.kind == "exec" and spec.exec_context["AKM_ITEM"] == '{"b":2}'
    assert SECRET not in text and str(project) not in text
    _same(here, there)
    assert here.kind == "exec" and here.cwd == str(project) and here.env_bindings == {"TOKEN": SECRET}
    assert SECRET in here.sensitive_values


def test_a_model_attempt_is_the_same_prepared_from_the_unit_or_its_payload(project):
    spec, text, payload, here, there = _prepared_both_ways(project, "engine: local", {"xs": ["a", "b"]})
    assert payload.spec == spec and spec.kind == "llm" and '"b"' in spec.prompt
    assert SECRET not in text and str(project) not in text
    _same(here, there)
    assert here.engine_name == "local" and here.engine is not None and here.prompt == spec.prompt
    assert SECRET in here.sensitive_values  # every env file the project can see is redacted, bound or not


def test_a_payload_of_another_version_or_none_is_not_read():
    assert from_payload(None) is None and from_payload("") is None and from_payload("not json") is None
    assert from_payload('{"v": %d, "kind": "exec"}' % (PAYLOAD_VERSION + 1)) is None
    back = from_payload(to_payload(AttemptSpec("u1", "agent", prompt="p", timeout_ms=5), scope_key="s", commit=None))
    assert back is not None and back.spec == AttemptSpec("u1", "agent", prompt="p", timeout_ms=5)
    assert back.commit is None
