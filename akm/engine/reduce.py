"""Pure step semantics: reuse decisions, reduction, evidence, routes.

Everything here is a function of journal rows and unit outcomes, so the native
drive loop and the session protocol reach identical results (spec/architecture.md), and a
resumed run rebuilds exactly the evidence a live run would have written.
"""

from __future__ import annotations

import json
from typing import Any

from akm.canonical import CanonicalError, canonical_json, compact_json
from akm.dispatch.types import DispatchResult
from akm.engine.scope import resolve
from akm.format.refs import ReferenceResolutionError, ReferenceSyntaxError, parse_reference
from akm.format.schema import validate_instance
from akm.plan.identity import base_of_attempt
from akm.plan.model import RoutePlan, StepPlan
from akm.record import dataclass

TEXT_CLIP = 2000
EVIDENCE_LIMIT_BYTES = 1024 * 1024
EVIDENCE_PREVIEW = 1000
OUTPUT_LIMIT_BYTES = 64 * 1024 * 1024


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass(kw_only=True)
class UnitOutcome(DispatchResult):
    """A dispatch result tied to its (base) unit id, live or rehydrated from its journal row."""

    unit_id: str
    reused: bool = False
    dispatched: bool = False

    @property
    def value(self) -> Any:
        if not self.ok:
            return None
        if self.has_result:
            return self.result
        return self.text


# ---------------------------------------------------------------- reuse


@dataclass
class ReuseDecision:
    kind: str  # "reuse" | "diverge" | "dispatch"
    row: dict[str, Any] | None = None
    attempt_id: str | None = None


def index_completed_rows(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Completed rows grouped by attempt family (`B`, `B~r1`, `B~r2`… all under `B`), in journal order.

    Built once per step so each unit's reuse decision is a dict lookup, not a scan
    of the whole journal (a 2000-unit fan-out would otherwise cost O(n²)).
    """
    index: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("status") == "completed":
            index.setdefault(base_of_attempt(row["unit_id"]), []).append(row)
    return index


def outcome_from_row(unit_id: str, row: dict[str, Any], has_schema: bool) -> UnitOutcome:
    raw = row.get("result_json")
    parsed: Any = None
    present = False
    if raw is not None:
        try:
            parsed = json.loads(raw)
            present = True
        except ValueError:
            present = False
    out = UnitOutcome(
        unit_id=unit_id,
        ok=row.get("status") == "completed",
        tokens=row.get("tokens"),
        cost=row.get("cost"),
        session_id=row.get("session_id"),
        truncated=bool(row.get("truncated")),
        reused=True,
    )
    if not out.ok:
        out.failure_reason = row.get("failure_reason") or "reported_failure"
        if isinstance(parsed, str):
            out.error = parsed
        return out
    if present:
        if has_schema:
            out.result, out.has_result = parsed, True
        elif isinstance(parsed, str):
            out.text = parsed
        else:
            out.result, out.has_result = parsed, True
    return out


def storable(outcome: UnitOutcome, attempt: str) -> tuple[UnitOutcome, str | None]:
    """The outcome and the text its row stores; a result that cannot be stored as JSON fails the attempt."""
    try:
        return outcome, journaled_result_json(outcome)
    except (ValueError, TypeError) as exc:
        failed = UnitOutcome(
            unit_id=outcome.unit_id,
            ok=False,
            failure_reason="dispatch_error",
            error=f"unit {attempt} produced a result that cannot be stored as JSON: {exc}",
        )
        return failed, journaled_result_json(failed)


def journaled_result_json(outcome: UnitOutcome) -> str | None:
    """What the unit row stores: the artifact on success, a clipped diagnostic on failure."""
    if outcome.ok:
        if outcome.has_result:
            return compact_json(outcome.result)
        if outcome.text:
            return compact_json(outcome.text)
        return None
    parts = [p for p in (outcome.error, outcome.text) if p and p.strip()]
    if not parts:
        return None
    return compact_json(clip("\n--- unit output ---\n".join(parts), TEXT_CLIP))


# ---------------------------------------------------------------- reduction


@dataclass
class StepResult:
    ok: bool
    evidence: dict[str, Any]
    summary: str
    artifact_schema_failure: bool = False
    unit_count: int = 0
    failed_units: int = 0


def unit_evidence(outcome: UnitOutcome) -> dict[str, Any]:
    if outcome.ok:
        entry: dict[str, Any] = {"unitId": outcome.unit_id, "ok": True}
        if outcome.has_result:
            entry["result"] = outcome.result
        elif outcome.text is not None:
            entry["text"] = clip(outcome.text, TEXT_CLIP)
        if outcome.truncated:
            entry["truncated"] = True  # the artifact is the beginning of a longer output
        return entry
    entry = {"unitId": outcome.unit_id, "ok": False}
    if outcome.failure_reason:
        entry["failureReason"] = outcome.failure_reason
    return entry


def _validate_output(step: StepPlan, output: Any) -> list[str]:
    if step.output_schema is None:
        return []
    return validate_instance(output, step.output_schema)


def reduce_step(
    step: StepPlan, outcomes: list[UnitOutcome], *, is_map: bool, reducer: str, on_error: str
) -> StepResult:
    """Combine unit outcomes (in item order) into the step's evidence and verdict."""
    n = len(outcomes)
    failures = [o for o in outcomes if not o.ok]
    evidence: dict[str, Any] = {"units": [unit_evidence(o) for o in outcomes], "itemCount": n}
    vote_error: str | None = None
    if reducer == "vote":
        output, vote, vote_error = _vote(outcomes)
        if vote is not None:
            evidence["vote"] = vote
    else:
        output = [o.value for o in outcomes] if is_map else (outcomes[0].value if outcomes else None)
    evidence["output"] = output
    summary = _summary(step, n, failures, on_error, vote_error) + _note_truncated(outcomes, evidence)
    ok = (on_error == "continue" or not failures) and vote_error is None
    result = StepResult(ok=ok, evidence=evidence, summary=summary, unit_count=n, failed_units=len(failures))
    if not ok and not is_map and _solo_unit_missed_the_schema(step, failures):
        # D5: a solo step's `output` schema is checked on its unit, so a miss surfaces as a unit
        # failure; it is still the step artifact missing its schema, which gate loops may retry.
        result.artifact_schema_failure = True
    if ok:
        _check_artifact(step, result, output, summary, tolerated_failures=bool(failures))
    return result


def _vote(outcomes: list[UnitOutcome]) -> tuple[Any, dict[str, Any] | None, str | None]:
    """(winning value, the vote's evidence, None), or (None, None, why the vote failed): a strict majority of
    the successful units' results, compared as canonical JSON."""
    counts: dict[str, list[Any]] = {}
    try:
        for o in outcomes:
            if o.ok:
                key = canonical_json(o.value)
                counts.setdefault(key, [o.value, 0])[1] += 1
    except CanonicalError as exc:
        return None, None, f"vote failed: a unit result cannot be compared ({exc})"
    ranked = sorted(counts.values(), key=lambda pair: -pair[1])
    if not ranked:
        return None, None, "vote failed: no successful unit results"
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return None, None, f"vote failed: tied at {ranked[0][1]} votes each, no majority"
    winner = ranked[0][0]
    return winner, {"winner": winner, "votes": ranked[0][1], "total": sum(p[1] for p in ranked)}, None


def _summary(step: StepPlan, n: int, failures: list[UnitOutcome], on_error: str, vote_error: str | None) -> str:
    """The step's one-paragraph account: units run, which failed and the first diagnostic, a failed vote."""
    if n == 0:
        summary = "fan-out list was empty — no units dispatched."
    else:
        summary = f'Step "{step.step_id}" executed {n} unit(s) ({n - len(failures)} succeeded, {len(failures)} failed).'
    if failures:
        tolerated = " (recorded, on_error: continue)" if on_error == "continue" else ""
        listed = ", ".join(f"{o.unit_id} ({o.failure_reason or 'failed'})" for o in failures)
        summary += f" Failed: {listed}{tolerated}."
        first = next(((o.unit_id, o.error.strip()) for o in failures if o.error and o.error.strip()), None)
        if first is not None:
            summary += f" First failure diagnostic ({first[0]}): {clip(first[1], TEXT_CLIP)}"
    if vote_error:
        summary += f" {vote_error}."
    return summary


def _note_truncated(outcomes: list[UnitOutcome], evidence: dict[str, Any]) -> str:
    """Visible as data, never silent: list in the evidence the units whose artifact is only the beginning of
    their output; the sentence the summary gets for them ("" when none was cut)."""
    cut = [o.unit_id for o in outcomes if o.ok and o.truncated]
    if not cut:
        return ""
    evidence["truncatedUnits"] = cut
    return (
        f" Output truncated at the capture cap (the artifact is only its beginning): "
        f"{', '.join(cut[:10])}{', …' if len(cut) > 10 else ''}."
    )


def _solo_unit_missed_the_schema(step: StepPlan, failures: list[UnitOutcome]) -> bool:
    """Whether a solo step failed because its unit's output missed the step's own `output` schema (the unit
    is checked against the same schema, so every failure is a validation or parse error)."""
    template = step.unit_template
    return (
        bool(failures)
        and step.output_schema is not None
        and template is not None
        and template.output_schema == step.output_schema
        and all(o.failure_reason in ("validation_error", "parse_error") for o in failures)
    )


def _check_artifact(step: StepPlan, result: StepResult, output: Any, summary: str, *, tolerated_failures: bool) -> None:
    """Fail a passing step whose artifact misses its declared output schema, saying why."""
    errors = _validate_output(step, output)
    if not errors:
        return
    result.ok = False
    result.artifact_schema_failure = True
    if tolerated_failures:
        # The units' own failures (a parse error, a non-zero exit) are the cause; the schema
        # only rejects the null a tolerated failure leaves. Lead with the cause.
        result.summary = (
            f"{summary} With on_error: continue a failed unit leaves null in the artifact, which the "
            f"step's declared output schema rejects: " + "; ".join(errors) + "."
        )
    else:
        result.summary = (
            f'Step "{step.step_id}" artifact failed validation against the step\'s declared output schema: '
            + "; ".join(errors)
            + "."
        )


# ---------------------------------------------------------------- routes


class RouteError(ValueError):
    pass


def route_value_string(value: Any) -> str:
    """Stringify a route input the way authors expect (`true`, `1`, `1.5`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def evaluate_route(step_id: str, route: RoutePlan, params: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    """Return the evidence `route` object {input, value, selected} or raise RouteError."""
    try:
        value = resolve(route.input, params, outputs)
    except (ReferenceResolutionError, ReferenceSyntaxError) as exc:
        if route.default_step_id is not None and _unset_param(route.input, params):
            # An optional param that was not passed matches no branch: the default one runs.
            return {"input": route.input, "value": None, "selected": route.default_step_id}
        raise RouteError(f'route input "{route.input}" failed to resolve: {exc}') from exc
    if isinstance(value, (dict, list)):
        raise RouteError(
            f'route input "{route.input}" resolved to an object or array; routes need a string, number or boolean'
        )
    key = route_value_string(value)
    selected = route.when.get(key, route.default_step_id)
    if selected is None:
        raise RouteError(
            f'route input "{route.input}" = {compact_json(value)} matched no "when:" branch and the route declares no default'
        )
    return {"input": route.input, "value": value, "selected": selected}


def _unset_param(reference: str, params: dict[str, Any]) -> bool:
    """Is `reference` a `params.<name>` whose param was not passed (absent or null)?"""
    try:
        ref = parse_reference(reference)
    except ReferenceSyntaxError:
        return False
    return ref.root == "params" and params.get(ref.name) is None


def route_targets(route: RoutePlan) -> list[str]:
    targets = list(dict.fromkeys(route.when.values()))
    if route.default_step_id and route.default_step_id not in targets:
        targets.append(route.default_step_id)
    return targets


# ---------------------------------------------------------------- evidence bound


class OutputTooLarge(ValueError):
    """A step output over OUTPUT_LIMIT_BYTES: refused rather than stored truncated."""


def bounded_evidence_json(evidence: dict[str, Any]) -> tuple[str, bool]:
    """Serialise evidence for the step row.

    The step `output` (and route decision) are kept whole, so a later invocation
    resolves exactly what a live one did; only the per-unit bookkeeping is
    replaced by a marker (largest first) when the row would pass 1 MiB. An
    output over OUTPUT_LIMIT_BYTES raises OutputTooLarge — the step fails with a
    clear reason instead of handing later steps a truncated value.
    """
    text = compact_json(evidence)
    size = len(text.encode("utf-8"))
    if size <= EVIDENCE_LIMIT_BYTES:
        return text, False
    output_size = len(compact_json(evidence.get("output")).encode("utf-8"))
    if output_size > OUTPUT_LIMIT_BYTES:
        raise OutputTooLarge(
            f"the step output is {output_size} bytes of JSON, over the {OUTPUT_LIMIT_BYTES}-byte limit; "
            "write bulk data to files and output their paths"
        )
    work = dict(evidence)
    keep = {"output", "route", "truncatedUnits"}
    sizes = sorted(((len(compact_json(v).encode("utf-8")), k) for k, v in work.items() if k not in keep), reverse=True)
    for entry_size, key in sizes:
        work[key] = {
            "__akm_evidence_truncated__": True,
            "reason": "evidence exceeded the 1 MiB journal bound",
            "originalBytes": entry_size,
            "limitBytes": EVIDENCE_LIMIT_BYTES,
            "preview": compact_json(work[key])[:EVIDENCE_PREVIEW],
        }
        text = compact_json(work)
        if len(text.encode("utf-8")) <= EVIDENCE_LIMIT_BYTES:
            break
    return text, True
