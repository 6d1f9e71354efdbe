"""Parity (spec §4): the same plan driven natively and driven by session reports ends in the same unit graph.

Each scenario runs twice, in separate journals, from the same workflow and params:

(a) native — the drive loop dispatches every unit through a fake dispatcher that
    returns the scenario's outcome for the unit (and a fake judge engine for gates);
    what it parks for the agent (a gate with no judge engine, units it has no
    dispatcher for) the scripted agent of (b) reports, and the drive goes on;
(b) reported — a scripted agent reads `next`, reports each unit's outcome (and each
    verdict), and calls `workflow run` whenever the brief says akm goes on.

Both must produce identical canonical graphs (dispatch units collapsed over `~r`
retries with the tokens of all their attempts summed, gate rows, step statuses/outputs/evidence/route
decisions/summaries/notes, the event log by type, the final run status and detail). A self-check proves the
comparison can fail.

Both drivers apply `finalize.decide_step`'s decisions through `engine/apply.py`; the scenarios cover every
kind: advance (complete), retry (an artifact missing its schema), gate pass / reject / loop / exhausted
(engine-judged and agent-judged), fail (a unit, fail-fast, an exhausted schema loop), block (a judge that
fails, an exhausted gate), map fan-out reduced (collect, vote, on_error continue), route, and the
awaiting-session parks (a verdict the agent gives, units no dispatcher of the native driver runs: there the
native driver parks and the agent reports, as for (b)).
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from akm import api
from akm.canonical import canonical_json
from akm.dispatch.base import DispatcherRegistry
from akm.dispatch.types import DispatchResult
from akm.engine import session
from akm.engine.drive import DriveOptions, drive_run
from akm.errors import AkmError
from akm.plan.identity import base_of_attempt
from akm.store import runs as runs_store
from tests.helpers import create_run, open_test_journal, write_wf

JUDGE = "fakejudge"


@dataclass
class Scenario:
    name: str
    frontmatter: str
    body: str
    params: dict[str, Any] = field(default_factory=dict)
    # unit content id -> outcomes, consumed in order across attempts and loops
    outcomes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    verdicts: list[Any] = field(default_factory=list)  # judge answers in order (text or raise)
    engine_judge: bool = False  # False: a gate's verdict comes from the agent (the run awaits the session)
    native_session_units: bool = False  # True: the native driver has no dispatcher for session units either


def ok(value: Any = None, tokens: int | None = None) -> dict[str, Any]:
    return {"ok": True, "value": value, "tokens": tokens}


def fail(reason: str, text: str = "boom", tokens: int | None = None) -> dict[str, Any]:
    return {"ok": False, "reason": reason, "text": text, "tokens": tokens}


class Outcomes:
    def __init__(self, sc: Scenario) -> None:
        self.left = {k: list(v) for k, v in sc.outcomes.items()}
        self.verdicts = list(sc.verdicts)
        self.lock = threading.Lock()

    def next(self, unit_id: str) -> dict[str, Any]:
        with self.lock:
            queue = self.left[unit_id]
            return queue.pop(0) if len(queue) > 1 else queue[0]

    def verdict(self) -> Any:
        with self.lock:
            return self.verdicts.pop(0)


class FakeUnits:
    kind = "session"

    def __init__(self, outcomes: Outcomes) -> None:
        self.o = outcomes

    def dispatch(self, request, cancel, feedback=None):
        out = self.o.next(request.unit_id)
        if out["ok"]:
            v = out["value"]
            text = v if isinstance(v, str) or v is None else json.dumps(v)
            return DispatchResult(ok=True, text=text, tokens=out["tokens"])
        return DispatchResult(ok=False, failure_reason=out["reason"], error=out["text"], tokens=out["tokens"])


class FakeJudge:
    kind = JUDGE

    def __init__(self, outcomes: Outcomes) -> None:
        self.o = outcomes

    def dispatch(self, request, cancel, feedback=None):
        answer = self.o.verdict()
        if isinstance(answer, Exception):
            raise answer
        return DispatchResult(ok=True, text=answer if isinstance(answer, str) else json.dumps(answer))


def _start(project: Path, sc: Scenario) -> str:
    wf = write_wf(project, f"{sc.name}.md", sc.frontmatter, sc.body)
    plan, _ = api.compile_workflow_file(wf)
    if sc.engine_judge:
        from akm.plan.model import Invocation

        steps = [
            s.model_copy(update={"gate": s.gate.model_copy(update={"judge": Invocation(engine=JUDGE)})})
            for s in plan.steps
        ]
        execution = plan.execution.model_copy(update={"engines": {JUDGE: {"kind": JUDGE}}})
        plan = type(plan).model_validate(plan.model_copy(update={"steps": steps, "execution": execution}).to_json_obj())
    return create_run(project, wf, plan, str(uuid.uuid4()), sc.params)


def _registry(o: Outcomes, *, units: bool) -> DispatcherRegistry:
    from akm.dispatch.registry import default_registry

    reg = default_registry()
    if units:
        reg.register(FakeUnits(o))
    reg.register(FakeJudge(o))
    return reg


def drive_native(project: Path, sc: Scenario) -> str:
    """The drive loop runs everything it has a dispatcher for; what it parks for the agent (a verdict of a
    gate with no judge engine, units of a runner it cannot dispatch) the agent reports, then it drives on."""
    rid = _start(project, sc)
    o = Outcomes(sc)
    reg = _registry(o, units=not sc.native_session_units)
    with open_test_journal() as db:
        drive_run(db, rid, DriveOptions(work_dir=project, project_root=project, registry=reg))
    _agent_loop(project, rid, o, reg)
    return rid


def drive_by_reports(project: Path, sc: Scenario) -> str:
    rid = _start(project, sc)
    o = Outcomes(sc)
    _agent_loop(project, rid, o, _registry(o, units=False))
    return rid


def _agent_loop(project: Path, rid: str, o: Outcomes, reg: DispatcherRegistry) -> None:
    """A scripted agent: read `next`, report each unit's outcome (and each verdict), and call `workflow run`
    whenever the brief says akm goes on; until the run ends."""
    for _ in range(200):
        with open_test_journal() as db:
            b = session.brief(db, rid)
            if b.kind in ("done", "inactive"):
                break
            if b.kind == "engine":
                drive_run(db, rid, DriveOptions(work_dir=project, project_root=project, registry=reg))
                continue
            if b.kind == "judge":
                assert b.judge is not None
                answer = o.verdict()
                verdict = json.loads(answer) if isinstance(answer, str) else answer
                session.report(
                    db,
                    session.UnitReport(rid, b.judge.unit_id, "agent", verdict=verdict),
                    project_root=project,
                    registry=reg,
                )
                continue
            for u in b.units:
                out = o.next(u.unit_id)
                rerun = u.action == "rerun"
                try:
                    _report_outcome(db, rid, u.unit_id, out, rerun, project, reg)
                except AkmError as exc:  # a budget ceiling refuses the report and fails the step, as natively
                    assert exc.code == "BUDGET_EXCEEDED", exc
                run = runs_store.require_run(db, rid)
                if run.status not in ("active", "awaiting_session"):
                    break


def _report_outcome(
    db: Any, rid: str, unit_id: str, out: dict[str, Any], rerun: bool, project: Path, reg: DispatcherRegistry
) -> None:
    """The scripted agent reports one unit's outcome (naming no attempt: the unit's current one)."""
    if out["ok"]:
        req = session.UnitReport(rid, unit_id, "agent", result=out["value"], tokens=out["tokens"], rerun=rerun)
    else:
        req = session.UnitReport(
            rid,
            unit_id,
            "agent",
            status="failed",
            result=out["text"],
            failure_reason=out["reason"],
            tokens=out["tokens"],
            rerun=rerun,
        )
    session.report(db, req, project_root=project, registry=reg)


def graph(run_id: str) -> list[str]:
    """The canonical unit graph of §4.2 (attempts, claims, timestamps and runner columns excluded)."""
    lines: list[str] = []
    with open_test_journal() as db:
        rows = [
            dict(r) for r in db.query("SELECT * FROM units WHERE run_id = ? ORDER BY started_at, unit_id", (run_id,))
        ]
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r["phase"] is None:
                groups.setdefault(base_of_attempt(r["unit_id"]), []).append(r)
        for base in sorted(groups):
            fam = groups[base]
            rep = next((r for r in fam if r["status"] == "completed"), fam[-1])
            spent = sum(r["tokens"] or 0 for r in fam)  # what the unit cost, however its attempts were rowed
            lines.append(
                "unit "
                + " | ".join(
                    str(x)
                    for x in (
                        base,
                        rep["node_id"],
                        rep["parent_unit_id"],
                        rep["input_hash"],
                        rep["status"],
                        rep["result_json"],
                        rep["failure_reason"],
                        spent,
                    )
                )
            )
        for r in sorted((r for r in rows if r["phase"] == "gate"), key=lambda r: r["unit_id"]):
            lines.append(f"gate {r['unit_id']} | {r['node_id']} | {r['status']} | {r['result_json']}")
        for s in runs_store.get_steps(db, run_id):
            ev = json.loads(s.evidence_json) if s.evidence_json else None
            route = (ev or {}).get("route", {}) if isinstance(ev, dict) else {}
            lines.append(
                f"step {s.step_id} | {s.status} | "
                f"{canonical_json(ev.get('output')) if isinstance(ev, dict) and 'output' in ev else '(none)'}"
                f" | {canonical_json(ev.get('units')) if isinstance(ev, dict) and 'units' in ev else '-'}"
                f" | {route.get('selected') if isinstance(route, dict) else None}"
                f" | {s.summary} | {s.notes}"
            )
        lines.extend(event_lines(db, run_id))
        run = runs_store.require_run(db, run_id)
        lines.append(f"run detail {canonical_json(run.status_detail)}")
        lines.append(f"run {run.status}")
    return lines


UNIT_EVENTS = ("workflow_unit_started", "workflow_unit_finished")


def event_lines(db: Any, run_id: str) -> list[str]:
    """The run's event log by type, in order. Dispatch-unit events between two other events (run, step, gate
    row) are compared as a multiset per unit: a native fan-out interleaves its units' events, reports come
    one unit at a time."""
    lines: list[str] = []
    segment: dict[tuple[str, str], int] = {}

    def flush() -> None:
        if segment:
            lines.append("units " + " ".join(f"{t}:{u}x{n}" for (t, u), n in sorted(segment.items())))
            segment.clear()

    for r in db.query("SELECT event_type, metadata_json FROM events WHERE run_id = ? ORDER BY id", (run_id,)):
        meta = json.loads(r["metadata_json"] or "{}")
        if r["event_type"] in UNIT_EVENTS and ".gate:l" not in str(meta.get("unitId")):
            key = (r["event_type"].rpartition("_")[2], base_of_attempt(str(meta.get("unitId"))))
            segment[key] = segment.get(key, 0) + 1
            continue
        flush()
        lines.append(
            f"event {r['event_type']} {meta.get('stepId', '-')} {meta.get('unitId', '-')} {meta.get('status', '-')}"
        )
    flush()
    return lines


def both(tmp_path: Path, monkeypatch, sc: Scenario) -> tuple[list[str], list[str]]:
    out = []
    for surface, drive in (("native", drive_native), ("reported", drive_by_reports)):
        monkeypatch.setenv("AKM_DATA_DIR", str(tmp_path / f"data-{surface}"))
        project = tmp_path / f"project-{surface}"
        project.mkdir()
        out.append(graph(drive(project, sc)))
    return out[0], out[1]


def assert_same(a: list[str], b: list[str]) -> None:
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        raise AssertionError(
            f"graphs differ at line {first}:\nnative:   {a[first] if first < len(a) else '-'}\n"
            f"reported: {b[first] if first < len(b) else '-'}\n\nnative:\n"
            + "\n".join(a)
            + "\n\nreported:\n"
            + "\n".join(b)
        )


MAP3 = """
    params:
      files: { type: array }
    steps:
      - id: review
        map: { over: params.files }
    """

SCENARIOS = [
    Scenario(
        "solo-tokens", "steps:\n  - id: build", "## build\n\nBuild.", outcomes={"build:solo": [ok("built", tokens=42)]}
    ),
    Scenario("fan-out-collect", MAP3, "## review\n\nReview.", params={"files": ["a", "b", "c"]}, outcomes={}),
    Scenario(
        "vote",
        """
        steps:
          - id: pick
            map:
              over: params.options
              reducer: vote
              unit:
                output: { type: object, required: [v], properties: { v: { type: string } } }
        params:
          options: { type: array }
        """,
        "## pick\n\nPick.",
        params={"options": [1, 2, 3]},
        outcomes={},
    ),
    Scenario(
        "route",
        """
        steps:
          - id: classify
            output: { type: object, required: [kind], properties: { kind: { type: string } } }
          - id: triage
            route:
              input: steps.classify.output.kind
              when: [{ match: bug, step: ship }, { match: feature, step: rework }]
          - id: ship
          - id: rework
        """,
        "## classify\n\nC.\n\n## triage\n\nT.\n\n## ship\n\nS.\n\n## rework\n\nR.",
        outcomes={"classify:solo": [ok({"kind": "bug"})], "ship:solo": [ok("shipped")]},
    ),
    Scenario(
        "gate-reject-then-accept",
        "steps:\n  - id: work\n    gate: { max_loops: 3 }",
        "## work\n\nWork.\n\n### gate\n\n- Good work.",
        outcomes={"work:solo": [ok("v1"), ok("v2")]},
        verdicts=[{"complete": False, "missing": ["quality"], "feedback": "again"}, {"complete": True}],
        engine_judge=True,
    ),
    Scenario(
        "gate-exhausted",
        "steps:\n  - id: work",
        "## work\n\nWork.\n\n### gate\n\n- Perfect.",
        outcomes={"work:solo": [ok("meh")]},
        verdicts=[{"complete": False, "missing": ["all"], "feedback": "no"}],
        engine_judge=True,
    ),
    Scenario(
        "judge-malformed",
        "steps:\n  - id: work",
        "## work\n\nWork.\n\n### gate\n\n- Good.",
        outcomes={"work:solo": [ok("x")]},
        verdicts=["this is not a verdict"],
        engine_judge=True,
    ),
    Scenario(
        "judge-throws",
        "steps:\n  - id: work",
        "## work\n\nWork.\n\n### gate\n\n- Good.",
        outcomes={"work:solo": [ok("x")]},
        verdicts=[RuntimeError("judge down")],
        engine_judge=True,
    ),
    Scenario(
        "on-error-continue",
        """
        params:
          files: { type: array }
        steps:
          - id: review
            map: { over: params.files, unit: { on_error: continue } }
        """,
        "## review\n\nReview.",
        params={"files": ["a", "b"]},
        outcomes={},
    ),
    Scenario(
        "retry-then-succeed",
        """
        steps:
          - id: fetch
            unit: { retry: { max: 2, on: [timeout] } }
        """,
        "## fetch\n\nFetch.",
        outcomes={"fetch:solo": [fail("timeout", tokens=5), ok("data", tokens=7)]},
    ),
    Scenario(
        "empty-text",
        "steps:\n  - id: say\n  - id: after",
        "## say\n\nSay.\n\n## after\n\nA.",
        outcomes={"say:solo": [ok("")], "after:solo": [ok("fine")]},
    ),
    Scenario(
        "artifact-schema-loop",
        """
        params:
          files: { type: array }
        steps:
          - id: list
            map: { over: params.files }
            output: { type: array, items: { type: string, minLength: 3 } }
            gate: { max_loops: 2 }
        """,
        "## list\n\nList.",
        params={"files": ["a"]},
        outcomes={},
    ),
    Scenario(
        "params-routed-first",
        """
        params:
          mode: { type: string }
        steps:
          - id: triage
            route: { input: params.mode, when: [{ match: ship, step: ship }, { match: rework, step: rework }] }
          - id: ship
          - id: rework
        """,
        "## triage\n\nT.\n\n## ship\n\nS.\n\n## rework\n\nR.",
        params={"mode": "rework"},
        outcomes={"rework:solo": [ok("reworked")]},
    ),
    Scenario(
        "fail-fast",
        MAP3.replace("map: { over: params.files }", "map: { over: params.files, concurrency: 1 }"),
        "## review\n\nReview.",
        params={"files": ["a", "b"]},
        outcomes={},
    ),
    # Every decision kind of `finalize.decide_step`, applied by both drivers (engine/apply.py):
    Scenario(
        "gate-pass-first",
        "steps:\n  - id: work\n    gate: { max_loops: 2 }\n  - id: after",
        "## work\n\nWork.\n\n### gate\n\n- Good work.\n\n## after\n\nA.",
        outcomes={"work:solo": [ok("good")], "after:solo": [ok("next")]},
        verdicts=[{"complete": True}],
        engine_judge=True,
    ),
    Scenario(
        "session-judge-loop",
        "steps:\n  - id: work\n    gate: { max_loops: 2 }",
        "## work\n\nWork.\n\n### gate\n\n- Good work.",
        outcomes={"work:solo": [ok("v1"), ok("v2")]},
        verdicts=[{"complete": False, "missing": ["tests"], "feedback": "add tests"}, {"complete": True}],
    ),
    Scenario(
        "session-judge-exhausted",
        "steps:\n  - id: work",
        "## work\n\nWork.\n\n### gate\n\n- Perfect.",
        outcomes={"work:solo": [ok("meh")]},
        verdicts=[{"complete": False, "missing": ["all"], "feedback": "no"}],
    ),
    Scenario(
        "session-units",
        MAP3 + "  - id: after\n",
        "## review\n\nReview.\n\n## after\n\nA.",
        params={"files": ["a", "b"]},
        outcomes={"after:solo": [ok("done")]},
        native_session_units=True,
    ),
    Scenario(
        "session-units-retry",
        """
        steps:
          - id: fetch
            unit: { retry: { max: 1, on: [timeout] } }
        """,
        "## fetch\n\nFetch.",
        outcomes={"fetch:solo": [fail("timeout", tokens=2), ok("data", tokens=3)]},
        native_session_units=True,
    ),
    Scenario(
        "solo-fail",
        "steps:\n  - id: build\n  - id: never",
        "## build\n\nBuild.\n\n## never\n\nN.",
        outcomes={"build:solo": [fail("non_zero_exit", text="exit 2")], "never:solo": [ok("x")]},
    ),
    # Issue 39 (upstream's driver tests): a loop-2 answer identical to the rejected loop-1 one is loop 2's
    # answer on both surfaces (the report path took it for a resend and never finished), with the agent
    # judging and with an engine judging.
    Scenario(
        "gate-same-answer-session-judge",
        "steps:\n  - id: work\n    gate: { max_loops: 3 }",
        "## work\n\nWork.\n\n### gate\n\n- Good work.",
        outcomes={"work:solo": [ok("same")]},
        verdicts=[{"complete": False, "missing": ["quality"], "feedback": "again"}, {"complete": True}],
    ),
    Scenario(
        "gate-same-answer-engine-judge",
        "steps:\n  - id: work\n    gate: { max_loops: 3 }",
        "## work\n\nWork.\n\n### gate\n\n- Good work.",
        outcomes={"work:solo": [ok("same")]},
        verdicts=[{"complete": False, "missing": ["quality"], "feedback": "again"}, {"complete": True}],
        engine_judge=True,
    ),
    # Issue 39: a unit ceiling fails the step with the same notes on both surfaces.
    Scenario(
        "budget-units",
        MAP3.replace("    steps:", "    budget: { max_units: 2 }\n    steps:").replace(
            "map: { over: params.files }", "map: { over: params.files, concurrency: 1 }"
        ),
        "## review\n\nReview.",
        params={"files": ["a", "b", "c"]},
        outcomes={},
    ),
    Scenario(
        "artifact-schema-exhausted",
        """
        params:
          files: { type: array }
        steps:
          - id: list
            map: { over: params.files }
            output: { type: array, items: { type: string, minLength: 3 } }
        """,
        "## list\n\nList.",
        params={"files": ["a"]},
        outcomes={},
    ),
]


def _fill(sc: Scenario) -> Scenario:
    """Outcomes for fan-out units, keyed by their content ids (computed, not hard-coded)."""
    from akm.plan.identity import item_unit_id

    def ids(step: str, items: list[Any]) -> list[str]:
        return [item_unit_id(f"{step}.unit", i) for i in items]

    if sc.name == "fan-out-collect":
        for i, uid in enumerate(ids("review", ["a", "b", "c"])):
            sc.outcomes[uid] = [ok(f"r{i}", tokens=i)]
    if sc.name == "vote":
        for uid, v in zip(ids("pick", [1, 2, 3]), ["x", "y", "x"], strict=False):
            sc.outcomes[uid] = [ok({"v": v})]
    if sc.name == "on-error-continue":
        a, b = ids("review", ["a", "b"])
        sc.outcomes[a], sc.outcomes[b] = [ok("fine")], [fail("timeout")]
    if sc.name == "artifact-schema-loop":
        (a,) = ids("list", ["a"])
        sc.outcomes[a] = [ok("ab"), ok("abc")]
    if sc.name == "session-units":
        for i, uid in enumerate(ids("review", ["a", "b"])):
            sc.outcomes[uid] = [ok(f"s{i}", tokens=1)]
    if sc.name == "artifact-schema-exhausted":
        (a,) = ids("list", ["a"])
        sc.outcomes[a] = [ok("ab")]
    if sc.name == "budget-units":
        for i, uid in enumerate(ids("review", ["a", "b", "c"])):
            sc.outcomes[uid] = [ok(f"r{i}")]
    if sc.name == "fail-fast":
        a, b = ids("review", ["a", "b"])
        sc.outcomes[a], sc.outcomes[b] = [fail("non_zero_exit")], [fail("non_zero_exit")]
    return sc


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
def test_native_and_reported_runs_have_the_same_graph(tmp_path, monkeypatch, sc):
    native, reported = both(tmp_path, monkeypatch, _fill(sc))
    assert_same(native, reported)
    final = native[-1]
    expected = {
        "gate-exhausted": "run blocked",
        "judge-malformed": "run blocked",
        "judge-throws": "run blocked",
        "fail-fast": "run failed",
        "session-judge-exhausted": "run blocked",
        "solo-fail": "run failed",
        "artifact-schema-exhausted": "run failed",
        "budget-units": "run failed",
    }.get(sc.name, "run completed")
    assert final == expected, "\n".join(native)


def test_parity_graph_shapes(tmp_path, monkeypatch):
    """Structural expectations of a few goldens, on the native graph."""
    native, _ = both(tmp_path, monkeypatch, _fill(SCENARIOS[11]))  # artifact-schema-loop
    gates = [line for line in native if line.startswith("gate ")]
    assert len(gates) == 1 and "list.gate:l1" in gates[0] and '"reason":"output_schema"' in gates[0]
    assert any(line.startswith("unit list.unit:") and "~l2" in line for line in native)


@pytest.mark.parametrize(
    "name, detail",
    [
        ("session-judge-loop", {"kind": "judge", "stepId": "work", "gateLoop": 1}),
        ("session-units", {"kind": "units", "stepId": "review", "gateLoop": 1}),
    ],
)
def test_the_native_driver_parks_what_the_agent_does(tmp_path, monkeypatch, name, detail):
    """The awaiting-session decisions of the scenarios above are the drive loop's own: it parks the run with
    the brief stub a report would write, before the agent reports anything."""
    sc = _fill(next(s for s in SCENARIOS if s.name == name))
    monkeypatch.setenv("AKM_DATA_DIR", str(tmp_path / "data"))
    project = tmp_path / "project"
    project.mkdir()
    rid = _start(project, sc)
    reg = _registry(Outcomes(sc), units=not sc.native_session_units)
    with open_test_journal() as db:
        result = drive_run(db, rid, DriveOptions(work_dir=project, project_root=project, registry=reg))
        run = runs_store.require_run(db, rid)
    assert result.awaiting == detail
    assert (run.status, run.status_detail) == ("awaiting_session", detail)


def test_comparison_can_fail():
    with pytest.raises(AssertionError, match="graphs differ at line 1"):
        assert_same(["run completed", "unit a | x"], ["run completed", "unit a | y"])


# ------------------------------------------------------------------ rewinds (issue 33)

REWOUND = Scenario(
    "rewound",
    """
    params:
      files: { type: array }
    steps:
      - id: intake
      - id: review
        inputs: [steps.intake.output]
        map: { over: params.files }
      - id: sum
        inputs: [steps.review.output]
      - id: last
        inputs: [steps.intake.output]
        gate: { max_loops: 2 }
    """,
    "## intake\n\nI.\n\n## review\n\nR.\n\n## sum\n\nS.\n\n## last\n\nL.\n\n### gate\n\n- Good.",
    params={"files": ["a", "b"]},
    outcomes={"intake:solo": [ok("in")], "sum:solo": [ok("s1", tokens=3), ok("s2")], "last:solo": [ok("l1")]},
    verdicts=[{"complete": True}, {"complete": True}, {"complete": True}],
    engine_judge=True,
)


def _rewound_outcomes(sc: Scenario) -> Scenario:
    from akm.plan.identity import item_unit_id

    a, b = (item_unit_id("review.unit", f) for f in ("a", "b"))
    sc.outcomes[a] = [ok("ra", tokens=1)]
    sc.outcomes[b] = [ok("rb1", tokens=1), ok("rb2", tokens=1)]  # a second answer when it is redone
    return sc


def history_lines(run_id: str) -> list[str]:
    """What rewinds superseded, canonically: the rewinds, their step rows and unit rows (stamps excluded)."""
    from akm.store import rewinds as rewinds_store

    lines = []
    with open_test_journal() as db:
        for r in rewinds_store.list_rewinds(db, run_id):
            lines.append(f"rewind {r.seq} | {r.to_step} | {canonical_json(r.redo)} | {r.from_status} | {r.from_step}")
        for h in rewinds_store.superseded_steps(db, run_id):
            lines.append(f"superseded step {h.step.step_id} | {h.step.status} | {h.step.summary} | {h.step.notes}")
        for h in sorted(rewinds_store.superseded_units(db, run_id), key=lambda h: (h.unit.unit_id, h.rewind_id)):
            u = h.unit
            lines.append(f"superseded unit {u.unit_id} | {u.status} | {u.input_hash} | {u.result_json} | {h.reusable}")
    return lines


def test_a_rewind_ends_in_the_same_graph_both_ways(tmp_path, monkeypatch):
    """The same run, rewound the same way (back to `review`, redoing one of its units), then driven on by the
    native loop or by the agent's reports: the same unit graph, history, steps and event log. `intake` is
    untouched; `review`'s other unit and `last` (whose input did not change) are restored; `sum` runs again
    because its input changed; the rewind superseded every row of review, sum and last."""
    from akm.plan.identity import item_unit_id

    out = []
    for surface in ("native", "reported"):
        monkeypatch.setenv("AKM_DATA_DIR", str(tmp_path / f"data-{surface}"))
        project = tmp_path / f"project-{surface}"
        project.mkdir()
        sc = _rewound_outcomes(Scenario(**{**REWOUND.__dict__, "outcomes": dict(REWOUND.outcomes)}))
        rid = _start(project, sc)
        o = Outcomes(sc)
        reg = _registry(o, units=surface == "native")
        if surface == "native":
            with open_test_journal() as db:
                drive_run(db, rid, DriveOptions(work_dir=project, project_root=project, registry=reg))
        _agent_loop(project, rid, o, reg)
        assert runs_store.require_run(open_test_journal(), rid).status == "completed"
        api.rewind(rid, "review", redo=[item_unit_id("review.unit", "b")])
        if surface == "native":
            with open_test_journal() as db:
                drive_run(db, rid, DriveOptions(work_dir=project, project_root=project, registry=reg))
        _agent_loop(project, rid, o, reg)
        out.append(graph(rid) + history_lines(rid))
    native, reported = out
    assert_same(native, reported)
    assert native[-1].startswith("superseded unit ") and "run completed" in native
    units = [line for line in native if line.startswith("unit ")]
    assert any("rb2" in line for line in units) and any('"s2"' in line for line in units)
    assert any(line.startswith("event workflow_unit_reused last last:solo") for line in native)
    assert "event workflow_unit_reused last last.gate:l1 -" in native  # the same artifact: its verdict reused
