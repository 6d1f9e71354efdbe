"""What an agent should call next: the `next` of each answer, in tool calls (never a shell command).

The api says what state a run is in (its `recovery`, a report's `stepOutcome`, a brief's `kind`); this front
says which tool moves it on, pointing at what the answer already holds so the agent needs no extra call.
"""

from __future__ import annotations

import json
from typing import Any

from akm import views


def report_answer(res: Any) -> dict[str, Any]:
    """A report's JSON + its `next`."""
    data = res.to_json()
    data["next"] = after_report(data)
    return data


def status_answer(view: views.RunView) -> dict[str, Any]:
    """A run view's JSON + its `next`: what moves a failed, blocked or abandoned run on (else null)."""
    data = view.to_json()
    data["next"] = remedy_text(view.recovery, view.run_id) if view.recovery else None
    return data


def plan_answer(preview: views.RunPreview) -> dict[str, Any]:
    """`workflow_run(plan=true)`: the run answer's keys with nothing driven (`run` null: the preview names the
    run it would continue), the preview in `plan`."""
    body: dict[str, Any] = {key: None for key, _ in _RUN_RESULT_KEYS}
    body.update(executed=[], stepsProcessed=0, done=False, aborted=False, timedOut=False, started=False)
    body.update(driving=False, warnings=list(preview.warnings), plan=preview.to_json())
    how = f'workflow_run(target="{preview.run_id}")' if preview.run_id else "workflow_run with the same arguments"
    body["next"] = f"Nothing was run or written. To do it, call {how} without plan. First it would: {preview.first}."
    return body


_RUN_RESULT_KEYS = [(views.to_camel(name), default) for name, default in views.fields_of(views.RunResult)]


def rewind_answer(res: Any) -> dict[str, Any]:
    """What a rewind did + its `next`."""
    data = res.to_json()
    rid, step = data["run"]["runId"], data["rewind"]["toStep"]
    data["next"] = (
        f'Call workflow_run(target="{rid}") to go on from step {step}: units whose inputs did not change are '
        "reused, not run; when the step needs you, the answer carries the brief in run.awaiting (units you did "
        "before are offered with action rerun: report them with unit_report(**unit.report, result=...))."
    )
    return data


def after_run(result: views.RunResult) -> str | None:
    """A `workflow_run` answer's `next`."""
    status = result.run.status
    rid = result.run.run_id
    if status == "awaiting_session":
        return for_brief((result.run.awaiting or {}), rid)
    if status == "active" and result.driving:
        return (
            f"The run is still going in the background (units keep running after this call). Call "
            f'workflow_run(target="{rid}") to wait for it again: it attaches and reports what happened '
            f'meanwhile. Stop it with workflow_run(target="{rid}", stop=true).'
        )
    if status == "active":
        return f'Call workflow_run(target="{rid}") to continue.'
    if status in ("failed", "blocked", "abandoned") and result.run.recovery:
        return remedy_text(result.run.recovery, rid)
    return None


def after_wait(result: views.WaitResult) -> str | None:
    """A `workflow_wait` answer's `next`."""
    run, rid = result.run, result.run.run_id
    if result.undriven:
        return (
            f'Nothing drives the run (its driver is gone): call workflow_run(target="{rid}") to drive it from this '
            "server."
        )
    if result.timed_out:
        return f'The run is still going elsewhere: call workflow_wait(run_id="{rid}") to keep waiting.'
    if run.status == "awaiting_session":
        return for_brief(run.awaiting or {}, rid)
    if run.status in ("failed", "blocked", "abandoned") and run.recovery:
        return remedy_text(run.recovery, rid)
    return None


def remedy_text(rec: dict[str, Any], rid: str) -> str:
    """A run's `recovery` (akm/engine/recovery.py) as the tool calls that carry it out."""
    why = str(rec.get("why") or "")
    why = why[:1].upper() + why[1:]
    action = rec.get("action")
    if action == "resume":
        if rec.get("then") == "judge":
            return (
                f'{why}. Call workflow_resume(run_id="{rid}"), then workflow_next(run_id="{rid}"): its judge brief '
                "is the verdict to give; report it with unit_report(**judge.report, verdict={...}). Alternatively "
                "workflow_run asks the judge engine again."
            )
        return f'{why}. Call workflow_resume(run_id="{rid}"), then workflow_run(target="{rid}").'
    if action == "rewind":
        redo = ", redo=true" if rec.get("redo") else ""
        return (
            f'{why}. Call workflow_rewind(run_id="{rid}", to_step="{rec.get("stepId")}"{redo}), then '
            f'workflow_run(target="{rid}"): its answer carries what you must do again.'
        )
    params = json.dumps(rec.get("params") or {}, ensure_ascii=False)
    return (
        f"{why}. Change the workflow file if that is the cause, then call workflow_run("
        f'target={json.dumps(rec.get("workflow"))}, params={params}, from_run="{rec.get("fromRun") or rid}").'
    )


def for_brief(brief: dict[str, Any], rid: str) -> str:
    """What to do with a brief the answer already holds (run.awaiting, or a report's brief)."""
    kind = brief.get("kind")
    if kind == "units":
        return (
            "Do each unit in run.awaiting.units (prompt, context, outputSchema) and report it with "
            "unit_report(**unit.report, result=...); the report that finishes the step's units answers with "
            f'the judge brief if a gate needs a verdict, else call workflow_run(target="{rid}").'
        )
    if kind == "judge":
        return (
            "Judge run.awaiting.judge.artifact against its criteria and report unit_report(**judge.report, "
            'verdict={"complete": bool, "missing": [...], "feedback": "..."}).'
        )
    return f'Call workflow_next(run_id="{rid}") for what the run needs now.'


# A report answered with a brief: what to do with it, by its kind.
_AFTER_BRIEF = {
    "judge": (
        "The step's units are done: judge brief.judge.artifact against its criteria and report "
        'unit_report(**brief.judge.report, verdict={"complete": bool, "missing": [...], '
        '"feedback": "..."}).'
    ),
    "units": (
        "The gate sent the step back: redo each unit in brief.units with brief.gateFeedback and report it "
        "with unit_report(**unit.report, result=...) (it names the new attemptId)."
    ),
}


def after_report(res: dict[str, Any]) -> str | None:
    """A report answer's `next`: what its own fields already say the agent must do."""
    rid, outcome, status = res["runId"], res.get("stepOutcome") or {}, res.get("runStatus")
    brief = res.get("brief")
    if status == "completed":
        return None
    if brief and brief.get("kind") in ("judge", "units"):
        return _AFTER_BRIEF[brief["kind"]]
    if status in ("failed", "blocked"):
        if res.get("recovery"):
            return f"The run is {status}. " + remedy_text(res["recovery"], rid)
        return f'The run is {status}: workflow_status(run_id="{rid}") says what moves it on (its recovery).'
    if outcome.get("kind") == "completed" or status == "active":
        return f'Call workflow_run(target="{rid}") to go on: its answer carries the next brief in run.awaiting.'
    if res.get("recorded") == "heartbeat" or res.get("status") == "running":
        return "Report the unit's result with unit_report (status completed) before its claim expires."
    if res.get("remainingUnits"):
        return f"{res['remainingUnits']} unit(s) of the step still need a report."
    if not outcome and status == "awaiting_session":  # nothing unreported, yet the step waits: a re-run
        return (
            f'The step waits for a failed unit to be re-run (its retry.on lists the reason): call workflow_next(run_id="{rid}") '
            "and report it with unit_report(**unit.report, result=...) (its report says rerun)."
        )
    return None
