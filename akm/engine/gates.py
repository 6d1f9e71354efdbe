"""Gates: what a judge is shown, how its answer is read, and running an engine judge.

A step with a `### gate` rubric is judged after its units produce an artifact.
The judge — a configured engine, or the calling agent (D12: `judgeEngine:
session`, or no judge engine at all) — sees the rubric byte-exact and the
artifact as canonical JSON (clipped with a marker), and answers
`{complete, missing, feedback}`. Gates are fail-closed: anything that is not
such an object, or a judge that errors, never passes a step.
"""

from __future__ import annotations

import threading
from typing import Any

from akm.canonical import CanonicalError, canonical_json
from akm.dispatch.answer import AnswerError, extract_model_json
from akm.engine.finalize import Verdict, verdict_from_value
from akm.plan.model import Plan, StepPlan

ARTIFACT_CLIP = 4000

JUDGE_SYSTEM_PROMPT = """You are a strict completion auditor for one step of an automated workflow.
Judge ONLY whether the step's work, as shown, meets every completion criterion. Demand concrete
evidence in the work itself for each criterion; a claim that something was done is not evidence.
Answer with only this JSON object and nothing else:
{"complete": <true|false>, "missing": [<each unmet criterion, as a short string>], "feedback": "<what to do next>"}"""

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["complete"],
    "properties": {
        "complete": {"type": "boolean"},
        "missing": {"type": "array", "items": {"type": "string"}},
        "feedback": {"type": "string"},
    },
}


def artifact_summary(result_units: int, failed_units: int, artifact: Any) -> str:
    """Unit counts, then the artifact as canonical JSON, clipped at ARTIFACT_CLIP characters with a marker."""
    try:
        text = canonical_json(artifact)
    except CanonicalError:
        text = repr(artifact)
    clipped = len(text) > ARTIFACT_CLIP
    lines = [
        f"Units: {result_units} total, {result_units - failed_units} succeeded, {failed_units} failed.",
        "The step's artifact, as canonical JSON"
        + (
            f" (clipped to its first {ARTIFACT_CLIP} of {len(text)} characters; the rest is not shown):"
            if clipped
            else ":"
        ),
        text[:ARTIFACT_CLIP] + ("…" if clipped else ""),
    ]
    return "\n".join(lines)


def judge_prompt(step: StepPlan, summary: str) -> str:
    """The user message a judge gets: the step, its rubric byte-exact, the work, the required answer."""
    criteria = rubric_text(step.gate.criteria)
    return (
        f"Step: {step.title or step.step_id}\n\n"
        f"Completion criteria:\n{criteria}\n\n"
        f"Summary of the work:\n{summary.strip()}\n\n"
        'Return only the JSON verdict {"complete": boolean, "missing": [string], "feedback": string}.'
    )


def rubric_text(criteria: list[str]) -> str:
    """The criteria as the judge reads them. A step's `### gate` section is one rubric, kept as written (its
    own list stays its list: numbering it "1." made "1. - It is a haiku.\n- It mentions rain." of two
    criteria); several criteria are numbered, a criterion's later lines indented under its number."""
    if len(criteria) == 1:
        return criteria[0].strip("\n")
    return "\n".join(f"{i}. " + c.strip().replace("\n", "\n   ") for i, c in enumerate(criteria, 1))


def parse_verdict(text: str) -> tuple[Verdict | None, str | None]:
    """(verdict, None) or (None, why it is malformed). Fail-closed: malformed never passes."""
    try:
        value = extract_model_json(text)
    except AnswerError as exc:
        return None, f"the judge's answer is not a JSON verdict: {exc}"
    verdict = verdict_from_value(value)
    if verdict is None:
        return None, 'the judge\'s answer is not a verdict object with a boolean "complete"'
    return verdict, None


def judge_engine(plan: Plan, step: StepPlan) -> tuple[str | None, dict[str, Any] | None]:
    """(engine name, frozen snapshot) of the step's judge; (None, None) means the calling agent judges."""
    judge = step.gate.judge
    name = judge.engine if judge is not None else None
    if not name or name == "session":
        return None, None
    return name, plan.execution.engines.get(name)


def run_engine_judge(
    dispatcher: Any, request: Any, cancel: threading.Event
) -> tuple[Verdict | None, str | None, int | None]:
    """Ask an engine for a verdict: (verdict, error, tokens). Errors and malformed answers are fail-closed."""
    try:
        raw = dispatcher.dispatch(request, cancel, None)
    except Exception as exc:  # the judge is infrastructure: its bug blocks the step, it never passes it
        return None, f"the judge failed: {type(exc).__name__}: {exc}", None
    if not raw.ok:
        return (
            None,
            f"the judge failed ({raw.failure_reason or 'dispatch_error'}): {raw.error or 'no answer'}",
            raw.tokens,
        )
    verdict, why = parse_verdict(raw.text or "")
    return verdict, why, raw.tokens


def verdict_identity(plan: Plan, step: StepPlan, result: Any, artifact: Any) -> str | None:
    """The identity of a gate verdict, kept as its gate row's input hash: what the judge is shown (the rubric,
    the unit counts and the whole artifact) and who judges it (the engine and its frozen snapshot, or the
    calling agent). A verdict with the same identity is the same question answered: the engine restores it
    instead of asking again (spec/engine.md §4.2). None when the artifact cannot be identified."""
    from akm.canonical import canonical_hash

    name, snapshot = judge_engine(plan, step)
    judge = step.gate.judge
    try:
        return canonical_hash(
            {
                "verdictVersion": 1,
                "criteria": list(step.gate.criteria),
                "units": [result.unit_count if result else 0, result.failed_units if result else 0],
                "artifact": artifact,
                "judge": None
                if name is None
                else {
                    "engine": name,
                    "snapshot": snapshot,
                    "invocation": judge.model_dump(mode="json") if judge else None,
                },
            }
        )
    except CanonicalError:
        return None
