"""The timeline of a run's unit attempts as inline SVG: one lane per step, a bar per attempt.

Attempts come from the journal's `workflow_unit_started` / `workflow_unit_finished`
events (the units table keeps only each unit's latest dispatch; the events keep
every one, retries and re-dispatches after a crash included). Within a step's
lane, attempts that overlapped in time are stacked in sub-rows, so a fan-out's
concurrency shows as the lane's height. Bars: completed green, failed red,
still running (or cut off by a crash) blue, gate verdicts purple; a retry
(`~r<k>`) has a dark outline. Every bar's tooltip names the unit, its status,
duration and failure reason.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, NamedTuple

from akm.report.escape import esc, short

LABEL_W, PLOT_W = 170, 740
ROW_H, ROW_GAP, LANE_GAP = 9, 2, 10
MAX_SUBROWS = 48

COLOR = {"completed": "#43a047", "failed": "#e53935", "running": "#1e88e5", "unfinished": "#90a4ae"}
GATE_COLOR = "#8e24aa"


class Attempt(NamedTuple):
    unit_id: str
    step_id: str
    start: float  # seconds since the epoch
    end: float | None  # None: never finished (still running, or its driver died)
    status: str  # completed | failed | running
    reason: str | None
    tokens: int | None


def seconds(ts: str | None) -> float | None:
    """A journal timestamp (ISO 8601, UTC) as seconds since the epoch; None when absent or unreadable."""
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def attempts_from_events(events: list[dict[str, Any]]) -> list[Attempt]:
    """Pair each unit's start and finish events, in journal order (one pair per dispatch that ran: a row closed
    `not_run` was journaled but never dispatched — akm.engine.ahead — and draws no bar)."""
    open_: dict[str, tuple[str, float]] = {}
    out: list[Attempt] = []
    for ev in events:
        kind, meta = ev.get("eventType"), ev.get("metadata") or {}
        unit_id, at = meta.get("unitId"), seconds(ev.get("ts"))
        if not isinstance(unit_id, str) or at is None:
            continue
        if kind == "workflow_unit_started":
            if unit_id in open_:  # re-dispatched without a finish: the earlier attempt was cut off
                step, start = open_.pop(unit_id)
                out.append(Attempt(unit_id, step, start, at, "unfinished", "interrupted", None))
            open_[unit_id] = (str(meta.get("stepId") or ""), at)
        elif kind == "workflow_unit_finished" and unit_id in open_:
            step, start = open_.pop(unit_id)
            if meta.get("failureReason") == "not_run":
                continue  # a row journaled ahead and taken back (or closed at fail fast): nothing ran, no bar
            tokens = meta.get("tokens")
            out.append(
                Attempt(
                    unit_id,
                    step,
                    start,
                    at,
                    str(meta.get("status") or "completed"),
                    meta.get("failureReason"),
                    tokens if isinstance(tokens, int) else None,
                )
            )
    out.extend(Attempt(unit_id, step, start, None, "running", None, None) for unit_id, (step, start) in open_.items())
    out.sort(key=lambda a: a.start)
    return out


def _duration(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def duration_text(s: float | None) -> str:
    return "—" if s is None else _duration(max(0.0, s))


_AXIS_UNITS = ((1.0, "ms", 0.001), (120.0, "s", 1.0), (7200.0, "min", 60.0), (float("inf"), "h", 3600.0))


def axis_ticks(span: float, most: int = 6) -> list[tuple[float, str]]:
    """(seconds from the start, label) of the timeline's ticks: round steps (1, 2, 2.5 or 5 × 10ⁿ) of ONE
    unit chosen for the whole span — never "0 ms … 48.0 s … 1.2 min" on one axis."""
    _, unit, size = next(u for u in _AXIS_UNITS if span < u[0])
    total = span / size
    raw = total / max(1, most - 1)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks = []
    k = 0
    while k * step <= total * (1 + 1e-9):
        value = k * step
        number = f"{value:.0f}" if float(value).is_integer() else f"{value:g}"
        ticks.append((value * size, f"{number} {unit}"))
        k += 1
    return ticks


def _pack(attempts: list[Attempt], end_of: dict[int, float]) -> list[int]:
    """A sub-row per attempt: the first row whose last bar ended before this one starts."""
    ends: list[float] = []
    rows: list[int] = []
    for i, a in enumerate(attempts):
        row = next((r for r, e in enumerate(ends) if e <= a.start), None)
        if row is None:
            row = len(ends) if len(ends) < MAX_SUBROWS else len(ends) - 1
            if row == len(ends):
                ends.append(0.0)
        ends[row] = max(ends[row], end_of[i])
        rows.append(row)
    return rows


def timeline_svg(
    attempts: list[Attempt],
    step_order: list[str],
    run_start: float | None,
    run_end: float,
    anchors: dict[str, str] | None = None,
    *,
    tooltips: bool = True,
    untimed: set[str] | frozenset[str] = frozenset(),
) -> str:
    """The SVG element for `attempts`, lanes in `step_order`; open attempts end at `run_end`;
    `tooltips=False` leaves out each bar's title (a page for very many attempts must stay small);
    `untimed`: attempts whose duration the journal does not know (a session unit reported unclaimed)."""
    anchors = anchors or {}
    if not attempts:
        return '<p class="muted">No unit was dispatched.</p>'
    t0 = min([a.start for a in attempts] + ([run_start] if run_start is not None else []))
    t1 = max([run_end] + [a.end for a in attempts if a.end is not None])
    span = max(t1 - t0, 1e-3)
    scale = PLOT_W / span
    by_step: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_step.setdefault(a.step_id, []).append(a)
    lanes = [s for s in step_order if s in by_step] + [s for s in by_step if s not in step_order]
    parts: list[str] = []
    y = 22
    for step in lanes:
        items = by_step[step]
        end_of = {i: (a.end if a.end is not None else t1) for i, a in enumerate(items)}
        rows = _pack(items, end_of)
        lane_h = (max(rows) + 1) * (ROW_H + ROW_GAP)
        label = esc(short(step, 24))
        anchor = anchors.get(step)
        text = f'<text x="4" y="{y + min(lane_h, 14) - 3}" font-size="12">{label}</text>'
        parts.append(f'<a href="#{esc(anchor)}">{text}</a>' if anchor else text)
        parts.append(f'<rect x="{LABEL_W}" y="{y - 2}" width="{PLOT_W}" height="{lane_h + 2}" fill="#f7f7f7"/>')
        for i, a in enumerate(items):
            x = LABEL_W + (a.start - t0) * scale + 0.5  # half a pixel each side: back-to-back bars stay apart
            w = max(1.0, (end_of[i] - a.start) * scale - 1)
            gate = ".gate:l" in a.unit_id
            color = GATE_COLOR if gate else COLOR.get(a.status, COLOR["unfinished"])
            outline = ' stroke="#212121" stroke-width="1"' if "~r" in a.unit_id else ""
            took = duration_text(end_of[i] - a.start) + ("" if a.end is not None else ", not finished")
            if a.unit_id in untimed:
                took = "reported by the calling agent, not timed"
            tip = f"{a.unit_id}: {a.status}, {took}" + (f" ({a.reason})" if a.reason else "")
            title = f"<title>{esc(tip)}</title>" if tooltips else ""
            parts.append(
                f'<rect class="bar bar-{esc(a.status)}" x="{x:.1f}" y="{y + rows[i] * (ROW_H + ROW_GAP)}" '
                f'width="{w:.1f}" height="{ROW_H}" fill="{color}"{outline}>{title}</rect>'
            )
        y += lane_h + LANE_GAP
    ticks = []
    for offset, text in axis_ticks(span):
        x = LABEL_W + offset * scale
        ticks.append(
            f'<line x1="{x:.0f}" y1="14" x2="{x:.0f}" y2="{y}" stroke="#ddd"/>'
            f'<text x="{x:.0f}" y="11" font-size="10" text-anchor="middle">{esc(text)}</text>'
        )
    width, height = LABEL_W + PLOT_W + 30, y + 4
    return (
        f'<svg class="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="timeline of unit attempts">'
        + "".join(ticks)
        + "".join(parts)
        + "</svg>"
    )
