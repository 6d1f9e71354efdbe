"""Text renderings for the command-line front: run views and mermaid graphs.

Pure functions from the api's JSON views to strings; the CLI prints them. Kept
out of `akm/cli.py` so that module stays a thin adapter, and imported only by
the commands that render (start-up pays nothing for it).
"""

from __future__ import annotations

import json
from typing import Any

# How much of a step's output the text views show; `--format json` always has all of it.
_STEP_CLIP = (6, 600)  # lines, characters
_RESULT_CLIP = (40, 4000)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _clip(text: str, limits: tuple[int, int]) -> tuple[str, bool]:
    max_lines, max_chars = limits
    lines = text.splitlines() or [""]
    clipped = len(lines) > max_lines or len(text) > max_chars
    text = "\n".join(lines[:max_lines])
    if len(text) > max_chars:
        text = text[:max_chars]
    return (text.rstrip() + " …" if clipped else text), clipped


def _value_text(value: Any) -> str:
    """A step output as a person reads it: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _tally(step: dict[str, Any]) -> str:
    """"3 units, 5 attempts, 2 gate loops": the work behind a step, retries and loops included."""
    n, attempts, loops = step.get("unitCount") or 0, step.get("attempts") or 0, step.get("gateLoops") or 0
    parts = [_plural(n, "unit")]
    if attempts > n:
        parts.append(_plural(attempts, "attempt"))
    if loops > 1:
        parts.append(_plural(loops, "gate loop"))
    return ", ".join(parts)


def run_text(view: dict[str, Any]) -> str:
    lines = [f"run {view['runId']}  {view['status']}  ({view['workflow']})"]
    if view.get("params"):
        lines.append(f"params: {json.dumps(view['params'], ensure_ascii=False)}")
    if view.get("currentStepId") and view["status"] != "completed":
        lines.append(f"current step: {view['currentStepId']}")
    lease = view.get("engineLease")
    if lease:
        lines.append(f"driven by {lease['holder']} (host {lease.get('host')}, pid {lease.get('pid')}) until {lease['until']}")
    clipped_any = False
    width = max((len(s["id"]) for s in view.get("steps") or []), default=0)
    for s in view.get("steps") or []:
        head = f"  {s['status']:<10} {s['id']:<{width}}"
        notes = (s.get("notes") or "").strip()
        summary = (s.get("summary") or "").strip()
        if s["status"] in ("failed", "blocked"):
            # the cause of a failure is the one thing a user must see in full
            lines.append(head + (f"  — {_tally(s)}" if s.get("unitCount") else ""))
            lines.extend(f"             {line}" for line in (notes or summary).splitlines())
            continue
        if s.get("unitCount"):
            detail = _tally(s)
            if "Failed:" in summary:  # units failed under on_error: continue — say so
                detail += "; " + summary.splitlines()[0]
        else:
            detail = (summary or notes).splitlines()[0] if (summary or notes) else ""
        lines.append(head + (f"  — {detail}" if detail else ""))
        if s["status"] == "completed" and s.get("output") is not None:
            text, clipped = _clip(_value_text(s["output"]), _STEP_CLIP)
            clipped_any = clipped_any or clipped
            first, *rest = text.splitlines() or [""]
            lines.append(f"             → {first}")
            lines.extend(f"               {line}" for line in rest)
    for u in view.get("units") or []:
        extra = f" ({u['failureReason']})" if u.get("failureReason") else ""
        if u.get("truncated"):
            extra += " (output truncated at the capture cap)"
        if u.get("stale"):
            extra += " STALE: no heartbeat for 90 s, its driver is probably gone"
        lines.append(f"    unit {u['unitId']}: {u['status']}{extra}, attempts {u['attempts']}")
    aw = view.get("awaiting")
    if aw:
        lines.append(f"awaiting the calling agent: {aw.get('kind')} of step {aw.get('stepId')}")
    if view.get("output") is not None:
        text, clipped = _clip(_value_text(view["output"]), _RESULT_CLIP)
        clipped_any = clipped_any or clipped
        lines.append(f"result (output of step {view.get('outputStepId')}):")
        lines.extend(f"  {line}" for line in text.splitlines() or [""])
    if clipped_any:
        lines.append(f"(outputs clipped; all of them: akm workflow status {view['runId']} --format json)")
    return "\n".join(lines)


def _mermaid_text(text: str) -> str:
    """Text safe inside a quoted mermaid label: entity codes for `#`, quotes, HTML and backticks;
    line breaks and other control characters become spaces (a label is one line)."""
    text = text.replace("#", "#35;")
    for ch, code in (('"', "#quot;"), ("<", "#lt;"), (">", "#gt;"), ("&", "#amp;"), ("`", "#96;")):
        text = text.replace(ch, code)
    return "".join(" " if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 else c for c in text)


def _flow_edges(plan: Any) -> list[tuple[str, str, str | None, bool]]:
    """(from, to, label, certain) edges of the plan's control flow.

    Steps run in order; a route selects one of its targets and every other
    target of that route is skipped. So the targets of one route are
    alternatives: each continues to the first later step that is not one of
    its alternatives (never to a sibling). Passing a step that only runs when
    some route selects it gives a dotted (uncertain) edge and the walk goes on
    to the next step, up to the first one that always runs.
    """
    order = [s.step_id for s in plan.steps]
    targets_of: dict[str, list[str]] = {}
    for s in plan.steps:
        if s.route is not None:
            targets_of[s.step_id] = list(dict.fromkeys([*s.route.when.values(),
                                                        *([s.route.default_step_id] if s.route.default_step_id else [])]))
    conditional = {t for ts in targets_of.values() for t in ts}
    edges: list[tuple[str, str, str | None, bool]] = []
    for i, step_id in enumerate(order):
        exclusive = set(targets_of.get(step_id, []))
        for ts in targets_of.values():
            if step_id in ts:
                exclusive.update(t for t in ts if t != step_id)
        for later in order[i + 1:]:
            if later in exclusive:
                continue
            edges.append((step_id, later, None, later not in conditional))
            if later not in conditional:
                break
    for router, ts in targets_of.items():
        s = plan.step(router)
        for match, target in s.route.when.items():
            edges.append((router, target, match, True))
        if s.route.default_step_id:
            edges.append((router, s.route.default_step_id, "default", False))
    return edges


def mermaid(plan: Any, view: dict[str, Any]) -> str:
    """A flowchart of the run: one node per step coloured by status, routes drawn as branches."""
    status = {s["id"]: s["status"] for s in view.get("steps") or []}
    ids = {s.step_id: f"s{i}" for i, s in enumerate(plan.steps)}
    lines = ["flowchart TD"]
    for s in plan.steps:
        kind = "route" if s.route else ("map" if s.root is not None and s.root.kind == "map" else "unit")
        label = f"{_mermaid_text(s.step_id)}<br/>{kind} · {_mermaid_text(status.get(s.step_id, 'pending'))}"
        shape = f'{{"{label}"}}' if s.route else f'["{label}"]'
        lines.append(f"  {ids[s.step_id]}{shape}")
    for src, dst, label, certain in _flow_edges(plan):
        if label is not None:
            arrow = f'-- "{_mermaid_text(label)}" -->' if certain else f'-. "{_mermaid_text(label)}" .->'
        else:
            arrow = "-->" if certain else "-.->"
        lines.append(f"  {ids[src]} {arrow} {ids[dst]}")
    colors = {"completed": "#c8e6c9", "running": "#bbdefb", "failed": "#ffcdd2", "blocked": "#ffe0b2",
              "skipped": "#eeeeee", "pending": "#ffffff"}
    for st, color in colors.items():
        lines.append(f"  classDef {st} fill:{color},stroke:#555")
    for s in plan.steps:
        st = status.get(s.step_id, "pending")
        lines.append(f"  class {ids[s.step_id]} {st if st in colors else 'pending'}")
    return "\n".join(lines)
