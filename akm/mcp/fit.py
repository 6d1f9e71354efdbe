"""Every answer fits a context window: an MCP answer line stays within 64 KiB, whatever the run.

Clients read `structuredContent` (Claude Code drops the text block when it is there, and writes an answer over
its limit to a file, showing the model a 2 KB preview). So an answer is made to fit in three layers:

1. the api pages what grows with a run — unit attempts, runs (`offset`/`limit`, with a total), events (a
   cursor) — and this front asks for a page (`UNITS_PAGE`, `RUNS_PAGE`) when the client names no limit;
2. `akm.mcp.compact` clips large values to previews that name the call returning them whole, and a value fetched
   whole that is still too large (a step's output, a unit's prompt) comes in pages of its text;
3. `shrink` is the last resort for anything else: it lists the first items of the largest list that fit
   (saying how many there are), and cuts a huge string to a preview — for the paged lists it moves their
   cursor back, so nothing is skipped.

The text block carries the same JSON when both fit in the line (a text-only client reads it as before);
otherwise it is a short summary — the ids, the status, the `next` to call — and the JSON is only in
`structuredContent`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp_types import CallToolResult, TextContent

from akm.mcp import compact
from akm.mcp.compact import size_of

LINE_LIMIT = 64 * 1024  # an answer line on the wire, envelope included
ENVELOPE = 1024  # the JSON-RPC envelope, `_meta` and content framing around the blocks
UNITS_PAGE = 100  # unit attempts per `workflow_status(units=true)` answer, when the client names no limit
RUNS_PAGE = 50  # runs per `workflow_list` answer, when the client names no limit
BRIEF_BESIDE_PAGE = 12 * 1024  # the brief beside a page of a step's output (workflow_next has it whole)
PAGE_FLOOR = 8 * 1024  # the smallest page of a long text
SUMMARY_FACTS = (
    "runId",
    "status",
    "currentStepId",
    "kind",
    "stepId",
    "unitId",
    "recorded",
    "runStatus",
    "done",
    "driving",
    "timedOut",
    "ok",
)


def result_of(data: dict[str, Any], name: str, extra: list[Any] | None = None) -> CallToolResult:
    """A tool's answer: `data` as structured content, and as text too when both fit in a line (else a summary
    of it); `extra` blocks (a resource link) after the text."""
    text = json.dumps(data, ensure_ascii=False)
    if size_of(text) + size_of(data) + ENVELOPE + sum(size_of(b.model_dump()) for b in extra or []) > LINE_LIMIT:
        text = summary(name, data)
    return CallToolResult(content=[TextContent(type="text", text=text), *(extra or [])], structured_content=data)


def summary(name: str, data: dict[str, Any]) -> str:
    """A few lines a person or a text-only client can act on: who, what state, what lists hold, what next."""
    run = data.get("run") if isinstance(data.get("run"), dict) else None
    facts = _facts((data, run or {}))
    lists = _list_sizes((data, run or {}))
    lines = [f"{name}: {', '.join(facts) or 'answered'}" + (f" ({'; '.join(lists)})" if lists else "")]
    if data.get("next"):
        lines.append(f"next: {data['next']}")
    lines.append(f"The whole answer ({size_of(data)} bytes of JSON) is this result's structuredContent.")
    return "\n".join(lines)


def _facts(holders: tuple[dict[str, Any], ...]) -> list[str]:
    """`key=value` for each plain SUMMARY_FACTS value in the answer and its run, each said once."""
    facts: list[str] = []
    for holder in holders:
        for key in SUMMARY_FACTS:
            value = holder.get(key)
            if value is not None and not isinstance(value, (dict, list)) and f"{key}={value}" not in facts:
                facts.append(f"{key}={value}")
    return facts


def _list_sizes(holders: tuple[dict[str, Any], ...]) -> list[str]:
    """`units: 100 of 250` for each non-empty list in the answer and its run (the total from its page record)."""
    lists = []
    for holder in holders:
        for key, value in holder.items():
            if isinstance(value, list) and value:
                page = holder.get(f"{key}Page") or holder.get(f"{key}Listed") or {}
                total = page.get("total") if isinstance(page, dict) else None
                lists.append(f"{key}: {len(value)}" + (f" of {total}" if total and total != len(value) else ""))
    return lists


def fitted(name: str, request: Any, result: Any) -> Any:
    """A tool's answer made to fit (see the module docstring); errors and answers without structured content
    are as they are."""
    if not isinstance(result, CallToolResult) or result.is_error or not isinstance(result.structured_content, dict):
        return result
    data = result.structured_content
    rid = (data.get("run") or {}).get("runId") if isinstance(data.get("run"), dict) else data.get("runId")
    made_small = _MAKE_SMALL.get(name)
    if made_small is not None:
        made_small(data, request, rid)
    for key in ("page", "unitsPage"):  # a page record only when the list was cut (a whole list is as before)
        if key in data and data[key] is None:
            del data[key]
    shrink(data, compact.ANSWER_LIMIT)
    return result_of(data, name, list(result.content[1:]))  # blocks beyond the JSON text (a link) stay


def _run_inside(data: dict[str, Any], request: Any, rid: Any) -> None:
    """workflow_run, workflow_wait: the run view inside the answer, made small."""
    if isinstance(data.get("run"), dict):
        compact.compact_run(data["run"])


def _status(data: dict[str, Any], request: Any, rid: Any) -> None:
    """workflow_status: the run made small, or with `step` that step's output whole (in pages when large)
    beside the rest made small; the units listed within a page."""
    if getattr(request, "step", None) is None:
        compact.compact_run(data)
    else:
        steps, data["steps"] = data.get("steps") or [], []
        if isinstance(data.get("awaiting"), dict) and data["awaiting"].get("kind") in ("units", "judge"):
            compact.compact_brief(data["awaiting"], BRIEF_BESIDE_PAGE)
        compact.compact_run(data)
        _trim_page(data, "units", "unitsPage", compact.ANSWER_LIMIT // 2)
        room = _room(data, len(steps))
        for step in steps:
            compact.page_output(step, rid, getattr(request, "output_offset", 0), room)
        data["steps"] = steps
    _trim_page(data, "units", "unitsPage")


def _run_itself(data: dict[str, Any], request: Any, rid: Any) -> None:
    """workflow_resume, workflow_abandon: the answer is the run view."""
    compact.compact_run(data)


def _rewound(data: dict[str, Any], request: Any, rid: Any) -> None:
    """workflow_rewind: the run view, and the rewind as the run's rewinds list shows it."""
    if isinstance(data.get("run"), dict):
        compact.compact_run(data["run"])
        compact.compact_run({"runId": data["run"].get("runId"), "rewinds": [data.get("rewind") or {}]})


def _next_brief(data: dict[str, Any], request: Any, rid: Any) -> None:
    """workflow_next: the brief made small, or with `unit_id` each unit's prompt whole (in pages when large)."""
    if getattr(request, "unit_id", None) is None:
        compact.compact_brief(data)
        return
    units = data.get("units") or []
    prompts = [compact.clip_context(unit, rid).pop("prompt", None) for unit in units]
    room = _room(data, len(units))
    for unit, prompt in zip(units, prompts, strict=True):
        unit["prompt"] = prompt
        compact.page_prompt(unit, rid, getattr(request, "prompt_offset", 0), room)


def _reported(data: dict[str, Any], request: Any, rid: Any) -> None:
    """unit_report: the brief it answers with (the judge's, or the units a gate sent back), made small."""
    if isinstance(data.get("brief"), dict):
        compact.compact_brief(data["brief"])


def _events(data: dict[str, Any], request: Any, rid: Any) -> None:
    _trim_events(data)


def _runs(data: dict[str, Any], request: Any, rid: Any) -> None:
    _trim_page(data, "runs", "page")


# How each tool's answer is made small before it is shrunk to the limit (the tools not named: shrunk only).
_MAKE_SMALL: dict[str, Callable[[dict[str, Any], Any, Any], None]] = {
    "workflow_run": _run_inside,
    "workflow_wait": _run_inside,
    "workflow_status": _status,
    "workflow_resume": _run_itself,
    "workflow_abandon": _run_itself,
    "workflow_rewind": _rewound,
    "workflow_next": _next_brief,
    "unit_report": _reported,
    "workflow_events": _events,
    "workflow_list": _runs,
}


def _room(data: dict[str, Any], parts: int) -> int:
    """What each of `parts` long texts may take beside the rest of `data` (a page never smaller than 8 KiB)."""
    return max(PAGE_FLOOR, (compact.ANSWER_LIMIT - size_of(data) - 2048) // max(parts, 1))


def _keep(data: dict[str, Any], items: list[Any], budget: int) -> int:
    """How many leading `items` of a list inside `data` fit, for `data` to come within `budget` (at least 1)."""
    excess = size_of(data) - budget
    if excess <= 0:
        return len(items)
    sizes = [size_of(item) + 1 for item in items]
    freed, keep = 0, len(items)
    while keep > 1 and freed < excess:
        keep -= 1
        freed += sizes[keep]
    return keep


def _trim_page(data: dict[str, Any], key: str, page_key: str, budget: int = compact.ANSWER_LIMIT) -> None:
    """A paged list (`units` with `unitsPage`, `runs` with `page`) cut to what fits `budget`, its cursor
    moved back."""
    items = data.get(key)
    if not isinstance(items, list) or size_of(data) <= budget:
        return
    keep = _keep(data, items, budget)
    if keep == len(items):
        return
    data[key] = items[:keep]
    page = data.get(page_key) or {"offset": 0, "limit": None, "total": len(items)}
    page["nextOffset"] = page.get("offset", 0) + keep
    page["listed"] = keep
    data[page_key] = page


def _trim_events(data: dict[str, Any]) -> None:
    """An event page cut to what fits: `nextOffset` is the last event listed, `hasMore` says to ask again."""
    events = data.get("events")
    if not isinstance(events, list) or size_of(data) <= compact.ANSWER_LIMIT:
        return
    keep = _keep(data, events, compact.ANSWER_LIMIT)
    if keep < len(events):
        data["events"] = events[:keep]
        data["nextOffset"] = events[keep - 1].get("id", data.get("nextOffset"))
        data["hasMore"] = True


def shrink(data: dict[str, Any], budget: int) -> dict[str, Any]:
    """The last resort: while `data` is over `budget`, list the first items of its largest list that fit
    (`<key>Listed: {listed, total}` beside it), or cut its largest string to a preview that says its size."""
    for _ in range(64):  # each round at least halves one value: bounded
        if size_of(data) <= budget:
            break
        found = _largest(data, list)
        if found is not None and len(found[2]) > 1:
            holder, key, items = found
            keep = min(_keep(data, items, budget), len(items) - 1)
            holder[key] = items[:keep]
            listed = holder.get(f"{key}Listed") if isinstance(holder, dict) else None
            total = listed["total"] if isinstance(listed, dict) else len(items)
            if isinstance(holder, dict):
                holder[f"{key}Listed"] = {"listed": keep, "total": total}
            continue
        text = _largest(data, str, paged=True)
        if text is None or len(text[2]) < 2 * compact.PREVIEW_CHARS:
            break
        holder, key, value = text
        holder[key] = value[: max(compact.PREVIEW_CHARS, len(value) // 2)] + f"…[clipped: {size_of(value)} bytes]"
    return data


def _largest(
    value: Any, kind: type, holder: Any = None, key: Any = None, paged: bool = False
) -> tuple[Any, Any, Any] | None:
    """(holder, key, value) of the largest value of `kind` inside `value` (by its JSON size), else None;
    `paged`: not a page of a long text (cutting one would lose what its cursor says comes next)."""
    best: tuple[int, tuple[Any, Any, Any]] | None = None
    skip = paged and isinstance(holder, dict) and isinstance(holder.get(f"{key}Page"), dict)
    if isinstance(value, kind) and holder is not None and not skip:
        best = (size_of(value), (holder, key, value))
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in children:
        if isinstance(v, (dict, list, str)):
            found = _largest(v, kind, value, k, paged)
            if found is not None and (best is None or size_of(found[2]) > best[0]):
                best = (size_of(found[2]), found)
    return best[1] if best is not None else None
