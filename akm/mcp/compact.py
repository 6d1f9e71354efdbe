"""Compact answers for an agent's context window: every MCP answer's JSON stays under `ANSWER_LIMIT`.

A step output, a brief's context value or a judge artifact larger than `VALUE_CLIP` bytes (as JSON) is
replaced by a preview — its JSON text, cut — and a sibling `…Clipped` record `{bytes, fetch}` saying how big
it is and which call returns it whole (`workflow_status(run_id, step=...)`, `workflow_next(run_id,
unit_id=...)`). A brief carries each input once: the unit's prompt embeds its inputs, so a large input is
clipped in `context` (large `params` / `gateFeedback` objects are emptied there, named in
`context.clipped`) and kept only in the prompt; a prompt itself is clipped only when the unit would not fit
otherwise, and a brief with more units than fit lists the first ones (`unitsListed`; the rest come once
those are reported). A value fetched whole that is still too large for one answer — a step's output, a
unit's prompt — comes in pages of its text (`text_page`), each naming the call for the next. Works on the JSON
the api returns (dicts), so the api and the CLI are unchanged.
"""

from __future__ import annotations

import json
from typing import Any

# The budget of an answer's structured JSON: a line holds it, the JSON-RPC envelope and a short text block
# within 64 KiB (akm.mcp.fit).
ANSWER_LIMIT = 56 * 1024
PAGE_LIMIT = 48 * 1024  # one page of a long text, as JSON (escapes included), leaving room for the rest
VALUE_CLIP = 4 * 1024
PREVIEW_CHARS = 1024
UNIT_LIMIT = 24 * 1024


def size_of(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def _clip(holder: dict[str, Any], key: str, fetch: str, limit: int = VALUE_CLIP) -> bool:
    """Clip `holder[key]` in place when its JSON exceeds `limit` bytes; returns whether it did."""
    value = holder.get(key)
    n = size_of(value)
    if n <= limit:
        return False
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    holder[key] = text[:PREVIEW_CHARS] + "…"
    holder[key + "Clipped"] = {"bytes": n, "fetch": fetch}
    return True


def compact_run(data: dict[str, Any]) -> dict[str, Any]:
    """A run view's JSON (or a run result's `run`) with large outputs clipped and its brief compacted."""
    rid = data.get("runId")
    for step in data.get("steps") or []:
        _clip(step, "output", f'workflow_status(run_id="{rid}", step="{step.get("id")}")')
    if data.get("output") is not None:
        _clip(data, "output", f'workflow_status(run_id="{rid}", step="{data.get("outputStepId")}")')
    for unit in data.get("units") or []:
        _clip(unit, "result", f'workflow_status(run_id="{rid}", step="{unit.get("stepId")}", units=true)')
    for rewind in data.get("rewinds") or []:
        for step in rewind.get("steps") or []:  # the outputs a rewind superseded
            _clip(step, "output", f'workflow_status(run_id="{rid}", step="{step.get("id")}")')
    if isinstance(data.get("awaiting"), dict) and data["awaiting"].get("kind") in ("units", "judge"):
        rest = size_of({k: v for k, v in data.items() if k != "awaiting"})
        data["awaiting"] = compact_brief(data["awaiting"], max(ANSWER_LIMIT - rest - 1024, 8 * 1024))
    return data


def compact_brief(brief: dict[str, Any], limit: int = ANSWER_LIMIT - 1024) -> dict[str, Any]:
    """A brief's JSON within `limit` bytes (see the module docstring)."""
    rid = brief.get("runId")
    for unit in brief.get("units") or []:
        uid = unit.get("unitId")
        whole = f'workflow_next(run_id="{rid}", unit_id="{uid}")'
        context = unit.get("context") or {}
        inputs = context.get("inputs") or {}
        for ref in list(inputs):  # the prompt embeds each input: one whole copy is enough
            if _clip(inputs, ref, whole):
                context.setdefault("clipped", {})[f"inputs.{ref}"] = inputs.pop(ref + "Clipped")
        if "item" in context and _clip(context, "item", whole):
            context.setdefault("clipped", {})["item"] = context.pop("itemClipped")
        for key, empty in (("params", {}), ("gateFeedback", None)):  # objects: emptied (the prompt has them)
            n = size_of(context.get(key))
            if n > VALUE_CLIP:
                context[key] = empty
                context.setdefault("clipped", {})[key] = {"bytes": n, "fetch": whole}
        if size_of(unit) > UNIT_LIMIT:
            budget = max(UNIT_LIMIT - (size_of(unit) - size_of(unit.get("prompt"))), 2048)
            prompt = unit.get("prompt") or ""
            if size_of(prompt) > budget:
                n = size_of(prompt)
                unit["prompt"] = prompt[: budget // 2] + f"\n…[clipped: the whole prompt is {n} bytes: {whole}]"
                unit["promptClipped"] = {"bytes": n, "fetch": whole}
    judge = brief.get("judge")
    if isinstance(judge, dict):
        _clip(judge, "artifact", f'workflow_status(run_id="{rid}", step="{brief.get("stepId")}")')
    if isinstance(brief.get("instructions"), str):
        _clip(brief, "instructions", f'workflow_next(run_id="{rid}")', 8 * 1024)
    units = brief.get("units") or []
    if size_of(brief) > limit and units:
        head = size_of({**brief, "units": []})
        kept: list[Any] = []
        used = head
        for unit in units:
            n = size_of(unit) + 1
            if kept and used + n > limit:
                break
            kept.append(unit)
            used += n
        if len(kept) < len(units):
            brief["units"] = kept
            brief["unitsListed"] = len(kept)
            brief.setdefault("warnings", []).append(
                f"this answer lists {len(kept)} of the {len(units)} outstanding units (answers stay under "
                f'{ANSWER_LIMIT // 1024} KB): report them, then workflow_next(run_id="{rid}") lists the rest.'
            )
    return brief


def text_page(text: str, offset: int, limit: int = PAGE_LIMIT) -> tuple[str, dict[str, Any]]:
    """The part of `text` from character `offset` whose JSON fits `limit` bytes, and its page record
    `{offset, length, total, nextOffset}` (lengths in characters; `nextOffset` None on the last page)."""
    total = len(text)
    start = min(offset, total)
    lo, hi = 0, total - start  # the longest piece that fits: a binary search over its length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size_of(text[start : start + mid]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    end = start + max(lo, 1 if start < total else 0)
    return text[start:end], {
        "offset": start,
        "length": end - start,
        "total": total,
        "nextOffset": end if end < total else None,
    }


def page_output(step: dict[str, Any], rid: str | None, offset: int, limit: int = PAGE_LIMIT) -> dict[str, Any]:
    """A step view whose output is fetched whole (`workflow_status(step=...)`): whole when it fits `limit`,
    else one page of its text (the JSON text when it is no string) with `outputPage` naming the next call."""
    output = step.get("output")
    if offset == 0 and size_of(output) <= limit:
        return step
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    piece, page = text_page(text, offset, limit)
    step["output"] = piece
    page["json"] = not isinstance(output, str)  # the pages joined are JSON to parse, not the value itself
    if page["nextOffset"] is not None:
        page["fetch"] = f'workflow_status(run_id="{rid}", step="{step.get("id")}", output_offset={page["nextOffset"]})'
    step["outputPage"] = page
    return step


def clip_context(unit: dict[str, Any], rid: str | None) -> dict[str, Any]:
    """A unit's large context values clipped: its prompt embeds them (a unit fetched whole keeps the prompt)."""
    whole = f'workflow_next(run_id="{rid}", unit_id="{unit.get("unitId")}")'
    context = unit.get("context") or {}
    inputs = context.get("inputs") or {}
    for ref in list(inputs):
        if _clip(inputs, ref, whole):
            context.setdefault("clipped", {})[f"inputs.{ref}"] = inputs.pop(ref + "Clipped")
    if "item" in context and _clip(context, "item", whole):
        context.setdefault("clipped", {})["item"] = context.pop("itemClipped")
    return unit


def page_prompt(unit: dict[str, Any], rid: str | None, offset: int, limit: int = PAGE_LIMIT) -> dict[str, Any]:
    """A unit fetched whole (`workflow_next(unit_id=...)`): large context values clipped (the prompt embeds
    them), the prompt whole when it fits `limit`, else one page of it with `promptPage` naming the next call."""
    uid = unit.get("unitId")
    clip_context(unit, rid)
    prompt = unit.get("prompt") or ""
    if offset == 0 and size_of(prompt) <= limit:
        return unit
    piece, page = text_page(prompt, offset, limit)
    unit["prompt"] = piece
    if page["nextOffset"] is not None:
        page["fetch"] = f'workflow_next(run_id="{rid}", unit_id="{uid}", prompt_offset={page["nextOffset"]})'
    unit["promptPage"] = page
    return unit
