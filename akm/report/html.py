"""A run as ONE self-contained HTML page: `akm workflow status RUN --format html`.

Fed by the api's views only — the run with its units (`RunView`), its step
graph (`RunGraph`) and its journal events — so the page shows exactly what
`status --format json` and `akm log` would, arranged for a person: a summary
(status, duration, units, tokens against the budget), the step graph, a
timeline of every unit attempt, the failures with their reasons and
diagnostics, and each step with its output, gate loops (verdict, missing,
feedback) and units.

The page fetches nothing and names no URL: CSS and SVG are inline (HTML's
own SVG, no namespace URL), there is no script at all, and a
Content-Security-Policy forbids any load; outputs expand with `<details>`. Everything that came from a run passes through `esc()`.

Size: outputs are clipped so that a 1000-unit run stays well under 2 MB —
each unit's output to a share of a fixed character budget, the units table to
`MAX_UNIT_ROWS` rows (failures first) — and if the page still comes out over
`MAX_BYTES` it is rendered again with half of each (see `_Report`). The page says where it
clipped and how to see everything (`status RUN --units --format json`).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from akm.canonical import json_array, json_object
from akm.report.escape import clip, esc, short
from akm.report.graph_svg import graph_svg
from akm.report.timeline_svg import Attempt, attempts_from_events, duration_text, seconds, timeline_svg
from akm.store.status import DRIVABLE_STATUSES
from akm.text import dollars

MAX_BYTES = 2_000_000
UNIT_TEXT_BUDGET = 600_000  # characters of unit output shared by all units of the page
UNIT_CLIP_RANGE = (120, 4000)
STEP_CLIP = 8000
NOTES_CLIP = 8000
MAX_UNIT_ROWS = 2000
MAX_LEVEL = 6  # how many times a page over MAX_BYTES is rendered again, smaller each time
_GATE_ROW = re.compile(r"^(?P<step>.+)\.gate:l(?P<loop>\d+)$")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
header{background:#263238;color:#eceff1;padding:14px 24px}header h1{margin:0;font-size:20px}
header .badge{color:#111}header .sub{font-size:12px;opacity:.8;font-family:ui-monospace,Menlo,monospace}
main{padding:8px 24px 40px;max-width:1200px}
section{background:#fff;border:1px solid #e0e0e0;border-radius:6px;margin:14px 0;padding:10px 16px}
h2{font-size:16px;margin:6px 0 10px}h3{font-size:14px;margin:10px 0 6px}
table{border-collapse:collapse;font-size:13px}td,th{white-space:nowrap;padding:3px 8px;border-bottom:1px solid #eee;text-align:left;
vertical-align:top}th{color:#555;font-weight:600}
td:last-child{white-space:normal}pre{white-space:pre-wrap;word-break:break-word;background:#f5f5f5;padding:8px;border-radius:4px;margin:4px 0;
font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;max-height:480px;overflow:auto}
details>summary{cursor:pointer;color:#37474f}.muted{color:#777}.mono{font-family:ui-monospace,Menlo,monospace}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;background:#eee}
.st-completed{background:#c8e6c9}.st-failed{background:#ffcdd2}.st-blocked{background:#ffe0b2}
.st-running,.st-active{background:#bbdefb}.st-skipped{background:#eeeeee;color:#888}.st-pending{background:#fff}
.st-awaiting_session{background:#fff9c4}.st-abandoned{background:#d7ccc8}
.step.skipped{opacity:.6}.reason{color:#b71c1c;font-weight:600}.scroll{overflow-x:auto}
.verdict-pass{color:#1b5e20;font-weight:600}.verdict-fail{color:#b71c1c;font-weight:600}
td ul{margin:0;padding-left:18px}.meter{display:inline-block;width:160px;height:9px;background:#eee;border-radius:4px;vertical-align:middle}
.meter>span{display:block;height:9px;border-radius:4px;background:#1e88e5}
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; base-uri 'none'"


def _text(value: Any) -> str:
    """An output as a person reads it: a string as it is, anything else as indented JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, indent=2)
    except (TypeError, ValueError):
        return repr(value)


def _badge(status: Any) -> str:
    return f'<span class="badge st-{esc(status)}">{esc(status)}</span>'


def _output_block(value: Any, limit: int, *, open_: bool = False, what: str = "output") -> str:
    """A clipped, expandable output: a one-line preview that opens to the (clipped) text."""
    text = _text(value)
    shown, cut = clip(text, limit)
    note = (
        f'<div class="muted">clipped: the first {limit} of {len(text)} characters; '
        f'see "How to see everything" below</div>'
        if cut
        else ""
    )
    preview = esc(short(text, 72)) or "(empty)"
    return (
        f'<details{" open" if open_ else ""}><summary>{esc(what)}: <span class="mono">{preview}</span></summary>'
        f"<pre>{esc(shown)}{'…' if cut else ''}</pre>{note}</details>"
    )


# What a session unit reported without a claim shows for its duration (see `_Report.untimed`).
UNTIMED = "not timed (done in the agent's session)"


def _same_instant(a: str | None, b: str | None) -> bool:
    start, end = seconds(a), seconds(b)
    return start is not None and end is not None and abs(end - start) < 0.001


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _fmt_cost(usd: float | None) -> str:
    """A unit's dollars beside its tokens (` · $0.0220`); nothing when unknown or not a model call."""
    return f" · {dollars(usd)}" if isinstance(usd, (int, float)) else ""


def _fmt_tokens(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def _by_key(units: list[dict[str, Any]], key: str, *, keep_empty: bool = False) -> dict[str, list[dict[str, Any]]]:
    """`units` grouped by the text of their `key`, in order; rows with no (or an empty) `key` left out
    unless `keep_empty`."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for u in units:
        if keep_empty or u.get(key):
            groups.setdefault(str(u.get(key)), []).append(u)
    return groups


def _gate_loop_row(loop: int, u: dict[str, Any]) -> str:
    """One gate loop's row: the judge's verdict (or its failure), what it found missing, its feedback."""
    verdict = json_object(u.get("result"))
    if u.get("status") == "failed":
        outcome = f'<span class="verdict-fail">judge failed</span> ({esc(u.get("failureReason") or "")})'
    elif verdict.get("complete") is True:
        outcome = '<span class="verdict-pass">passed</span>'
    elif verdict.get("complete") is False:
        outcome = '<span class="verdict-fail">rejected</span>'
    else:
        outcome = esc(u.get("status"))
    missing = json_array(verdict.get("missing"))
    miss = "".join(f"<li>{esc(short(str(m_), 400))}</li>" for m_ in missing[:50])
    feedback = verdict.get("feedback")
    fb = esc(clip(str(feedback), 4000)[0]) if feedback else '<span class="muted">—</span>'
    reason = esc(verdict.get("reason")) if verdict.get("reason") else ""
    return (
        f'<tr class="gate-loop"><td>loop {loop}</td><td>{outcome}{" — " + reason if reason else ""}'
        f'</td><td>{"<ul>" + miss + "</ul>" if miss else "—"}</td><td class="feedback">{fb}</td>'
        "</tr>"
    )


class _Report:
    """One rendering of a run at a given clip size (see `render_report`)."""

    def __init__(
        self,
        view: dict[str, Any],
        graph: dict[str, Any],
        events: list[dict[str, Any]],
        budget: dict[str, Any] | None,
        now: float,
        level: int,
    ) -> None:
        """`level` 0 is the full page; each level halves the clip sizes; from level 3 on each also halves
        the unit rows and the timeline's bars carry no tooltips (for runs of many thousand units)."""
        self.view, self.graph, self.budget, self.now = view, graph, budget or {}, now
        self.steps: list[dict[str, Any]] = view.get("steps") or []
        everything: list[dict[str, Any]] = view.get("units") or []
        self.units = [u for u in everything if not u.get("supersededBy")]
        # Rows a rewind superseded: kept as history, shown per step and rewind, never as current work.
        self.superseded = _by_key(everything, "supersededBy")
        self.rewinds: list[dict[str, Any]] = view.get("rewinds") or []
        self.anchors = {s["id"]: f"step-{i}" for i, s in enumerate(self.steps)}
        self.attempts: list[Attempt] = attempts_from_events(events)
        self.tooltips = level < 3
        work = [u for u in self.units if not _GATE_ROW.match(u["unitId"])]
        low, high = UNIT_CLIP_RANGE[0] >> level, UNIT_CLIP_RANGE[1] >> level
        self.unit_clip = max(low, min(high, (UNIT_TEXT_BUDGET >> level) // max(1, len(work))))
        self.step_clip = max(500, STEP_CLIP >> level)
        self.by_step = _by_key(self.units, "stepId", keep_empty=True)
        # Session units reported without a claim: their row is written when the result comes, so its clock
        # says 0 ms; how long the agent worked is not in the journal (a claim, status running, would time it).
        self.untimed = {
            str(u["unitId"])
            for u in self.units
            if u.get("runner") == "session" and _same_instant(u.get("startedAt"), u.get("finishedAt"))
        }
        self.rows_left = MAX_UNIT_ROWS >> max(0, level - 2)
        self.max_rows = self.rows_left
        self.rows_omitted = 0

    # ---------------------------------------------------------------- sections

    def summary(self) -> str:
        v = self.view
        body = "".join(f"<tr><th>{k}</th><td>{val}</td></tr>" for k, val in self._summary_rows())
        parts = [f'<section id="summary"><h2>Summary</h2><table>{body}</table>']
        aw = v.get("awaiting")
        if isinstance(aw, dict):
            parts.append(
                f"<p><b>Awaiting the calling agent</b>: {esc(aw.get('kind'))} of step "
                f'{esc(aw.get("stepId"))} — <span class="mono">akm workflow next {esc(v.get("runId"))}</span>'
                "</p>"
            )
        if v.get("output") is not None:
            parts.append(
                f"<h3>Result (output of step {esc(v.get('outputStepId'))})</h3>"
                + _output_block(v["output"], self.step_clip, open_=len(_text(v["output"])) < 400, what="result")
            )
        parts.append("</section>")
        return "".join(parts)

    def _summary_rows(self) -> list[tuple[str, str]]:
        """The summary table's rows: the run, its counts, its budgets, who drives it, its params."""
        v = self.view
        work = [u for u in self.units if not _GATE_ROW.match(u["unitId"])]
        logical = sum(int(s.get("unitCount") or 0) for s in self.steps)
        attempts = sum(int(s.get("attempts") or 0) for s in self.steps)
        failed = sum(1 for u in work if u.get("status") == "failed")
        known = [u["tokens"] for u in self.units if isinstance(u.get("tokens"), int)]
        tokens = sum(known) if known else None
        rows = [
            *self._run_rows(),
            ("units", f"{_plural(logical, 'unit')}, {_plural(attempts, 'attempt')} ({failed} failed)"),
            ("tokens", esc(_fmt_tokens(tokens))),
        ]
        rows.extend(self._budget_rows(attempts, tokens))
        lease = v.get("engineLease")
        if lease:
            rows.append(
                (
                    "driven by",
                    esc(
                        f"{lease.get('holder')} (host {lease.get('host')}, pid {lease.get('pid')}) "
                        f"until {lease.get('until')}"
                    ),
                )
            )
        params = v.get("params")
        rows.append(("params", f"<pre>{esc(clip(_text(params), 4000)[0])}</pre>" if params else "—"))
        return rows

    def _run_rows(self) -> list[tuple[str, str]]:
        """The run itself: status, workflow, id, when it started and last changed, how long, where it is."""
        v = self.view
        start, end = seconds(v.get("createdAt")), seconds(v.get("completedAt") or v.get("updatedAt"))
        if v.get("status") in DRIVABLE_STATUSES and not v.get("completedAt"):
            end = max(end or 0.0, self.now)
        return [
            ("status", _badge(v.get("status"))),
            ("workflow", esc(v.get("workflow"))),
            ("run id", f'<span class="mono">{esc(v.get("runId"))}</span>'),
            ("started", esc(v.get("createdAt"))),
            (
                "finished" if v.get("completedAt") else "last change",
                esc(v.get("completedAt") or v.get("updatedAt") or "—"),
            ),
            ("duration", esc(duration_text(end - start if start is not None and end is not None else None))),
            ("current step", esc(v.get("currentStepId") or "—")),
        ]

    def _budget_rows(self, attempts: int, tokens: int | None) -> list[tuple[str, str]]:
        """A meter per declared budget (units, tokens, money), the cost when no money budget was declared,
        or a note that none was."""
        rows: list[tuple[str, str]] = []
        spend = self.view.get("spend") or {}
        if self.budget.get("maxUnits"):
            rows.append(("unit budget", self._meter(attempts, self.budget["maxUnits"], "attempts")))
        if self.budget.get("maxTokens"):
            rows.append(("token budget", self._meter(tokens or 0, self.budget["maxTokens"], "tokens")))
        if spend.get("maxCost"):
            rows.append(
                ("money budget", self._meter(spend.get("cost") or 0.0, spend["maxCost"], "", spend.get("text")))
            )
        elif spend.get("cost") or spend.get("unknownUnits"):
            rows.append(("cost", esc(spend.get("text"))))
        if not any(self.budget.get(k) for k in ("maxUnits", "maxTokens", "maxCost")):
            rows.append(("budget", '<span class="muted">none declared</span>'))
        return rows

    @staticmethod
    def _meter(used: float, cap: float, what: str, words: str | None = None) -> str:
        """A bar of `used` against `cap`, then `words` (default: "1,234 of 5,000 tokens")."""
        share = min(1.0, used / cap) if cap else 0.0
        color = "#e53935" if used >= cap else ("#fb8c00" if share > 0.8 else "#1e88e5")
        return f'<span class="meter"><span style="width:{share * 100:.1f}%;background:{color}"></span></span> ' + esc(
            words if words is not None else f"{used:,} of {cap:,} {what}"
        )

    def graph_section(self) -> str:
        return (
            '<section id="graph"><h2>Step graph</h2><p class="muted">Top to bottom in plan order; a route\'s '
            "targets side by side; dashed: runs only if a route picks it; grey: skipped.</p>"
            f'<div class="scroll">{graph_svg(self.graph, self.anchors)}</div></section>'
        )

    def timeline_section(self) -> str:
        v = self.view
        end = seconds(v.get("completedAt") or v.get("updatedAt")) or self.now
        if v.get("status") in DRIVABLE_STATUSES:
            end = max(end, self.now)
        svg = timeline_svg(
            self.attempts,
            [s["id"] for s in self.steps],
            seconds(v.get("createdAt")),
            end,
            self.anchors,
            tooltips=self.tooltips,
            untimed=self.untimed,
        )
        return (
            '<section id="timeline"><h2>Timeline of unit attempts</h2><p class="muted">One lane per step; '
            "overlapping attempts stacked. Green completed, red failed, blue running or cut off, purple gate "
            f'verdicts, dark outline a retry. Hover a bar for its unit.</p><div class="scroll">{svg}</div>'
            "</section>"
        )

    def failures_section(self) -> str:
        failed_steps = [s for s in self.steps if s.get("status") in ("failed", "blocked")]
        failed_units = [u for u in self.units if u.get("status") == "failed"]
        if not failed_steps and not failed_units:
            return '<section id="failures"><h2>Failures</h2><p class="muted">None.</p></section>'
        parts = ['<section id="failures"><h2>Failures</h2>']
        for s in failed_steps:
            notes = (s.get("notes") or s.get("summary") or "").strip()
            shown, cut = clip(notes, NOTES_CLIP)
            parts.append(
                f'<h3>step <a href="#{self.anchors[s["id"]]}">{esc(s["id"])}</a> {_badge(s.get("status"))}'
                f"</h3><pre>{esc(shown)}{'…' if cut else ''}</pre>"
            )
        if failed_units:
            reasons: dict[str, int] = {}
            for u in failed_units:
                reasons[str(u.get("failureReason"))] = reasons.get(str(u.get("failureReason")), 0) + 1
            tally = ", ".join(f"{esc(r)}: {n}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
            parts.append(f"<h3>{len(failed_units)} failed unit attempt(s)</h3><p>by reason — {tally}</p>")
            parts.append(self._units_table(failed_units, diagnostic=True))
        parts.append("</section>")
        return "".join(parts)

    def _units_table(self, units: list[dict[str, Any]], *, diagnostic: bool = False) -> str:
        rows = []
        for u in units:
            if self.rows_left <= 0:
                self.rows_omitted += 1
                continue
            self.rows_left -= 1
            start, end = seconds(u.get("startedAt")), seconds(u.get("finishedAt"))
            took = duration_text(end - start) if start is not None and end is not None else "—"
            if str(u["unitId"]) in self.untimed:
                took = UNTIMED
            reason = u.get("failureReason")
            extra = ""
            if u.get("truncated"):
                extra += ' <span class="muted">(output cut at the capture cap)</span>'
            if u.get("stale"):
                extra += ' <span class="reason">stale: no heartbeat for 90 s</span>'
            if u.get("reusedFrom"):
                src = u["reusedFrom"]
                extra += (
                    f' <span class="muted">(reused from {esc(src.get("unitId"))} of run {esc(src.get("runId"))})</span>'
                )
            if u.get("supersededBy"):
                extra += ' <span class="muted">(superseded)</span>'
            out = (
                ""
                if u.get("result") is None
                else _output_block(u["result"], self.unit_clip, what="diagnostic" if diagnostic else "output")
            )
            rows.append(
                f'<tr class="unit" data-unit="{esc(u["unitId"])}"><td class="mono">{esc(u["unitId"])}</td>'
                f"<td>{_badge(u.get('status'))}{extra}</td><td>{esc(u.get('attempts'))}</td>"
                f"<td>{esc(took)}</td><td>{esc(_fmt_tokens(u.get('tokens')) + _fmt_cost(u.get('cost')))}</td>"
                f'<td class="reason">{esc(reason or "")}</td><td>{out}</td></tr>'
            )
        if not rows:
            return ""
        return (
            '<div class="scroll"><table><tr><th>unit</th><th>status</th><th>dispatches</th><th>took</th>'
            "<th>tokens</th><th>reason</th><th>output</th></tr>" + "".join(rows) + "</table></div>"
        )

    def _gate_loops(self, step_id: str, among: list[dict[str, Any]] | None = None) -> str:
        loops = []
        for u in self.by_step.get(step_id, []) if among is None else among:
            m = _GATE_ROW.match(u["unitId"])
            if m and m.group("step") == step_id:
                loops.append((int(m.group("loop")), u))
        if not loops:
            return ""
        rows = [_gate_loop_row(loop, u) for loop, u in sorted(loops, key=lambda p: p[0])]
        return (
            "<h3>Gate loops</h3><table><tr><th>loop</th><th>verdict</th><th>missing</th><th>feedback</th></tr>"
            + "".join(rows)
            + "</table>"
        )

    def step_sections(self) -> str:
        parts = ['<section id="steps"><h2>Steps</h2>']
        for s in self.steps:
            parts.extend(self._step_section(s))
        parts.append("</section>")
        return "".join(parts)

    def _step_tally(self, s: dict[str, Any], units: list[dict[str, Any]]) -> str:
        """The counts beside a step's name: units, attempts, gate loops, failures, cut outputs, tokens, wall time."""
        sid = s["id"]
        tally = f"{_plural(s.get('unitCount') or 0, 'unit')}, {_plural(s.get('attempts') or 0, 'attempt')}"
        if (s.get("gateLoops") or 0) > 1:
            tally += f", {s.get('gateLoops')} gate loops"
        failed = sum(1 for u in units if u.get("status") == "failed")
        if failed:
            tally += f", {failed} failed"
        if s.get("truncatedUnits"):
            tally += f"; output of {s['truncatedUnits']} unit(s) cut at the capture cap"
        known = [u["tokens"] for u in self.by_step.get(sid, []) if isinstance(u.get("tokens"), int)]
        if known:
            tally += f"; {sum(known):,} tokens"
        return tally + self._wall_time(sid)

    def _wall_time(self, sid: str) -> str:
        """ "; 1.2 s wall": from the step's first timed attempt's start to its last one's end ("" if none ended)."""
        spans = [a for a in self.attempts if a.step_id == sid and a.unit_id not in self.untimed]
        if spans:
            ends = [a.end for a in spans if a.end is not None]
            if ends:
                return f"; {duration_text(max(ends) - min(a.start for a in spans))} wall"
        return ""

    def _step_section(self, s: dict[str, Any]) -> list[str]:
        """One step's part of the page: its head, summary and notes, output, gate loops and unit rows."""
        sid, status = s["id"], s.get("status")
        units = [u for u in self.by_step.get(sid, []) if not _GATE_ROW.match(u["unitId"])]
        tally = self._step_tally(s, units)
        parts = [
            f'<div class="step {esc(status)}" id="{self.anchors[sid]}" data-step="{esc(sid)}">'
            f'<h3><span class="mono">{esc(sid)}</span> {_badge(status)} '
            f'<span class="muted">{esc(tally)}</span></h3>'
        ]
        summary = (s.get("summary") or "").strip()
        notes = (s.get("notes") or "").strip()
        if summary:
            parts.append(f"<div>{esc(short(summary, 600))}</div>")
        if notes and status not in ("failed", "blocked"):
            parts.append(f'<div class="muted">{esc(short(notes, 600))}</div>')
        elif notes:
            parts.append(
                f'<div class="reason">{esc(short(notes, 300))} <a href="#failures">(in full under Failures)</a></div>'
            )
        if s.get("output") is not None:
            parts.append(_output_block(s["output"], self.step_clip, open_=len(_text(s["output"])) < 400))
        parts.append(self._gate_loops(sid))
        if units:
            table = self._units_table(units)
            if table:
                parts.append(
                    f"<details{' open' if len(units) <= 12 else ''}><summary>{len(units)} unit(s)"
                    f"</summary>{table}</details>"
                )
        parts.append("</div>")
        return parts

    def rewinds_section(self) -> str:
        """Each rewind: where it took the run back to and what it superseded — the step outputs, gate verdicts
        and unit rows as they were, marked superseded (nothing is deleted)."""
        if not self.rewinds:
            return ""
        parts = ['<section id="rewinds"><h2>Rewinds</h2>']
        for r in self.rewinds:
            redo = r.get("redo")
            how = (
                "every unit redone"
                if redo is True
                else (f"redoing {', '.join(redo)}" if redo else "unchanged units reused")
            )
            was = f"{r.get('fromStatus')} at {r.get('fromStep')}" if r.get("fromStep") else str(r.get("fromStatus"))
            parts.append(
                f'<div class="rewind" data-rewind="{esc(r.get("rewindId"))}"><h3>rewind {esc(r.get("seq"))}: back to '
                f'<span class="mono">{esc(r.get("toStep"))}</span> <span class="muted">{esc(r.get("createdAt"))} · '
                f"the run was {esc(was)} · {esc(how)}</span></h3>"
            )
            rows = self.superseded.get(str(r.get("rewindId")), [])
            for st in r.get("steps") or []:
                parts.extend(self._superseded_step(st, rows))
            parts.append("</div>")
        parts.append("</section>")
        return "".join(parts)

    def _superseded_step(self, st: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
        """A step as a rewind found it: its summary, output, gate loops and unit rows (of `rows`, the rewind's)."""
        sid = st["id"]
        parts = [
            f'<div class="superseded" data-step="{esc(sid)}"><h4><span class="mono">{esc(sid)}</span> '
            f'{_badge(st.get("status"))} <span class="muted">superseded</span></h4>'
        ]
        summary = (st.get("summary") or st.get("notes") or "").strip()
        if summary:
            parts.append(f'<div class="muted">{esc(short(summary, 600))}</div>')
        if st.get("output") is not None:
            parts.append(_output_block(st["output"], self.step_clip, what="superseded output"))
        mine = [u for u in rows if u.get("stepId") == sid]
        parts.append(self._gate_loops(sid, mine))
        work = [u for u in mine if not _GATE_ROW.match(u["unitId"])]
        table = self._units_table(work) if work else ""
        if table:
            parts.append(f"<details><summary>{len(work)} superseded unit row(s)</summary>{table}</details>")
        parts.append("</div>")
        return parts

    def footer(self) -> str:
        rid = esc(self.view.get("runId"))
        omitted = (
            f"<p>{self.rows_omitted} unit row(s) were left out of the tables (at most {self.max_rows}, "
            "failures first).</p>"
            if self.rows_omitted
            else ""
        )
        return (
            f'<section id="whole"><h2>How to see everything</h2>{omitted}<p>This page clips each unit\'s '
            f"output to {self.unit_clip} characters and each step's to {self.step_clip}. Every output in full: "
            f'<span class="mono">akm workflow status {rid} --units --format json</span>; every journal event: '
            f'<span class="mono">akm log --run {rid}</span>.</p></section>'
        )

    def page(self) -> str:
        v = self.view
        title = f"akm run {v.get('title') or ''} — {v.get('status')}"
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>{esc(v.get('title'))} {_badge(v.get('status'))}</h1>"
            f'<div class="sub">run {esc(v.get("runId"))} · {esc(v.get("workflow"))} · plan '
            f"{esc(str(v.get('planHash'))[:12])} · report made {esc(time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.now)))}"
            "</div></header><main>"
            + self.summary()
            + self.graph_section()
            + self.timeline_section()
            + self.failures_section()
            + self.step_sections()
            + self.rewinds_section()
            + self.footer()
            + "</main></body></html>\n"
        )


def render_report(
    view: dict[str, Any],
    graph: dict[str, Any],
    events: list[dict[str, Any]],
    budget: dict[str, Any] | None = None,
    *,
    now: float | None = None,
) -> str:
    """The HTML page of a run. `view`: `RunView.to_json()` with units; `graph`: `RunGraph.to_json()`;
    `events`: the run's `EventView.to_json()`s in journal order; `budget`: `{maxUnits, maxTokens, maxCost}` or None.

    Lone surrogates (possible in JSON from outside) become `?`, so the page always encodes as UTF-8."""
    now = time.time() if now is None else now
    level = 0
    while True:
        page = _Report(view, graph, events, budget, now, level).page()
        page = page.encode("utf-8", "replace").decode("utf-8")
        if len(page.encode("utf-8")) <= MAX_BYTES or level >= MAX_LEVEL:
            return page
        level += 1
