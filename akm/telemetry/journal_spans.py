"""A run's spans, computed from its journal: events in order, its unit rows and its frozen plan (pure).

One **segment** is a stretch of driving from the run's start (or the previous end) to an end: a failed or
blocked step, the run finishing, or an abandon. A resumed run starts a new segment: a new root span in the
same trace, linked to the previous one (its parent is gone: exported and closed). Each segment has a root
span (GenAI `invoke_workflow`), a span per step it ran, and a span per unit attempt: `chat` for an LLM call,
`invoke_agent` for an agent CLI (or the calling agent's session unit), `exec` with the command's argv[0] and
exit status, gate judgments marked as such and retries numbered. Attributes come only from the journal's
ids, names, figures and failure reasons, which are redacted before they are written: never a prompt, an
output or a secret.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping

from akm.record import dataclass, field
from akm.telemetry.context import RunTrace

Attr = str | int | float | bool
_RETRY = re.compile(r"~r(\d+)")
_GATE_LOOP = re.compile(r"\.gate:l(\d+)")
_EXITED = re.compile(r"exited (-?\d+)")
_ENDS = {"failed", "blocked"}


@dataclass
class SpanRecord:
    name: str
    span_id: str
    parent_span_id: str | None
    start: str  # journal timestamps (ISO 8601, UTC)
    end: str
    attributes: dict[str, Attr] = field(default_factory=dict)
    error: str | None = None  # set: span status ERROR with this description
    events: list[tuple[str, str, dict[str, Attr]]] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # span ids in the same trace
    client: bool = False  # a call out of akm (a model API, an agent CLI, a command)


@dataclass
class Segment:
    index: int
    end_event_id: int  # the journal event that ended it
    spans: list[SpanRecord]


@dataclass
class UnitFacts:
    """What the unit rows say of an attempt beyond its events."""

    runner: str | None = None
    engine: str | None = None
    model: str | None = None
    node_id: str | None = None
    phase: str | None = None
    result_json: str | None = None


def exec_commands(plan: Mapping[str, Any]) -> dict[str, str]:
    """node id -> argv[0] of every exec unit of a plan (its JSON form)."""
    found: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ex = node.get("exec")
            if isinstance(ex, dict) and isinstance(node.get("id"), str):
                cmd = ex.get("command")
                if isinstance(cmd, list) and cmd and isinstance(cmd[0], str):
                    found[node["id"]] = cmd[0]
                elif isinstance(cmd, str):
                    found[node["id"]] = cmd.split()[0] if cmd.split() else cmd
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(plan.get("steps"))
    return found


def _usage_attrs(meta: Mapping[str, Any]) -> dict[str, Attr]:
    out: dict[str, Attr] = {}
    raw_usage = meta.get("usage")
    usage: Mapping[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    for key, attr in (("input", "gen_ai.usage.input_tokens"), ("output", "gen_ai.usage.output_tokens")):
        if isinstance(usage.get(key), int):
            out[attr] = usage[key]
    if isinstance(usage.get("cacheRead"), int):
        out["gen_ai.usage.cache_read.input_tokens"] = usage["cacheRead"]
    if isinstance(meta.get("tokens"), int):
        out["akm.usage.tokens"] = meta["tokens"]
    if isinstance(meta.get("cost"), (int, float)) and not isinstance(meta.get("cost"), bool):
        out["akm.cost.usd"] = float(meta["cost"])
    return out


def _unit_span(
    trace: RunTrace,
    unit_id: str,
    step_id: str,
    start: str,
    end: str,
    meta: Mapping[str, Any],
    started_meta: Mapping[str, Any],
    facts: UnitFacts,
    engines: Mapping[str, Mapping[str, Any]],
    argv0: Mapping[str, str],
    parent: str,
) -> SpanRecord:
    attrs: dict[str, Attr] = {"akm.unit.id": unit_id, "akm.step.id": step_id, "akm.run.id": trace.run_id}
    runner = facts.runner or "session"
    attrs["akm.unit.runner"] = runner
    engine = engines.get(facts.engine or "") or {}
    gate = _GATE_LOOP.search(unit_id)
    if facts.engine:
        attrs["akm.engine"] = facts.engine
    if facts.model:
        attrs["gen_ai.request.model"] = facts.model
    name = _operation(attrs, runner, facts, engine, argv0)
    if gate is not None or facts.phase == "gate":
        attrs.update(_judge_attrs(gate, facts.result_json))
        name = f"gate judge {step_id}"
    retry = _RETRY.search(unit_id)
    if retry is not None:
        attrs["akm.retry"] = int(retry.group(1))
    for key in ("host", "worker"):
        if isinstance(started_meta.get(key), str):
            attrs[f"akm.{key}"] = started_meta[key]
    attrs.update(_usage_attrs(meta))
    status = str(meta.get("status") or "")
    reason = meta.get("failureReason") if isinstance(meta.get("failureReason"), str) else None
    attrs["akm.unit.status"] = status or "unfinished"
    code = _exit_code(runner, status, reason, facts.result_json)
    if code is not None:
        attrs["process.exit.code"] = code
    span = SpanRecord(name, trace.unit_span_id(unit_id, start), parent, start, end, attrs, client=runner != "session")
    _mark_outcome(span, status, reason)
    return span


def _judge_attrs(gate: re.Match[str] | None, result_json: str | None) -> dict[str, Attr]:
    """A gate judge's loop (1 when the unit id names none) and its verdict, once it gave one."""
    attrs: dict[str, Attr] = {"akm.gate.loop": int(gate.group(1)) if gate else 1}
    verdict = _verdict(result_json)
    if verdict is not None:
        attrs["akm.gate.verdict"] = verdict
    return attrs


def _operation(
    attrs: dict[str, Attr], runner: str, facts: UnitFacts, engine: Mapping[str, Any], argv0: Mapping[str, str]
) -> str:
    """The GenAI (or process) attributes of what the unit ran, by runner; returns the span's name."""
    if runner == "llm":
        attrs["gen_ai.operation.name"] = "chat"
        attrs["gen_ai.provider.name"] = str(engine.get("provider") or "openai")
        return f"chat {facts.model or facts.engine or ''}".strip()
    if runner == "agent":
        attrs["gen_ai.operation.name"] = "invoke_agent"
        attrs["gen_ai.agent.name"] = str(facts.engine)
        if engine.get("platform"):
            attrs["gen_ai.provider.name"] = str(engine["platform"])
        return f"invoke_agent {facts.engine}"
    if runner == "exec":
        exe = argv0.get(facts.node_id or "", "")
        attrs["process.executable.name"] = exe
        return f"exec {exe}".strip()
    attrs["gen_ai.operation.name"] = "invoke_agent"
    attrs["gen_ai.agent.name"] = "session"
    return "invoke_agent session"


def _exit_code(runner: str, status: str, reason: str | None, result_json: str | None) -> int | None:
    """A command unit's exit code: 0 when it completed, the one its result names after a non-zero exit."""
    if runner == "exec" and status == "completed":
        return 0
    if runner == "exec" and reason == "non_zero_exit" and result_json:
        m = _EXITED.search(result_json)
        if m:
            return int(m.group(1))
    return None


def _mark_outcome(span: SpanRecord, status: str, reason: str | None) -> None:
    """A failed unit's span is an error with a failure event; an unfinished one gets an event saying so."""
    if status == "failed":
        span.error = reason or "failed"
        span.events.append(("akm.unit.failed", span.end, {"akm.failure_reason": reason or "failed"}))
        span.attributes["error.type"] = reason or "failed"
    elif not status:
        span.events.append(("akm.unit.unfinished", span.end, {}))


def _verdict(result_json: str | None) -> str | None:
    try:
        doc = json.loads(result_json) if result_json else None
    except ValueError:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("complete"), bool):
        return "passed" if doc["complete"] else "rejected"
    return None


def segments(
    trace: RunTrace,
    run: Any,
    events: Iterable[Any],
    units: Mapping[str, UnitFacts],
    plan: Mapping[str, Any],
    step_notes: Mapping[str, tuple[str, str | None]] | None = None,
) -> tuple[list[Segment], list[SpanRecord]]:
    """(the run's ended segments with their spans, the spans of the segment still open, which end nowhere yet).

    `events`: the run's journal events in order (`event_type`, `ts`, `metadata`, `id`); `units`: facts by
    unit row id; `plan`: the frozen plan (JSON form); `step_notes`: each step's current (status, notes), whose
    first line describes a failed step's span (the reason: a unit's failure, a budget ceiling) while it still
    holds for it.
    """
    engines = (plan.get("execution") or {}).get("engines") or {}
    argv0 = exec_commands(plan)
    done: list[Segment] = []
    seg = 0
    seg_start: str | None = None
    spans: list[SpanRecord] = []
    open_units: dict[str, tuple[str, str, dict[str, Any]]] = {}  # unit id -> (start, step, started meta)
    step_start: dict[str, str | None] = {}
    steps_seen: list[str] = []
    last_end: str | None = None
    previous_root: str | None = None
    totals = {"cost": 0.0, "tokens": 0}

    def step_parent(step_id: str, at: str) -> str:
        if step_id not in step_start:
            step_start[step_id] = at
            steps_seen.append(step_id)
        return trace.step_span_id(step_id, seg)

    for ev in events:
        kind, meta, ts = ev.event_type, ev.metadata or {}, ev.ts
        if seg_start is None:
            seg_start = ts
        if kind == "workflow_unit_started" and isinstance(meta.get("unitId"), str):
            step_id = str(meta.get("stepId") or "")
            step_parent(step_id, ts)
            open_units[meta["unitId"]] = (ts, step_id, dict(meta))
        elif kind == "workflow_unit_finished" and meta.get("unitId") in open_units:
            start, step_id, started = open_units.pop(meta["unitId"])
            facts = units.get(meta["unitId"], UnitFacts())
            span = _unit_span(
                trace,
                meta["unitId"],
                step_id,
                start,
                ts,
                meta,
                started,
                facts,
                engines,
                argv0,
                step_parent(step_id, start),
            )
            spans.append(span)
            totals["cost"] += float(span.attributes.get("akm.cost.usd", 0.0))
            totals["tokens"] += int(span.attributes.get("akm.usage.tokens", 0))
        elif kind in ("workflow_step_completed", "workflow_step_updated") and isinstance(meta.get("stepId"), str):
            step_id, status = meta["stepId"], str(meta.get("status") or "")
            start = step_start.pop(step_id, None) or last_end or seg_start
            if step_id in steps_seen:
                steps_seen.remove(step_id)
            step = SpanRecord(
                f"step {step_id}",
                trace.step_span_id(step_id, seg),
                trace.root_span_id(seg),
                start,
                ts,
                {"akm.step.id": step_id, "akm.step.status": status, "akm.run.id": trace.run_id},
            )
            if status in _ENDS:
                now, notes = (step_notes or {}).get(step_id, ("", None))
                reason = (notes or "").strip().splitlines()[0][:300] if notes and now == status else ""
                step.error = reason or f"step {status}"
            spans.append(step)
            last_end = ts
            if status in _ENDS:
                done.append(
                    _close(trace, run, seg, seg_start, ts, ev.id, status, spans, open_units, previous_root, totals)
                )
                previous_root, seg, seg_start, spans, last_end = trace.root_span_id(seg), seg + 1, None, [], None
                step_start.clear()
                steps_seen.clear()
                totals = {"cost": 0.0, "tokens": 0}
        elif kind in ("workflow_finished", "workflow_abandoned"):
            status = "completed" if kind == "workflow_finished" else "abandoned"
            done.append(_close(trace, run, seg, seg_start, ts, ev.id, status, spans, open_units, previous_root, totals))
            previous_root, seg, seg_start, spans, last_end = trace.root_span_id(seg), seg + 1, None, [], None
            step_start.clear()
            steps_seen.clear()
            totals = {"cost": 0.0, "tokens": 0}
    return done, spans


def _close(
    trace: RunTrace,
    run: Any,
    seg: int,
    start: str | None,
    end: str,
    event_id: int,
    status: str,
    spans: list[SpanRecord],
    open_units: dict[str, tuple[str, str, dict[str, Any]]],
    previous_root: str | None,
    totals: dict[str, Any],
) -> Segment:
    """End a segment: its root span, and the attempts it left without a finish (cut off, no status)."""
    for unit_id, (ustart, step_id, _meta) in list(open_units.items()):
        span = SpanRecord(
            f"unit {unit_id}",
            trace.unit_span_id(unit_id, ustart),
            trace.step_span_id(step_id, seg),
            ustart,
            end,
            {"akm.unit.id": unit_id, "akm.step.id": step_id, "akm.unit.status": "unfinished"},
        )
        span.events.append(("akm.unit.unfinished", end, {}))
        spans.append(span)
    open_units.clear()
    attrs: dict[str, Attr] = {
        "gen_ai.operation.name": "invoke_workflow",
        "akm.run.id": trace.run_id,
        "akm.workflow": str(getattr(run, "workflow_ref", "") or ""),
        "akm.run.status": status,
        "akm.run.segment": seg,
        "akm.usage.tokens": int(totals["tokens"]),
        "akm.cost.usd": float(totals["cost"]),
    }
    title = getattr(run, "title", None)
    root = SpanRecord(
        f"invoke_workflow {title or getattr(run, 'workflow_ref', '')}".strip(),
        trace.root_span_id(seg),
        trace.parent_span_id,
        start or end,
        end,
        attrs,
        links=[previous_root] if previous_root else [],
    )
    if status != "completed":
        root.error = f"run {status}"
    return Segment(seg, event_id, [root, *spans])
