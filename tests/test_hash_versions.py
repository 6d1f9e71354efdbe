"""A run keeps the unit input hash version it was created with (D2), across releases of akm.

A run journaled by an akm that hashed v4 is resumed here: its completed units are reused (not
re-dispatched, not a replay divergence), the units dispatched now are journaled with v4 hashes too,
and the session protocol briefs and accepts v4 hashes. A new run is created with v5. The "v4 run" is a
real run whose journal is rewritten to what the previous akm wrote: `runs.hash_version = 4` and each
unit row's v4 input hash.
"""

from __future__ import annotations

import json

import pytest

from akm import api
from akm.errors import UsageError
from akm.plan.identity import item_unit_id, solo_unit_id, unit_input_hash
from akm.plan.model import UNIT_HASH_VERSION, Plan
from tests.helpers import db_rows, journal_sql, py, run, steps_of, write_wf


def _as_journaled_by(run_id: str, version: int) -> dict[str, str]:
    """Rewrite the run's journal as an akm hashing `version` would have written it; each unit's hash."""
    [(plan_json, params_json)] = db_rows("SELECT plan_json, params_json FROM runs WHERE id = ?", run_id)
    plan, params = Plan.model_validate(json.loads(plan_json)), json.loads(params_json)
    hashes: dict[str, str] = {}
    for step in plan.steps:
        template = step.unit_template
        assert template is not None
        if step.root is template:
            hashes[solo_unit_id(step.step_id)] = unit_input_hash(template=template, params=params, hash_version=version)
        else:
            for item in params["xs"]:
                hashes[item_unit_id(template.id, item)] = unit_input_hash(
                    template=template, params=params, item=item, hash_version=version
                )
    con = journal_sql()
    con.execute("UPDATE runs SET hash_version = ? WHERE id = ?", (version, run_id))
    for unit_id, h in hashes.items():
        con.execute("UPDATE units SET input_hash = ? WHERE run_id = ? AND unit_id = ?", (h, run_id, unit_id))
    con.commit()
    con.close()
    return hashes


def _fan_out(project, flag):
    fails_on_c = py(
        "import json,os,sys,pathlib; i=json.loads(os.environ['AKM_ITEM']); "
        f"sys.exit(1) if i == 'c' and not pathlib.Path({str(flag)!r}).exists() else print(i)"
    )
    return write_wf(
        project,
        "v4.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              concurrency: 1  # a, b complete before c fails
              unit:
                exec: {{ command: {fails_on_c} }}
        """,
        "## each\n\nx",
    )


def test_a_new_run_hashes_v5(project):
    wf = _fan_out(project, project / "fixed")
    (project / "fixed").write_text("yes")
    res = run(wf, project, params={"xs": ["a", "b"]})
    assert res.run.status == "completed"
    assert UNIT_HASH_VERSION == 5
    assert db_rows("SELECT hash_version FROM runs") == [(5,)]
    rows = dict(db_rows("SELECT unit_id, input_hash FROM units"))
    # what _as_journaled_by computes for v5 is what the engine journaled: the rewrite below is faithful
    assert rows == _as_journaled_by(res.run.run_id, 5)


def test_a_v4_run_resumes_reusing_its_completed_units(project):
    flag = project / "fixed"
    wf = _fan_out(project, flag)
    res = run(wf, project, params={"xs": ["a", "b", "c"]})
    assert res.run.status == "failed"
    rid = res.run.run_id
    v4 = _as_journaled_by(rid, 4)
    before = {u: (status, started) for u, status, started in db_rows("SELECT unit_id, status, started_at FROM units")}
    assert sorted(s for s, _ in before.values()) == ["completed", "completed", "failed"]
    flag.write_text("yes")
    api.resume(rid)
    res2 = run(rid, project)
    assert res2.run.status == "completed", steps_of(res2)["each"]["notes"]
    assert steps_of(res2)["each"]["output"] == ["a", "b", "c"]
    for unit_id, attempts, started, input_hash in db_rows(
        "SELECT unit_id, attempts, started_at, input_hash FROM units"
    ):
        assert input_hash == v4[unit_id]  # the re-dispatched unit is journaled with the run's version too
        if before[unit_id][0] == "completed":  # reused, never redone
            assert (attempts, started) == (1, before[unit_id][1])
        else:
            assert attempts == 2
    assert db_rows("SELECT hash_version FROM runs") == [(4,)]


def test_v4_rows_in_a_v5_run_are_a_divergence(project):
    """The control: the same journal rows without the run's version are other units' results."""
    flag = project / "fixed"
    wf = _fan_out(project, flag)
    res = run(wf, project, params={"xs": ["a", "b", "c"]})
    rid = res.run.run_id
    _as_journaled_by(rid, 4)
    con = journal_sql()
    con.execute("UPDATE runs SET hash_version = 5 WHERE id = ?", (rid,))
    con.commit()
    con.close()
    flag.write_text("yes")
    api.resume(rid)
    res2 = run(rid, project)
    assert res2.run.status == "failed"
    assert "replay divergence" in steps_of(res2)["each"]["notes"]


SESSION = """
    params:
      xs: { type: array }
    steps:
      - id: each
        map:
          over: params.xs
          unit: {}
"""


def test_a_v4_session_run_briefs_and_accepts_v4_hashes(project):
    wf = write_wf(project, "s.md", SESSION, "## each\n\nSay the item.")
    res = run(wf, project, params={"xs": ["a", "b"]})
    assert res.run.status == "awaiting_session"
    rid = res.run.run_id
    v4 = _as_journaled_by(rid, 4)
    brief = api.next_brief(rid).to_json()
    assert {u["unitId"]: u["inputHash"] for u in brief["units"]} == v4
    first, second = brief["units"]
    api.report_unit(rid, first["unitId"], status="completed", result="a", cwd=str(project))
    # the first report is journaled with its v4 hash, and the second unit is still briefed with its own
    again = api.next_brief(rid).to_json()
    assert [(u["unitId"], u["inputHash"]) for u in again["units"]] == [(second["unitId"], v4[second["unitId"]])]
    api.report_unit(rid, second["unitId"], status="completed", result="b", cwd=str(project))
    assert db_rows("SELECT status FROM runs") == [("completed",)]
    assert dict(db_rows("SELECT unit_id, input_hash FROM units")) == v4


def test_a_run_of_a_newer_hash_version_is_refused_untouched(project):
    flag = project / "fixed"
    wf = _fan_out(project, flag)
    res = run(wf, project, params={"xs": ["a", "b", "c"]})
    rid = res.run.run_id
    con = journal_sql()
    con.execute("UPDATE runs SET hash_version = ? WHERE id = ?", (UNIT_HASH_VERSION + 1, rid))
    con.commit()
    con.close()
    flag.write_text("yes")
    api.resume(rid)
    before = db_rows("SELECT unit_id, status, attempts, input_hash FROM units ORDER BY unit_id")
    with pytest.raises(UsageError) as exc:
        run(rid, project)
    assert exc.value.code == "CORRUPT_RUN" and "newer akm" in exc.value.message
    assert db_rows("SELECT unit_id, status, attempts, input_hash FROM units ORDER BY unit_id") == before


WIDE = """
import sys
from akm.engine.worklist import build_work_list
from akm.plan.model import StepPlan

step = StepPlan.model_validate({
    "stepId": "fan", "title": "fan", "sequenceIndex": 0,
    "root": {"kind": "map", "id": "fan.map", "over": "params.xs", "concurrency": 2,
             "template": {"kind": "unit", "id": "fan.unit", "instructions": "x", "exec": {"command": ["true"]}}},
    "gate": {"kind": "gate", "id": "fan.gate", "stepId": "fan", "criteria": [], "maxLoops": 1},
})
params = {"xs": [f"item-{i:05d}" for i in range(3000)]}  # the v4 preimages: ~100 MB of hashing in all
wl = build_work_list(step, run_id="r", params=params, step_outputs={}, hash_version=int(sys.argv[1]))
assert len(wl.units) == 3000
print("_hashlib" in sys.modules)
"""


@pytest.mark.parametrize("version,openssl", [(5, False), (4, True)])
def test_a_wide_v5_work_list_hashes_without_openssl(version, openssl):
    """v5 hashes ~100 bytes a unit with the builtin SHA-256; only a wide v4 work list still loads OpenSSL's."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", WIDE, str(version)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(openssl)
