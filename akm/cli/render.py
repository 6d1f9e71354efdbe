"""Renderings and output for the command-line front: run views, mermaid graphs, briefs, and the writers
every command prints with (terminal-active characters made visible).

Pure functions from the api's JSON views to strings, and the few functions that write them. Only `json`
and `sys` at top level: every command loads this module, `akm --version` included.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from akm.api import LintReport


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


_PARAMS_CLIP = 300  # characters of the params line before each param is summarised
_PARAM_CLIP = 80


def _params_text(params: dict[str, Any]) -> tuple[str, bool]:
    """The params on one line; when that passes _PARAMS_CLIP, each long param summarised (its beginning and,
    for a list or object, how many items it has) — a 10,000-item list was one 129 KB line."""
    whole = json.dumps(params, ensure_ascii=False)
    if len(whole) <= _PARAMS_CLIP:
        return whole, False
    parts = []
    for name, value in params.items():
        text = json.dumps(value, ensure_ascii=False)
        if len(text) > _PARAM_CLIP:
            size = (
                f" ({_plural(len(value), 'item')})"
                if isinstance(value, list)
                else f" ({_plural(len(value), 'key')})"
                if isinstance(value, dict)
                else f" ({len(value)} characters)"
                if isinstance(value, str)
                else ""
            )
            text = text[:_PARAM_CLIP].rstrip() + " …" + size
        parts.append(f"{name}={text}")
    return ", ".join(parts), True


def _tally(step: dict[str, Any]) -> str:
    """ "3 units, 5 attempts, 2 gate loops": the work behind a step, retries and loops included."""
    n, attempts, loops = step.get("unitCount") or 0, step.get("attempts") or 0, step.get("gateLoops") or 0
    parts = [_plural(n, "unit") + (f" ({step['reusedUnits']} reused)" if step.get("reusedUnits") else "")]
    if attempts > n:
        parts.append(_plural(attempts, "attempt"))
    if loops > 1:
        parts.append(_plural(loops, "gate loop"))
    return ", ".join(parts)


def _truncation_note(step: dict[str, Any]) -> str:
    """A completed step whose output is only a beginning must say so where its output is shown."""
    n = step.get("truncatedUnits") or 0
    if not n:
        return ""
    return f"; output of {_plural(n, 'unit')} cut at the capture cap (only its beginning was kept)"


def run_text(view: dict[str, Any]) -> str:
    """A run as `workflow status` prints it: its head, steps, units, spend, the way on, rewinds, what the
    calling agent is asked for and the result. Long values are clipped, and the last line then says where
    to read them whole."""
    lines: list[str] = []
    clipped_any = _head_lines(view, lines)
    clipped_any = _step_lines(view.get("steps") or [], lines) or clipped_any
    lines.extend(_unit_line(u) for u in view.get("units") or [])
    spend = view.get("spend") or {}
    if _has_spend(spend):
        lines.append(_spend_line(spend))
    rec = view.get("recovery")
    if rec:
        why = str(rec.get("why") or "")
        lines.append(f"to go on: {remedy_command(rec, view['runId'])}")
        lines.append(f"  ({why})")
    clipped_any = _rewind_lines(view, lines) or clipped_any
    _awaiting_lines(view, lines)
    clipped_any = _result_lines(view, lines) or clipped_any
    if clipped_any:
        lines.append(
            f"(long params and outputs clipped; all of them: akm workflow status {view['runId']} --format json)"
        )
    return "\n".join(lines)


def _head_lines(view: dict[str, Any], lines: list[str]) -> bool:
    """The run's id, status and workflow, its params, current step and driver; whether params were clipped."""
    lines.append(f"run {view['runId']}  {view['status']}  ({view['workflow']})")
    clipped = False
    if view.get("params"):
        text, clipped = _params_text(view["params"])
        lines.append(f"params: {text}")
    if view.get("currentStepId") and view["status"] != "completed":
        lines.append(f"current step: {view['currentStepId']}")
    lease = view.get("engineLease")
    if lease:
        lines.append(
            f"driven by {lease['holder']} (host {lease.get('host')}, pid {lease.get('pid')}) until {lease['until']}"
        )
    return clipped


def _step_lines(steps: list[dict[str, Any]], lines: list[str]) -> bool:
    """A line per step (a failure's cause in full, a completed step's output below it); whether any was clipped."""
    clipped_any = False
    width = max((len(s["id"]) for s in steps), default=0)
    for s in steps:
        head = f"  {s['status']:<10} {s['id']:<{width}}"
        if s["status"] in ("failed", "blocked"):
            lines.extend(_stopped_step_lines(s, head))
            continue
        detail, clipped = _step_detail(s)
        clipped_any = clipped_any or clipped
        lines.append(head + (f"  — {detail}" if detail else ""))
        if s["status"] == "completed" and s.get("output") is not None:
            text, clipped = _clip(_value_text(s["output"]), _STEP_CLIP)
            clipped_any = clipped_any or clipped
            first, *rest = text.splitlines() or [""]
            lines.append(f"             → {first}")
            lines.extend(f"               {line}" for line in rest)
    return clipped_any


def _stopped_step_lines(s: dict[str, Any], head: str) -> list[str]:
    """A failed or blocked step: its cause, the one thing a user must see in full, below its line."""
    notes = (s.get("notes") or "").strip()
    summary = (s.get("summary") or "").strip()
    return [head + (f"  — {_tally(s)}" if s.get("unitCount") else "")] + [
        f"             {line}" for line in (notes or summary).splitlines()
    ]


def _step_detail(s: dict[str, Any]) -> tuple[str, bool]:
    """What follows a step's status on its line: its unit tally (and tolerated failures, a cut output), else
    the first line of its summary, else where a step still to run goes; whether it was clipped."""
    notes = (s.get("notes") or "").strip()
    summary = (s.get("summary") or "").strip()
    if s.get("unitCount"):
        detail = _tally(s)
        if "Failed:" in summary:  # units failed under on_error: continue — say so
            detail += "; " + summary.splitlines()[0]
        detail += _truncation_note(s)
    else:
        detail = (summary or notes).splitlines()[0] if (summary or notes) else ""
    clipped = False
    if len(detail) > _STEP_CLIP[1]:
        detail, clipped = detail[: _STEP_CLIP[1]].rstrip() + " …", True
    if not detail and s["status"] in ("pending", "running") and s.get("runsOn"):
        detail = f"on {s['runsOn']}"  # what is still to run: where it goes
    return detail, clipped


def _unit_line(u: dict[str, Any]) -> str:
    """One unit or gate row of `--units`: status, what is unusual about it, attempts, where and what it cost."""
    extra = f" ({u['failureReason']})" if u.get("failureReason") else ""
    if u.get("truncated"):
        extra += " (output truncated at the capture cap)"
    if u.get("stale"):
        extra += " STALE: no heartbeat for 90 s, its driver is probably gone"
    if u.get("reusedFrom"):
        extra += f" (reused from {u['reusedFrom'].get('unitId')} of run {u['reusedFrom'].get('runId')})"
    if u.get("supersededBy"):
        extra += f" (superseded by rewind {u['supersededBy']})"
    return (
        f"    {'gate' if u.get('phase') == 'gate' else 'unit'} {u['unitId']}: {u['status']}{extra}, "
        f"attempts {u['attempts']}"
        + (f", host {u['host']}" if u.get("host") else "")
        + (f", engine {u['engine']}" if u.get("engine") else "")
        + (f", session {u['sessionId']}" if u.get("sessionId") else "")
        + (f", {dollars(u['cost'])}" if u.get("cost") is not None else "")
    )


def _has_spend(spend: dict[str, Any]) -> bool:
    """Whether the spend line is worth a line: money spent, usage unknown, or a ceiling set."""
    return bool(
        spend.get("cost")
        or spend.get("unknownUnits")
        or any(spend.get(k) is not None for k in ("maxUnits", "maxTokens", "maxCost"))
    )


def _rewind_lines(view: dict[str, Any], lines: list[str]) -> bool:
    """A line per rewind (with `--units`, the steps it superseded as they were); whether an output was clipped."""
    clipped_any = False
    for r in view.get("rewinds") or []:
        was = f"{r['fromStatus']} at {r['fromStep']}" if r.get("fromStep") else r["fromStatus"]
        wanted = r.get("redo")
        redo = ", every unit redone" if wanted is True else (f", redoing {', '.join(wanted)}" if wanted else "")
        lines.append(f"rewind {r['seq']} ({r['createdAt']}): back to step {r['toStep']} (was {was}{redo})")
        if view.get("units") is not None:  # --units: what it superseded, as it was
            for st in r.get("steps") or []:
                out = ""
                if st.get("output") is not None:
                    text, clipped = _clip(_value_text(st["output"]), _STEP_CLIP)
                    clipped_any = clipped_any or clipped
                    out = " → " + text.splitlines()[0] if text else ""
                lines.append(f"    superseded {st['status']:<10} {st['id']}{out}")
    return clipped_any


def _awaiting_lines(view: dict[str, Any], lines: list[str]) -> None:
    """What a run parked for the calling agent waits for, and the three commands that answer it."""
    aw = view.get("awaiting")
    if not aw:
        return
    rid = view.get("runId")
    if aw.get("kind") == "judge":
        what = f"a verdict on the gate of step {aw.get('stepId')}"
    elif aw.get("kind") == "units":
        n = len(aw.get("units") or [])
        what = f"{n} unit{'' if n == 1 else 's'} of step {aw.get('stepId')}"
    else:
        what = f"step {aw.get('stepId')}"
    lines.append(f"awaiting the calling agent: {what}")
    lines.append(f"  what to do: akm workflow next {rid}")
    lines.append(
        f"  then:       akm workflow report {rid} UNIT --status completed --result …"
        + ("  (or --verdict for a gate)" if aw.get("kind") == "judge" else "")
    )
    lines.append(f"  and:        akm workflow run {rid}")


def _result_lines(view: dict[str, Any], lines: list[str]) -> bool:
    """The run's result (its output step's output) when it has one; whether it was clipped."""
    if view.get("output") is None:
        return False
    text, clipped = _clip(_value_text(view["output"]), _RESULT_CLIP)
    cut: dict[str, Any] = next((s for s in view.get("steps") or [] if s["id"] == view.get("outputStepId")), {})
    lines.append(
        f"result (output of step {view.get('outputStepId')}"
        f"{'; only its beginning: cut at the capture cap' if cut.get('truncatedUnits') else ''}):"
    )
    lines.extend(f"  {line}" for line in text.splitlines() or [""])
    return clipped


def _mermaid_text(text: str) -> str:
    """Text safe inside a quoted mermaid label: entity codes for `#`, quotes, HTML and backticks;
    line breaks and other control characters become spaces (a label is one line)."""
    text = text.replace("#", "#35;")
    for ch, code in (('"', "#quot;"), ("<", "#lt;"), (">", "#gt;"), ("&", "#amp;"), ("`", "#96;")):
        text = text.replace(ch, code)
    return "".join(" " if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 else c for c in text)


def mermaid(graph: dict[str, Any]) -> str:
    """A flowchart of a run (`api.run_graph(...).to_json()`): steps coloured by status, routes as branches."""
    ids = {n["id"]: f"s{i}" for i, n in enumerate(graph["nodes"])}
    colors = {
        "completed": "#c8e6c9",
        "running": "#bbdefb",
        "failed": "#ffcdd2",
        "blocked": "#ffe0b2",
        "skipped": "#eeeeee",
        "pending": "#ffffff",
    }
    lines = ["flowchart TD"]
    for n in graph["nodes"]:
        label = f"{_mermaid_text(n['id'])}<br/>{n['kind']} · {_mermaid_text(n['status'])}"
        shape = f'{{"{label}"}}' if n["kind"] == "route" else f'["{label}"]'
        lines.append(f"  {ids[n['id']]}{shape}")
    for e in graph["edges"]:
        if e["label"] is not None:
            text = _mermaid_text(e["label"])
            arrow = f'-- "{text}" -->' if e["certain"] else f'-. "{text}" .->'
        else:
            arrow = "-->" if e["certain"] else "-.->"
        lines.append(f"  {ids[e['source']]} {arrow} {ids[e['target']]}")
    for st, color in colors.items():
        lines.append(f"  classDef {st} fill:{color},stroke:#555")
    for n in graph["nodes"]:
        lines.append(f"  class {ids[n['id']]} {n['status'] if n['status'] in colors else 'pending'}")
    return "\n".join(lines)


def _render_setup_text(res: dict[str, Any]) -> str:
    lines = [res["message"]]
    for a in res["engines"]:
        lines.append(f"  {a['action']} {a['kind']} engine {a['engine']}" + (f": {a['detail']}" if a["detail"] else ""))
    d = res.get("defaults") or {}
    if d:
        lines.append("defaults: " + ", ".join(f"{k} = {v}" for k, v in d.items()))
    clis = ((res.get("detected") or {}).get("agentClis")) or []
    if clis:
        lines.append("agent CLIs found:")
        lines.extend(f"  - {agent_cli_text(c)}" for c in clis)
    lines.append("you can now run:")
    lines.extend(f"  - {line}" for line in res["canRun"])
    return "\n".join(lines)


def agent_cli_text(c: dict[str, Any]) -> str:
    """One detected agent CLI: its version, and whether akm is tested with it (`akm setup`)."""
    version = c.get("version") or "version unknown"
    tested = c.get("testedVersion")
    if tested is None:
        how = "not tested by akm: driven by its documented output"
    elif c.get("version") == tested:
        how = "the version akm is tested with"
    else:
        how = f"akm is tested with {tested}"
    return f"{c['platform']} {version} ({how}) at {c['path']}"


def _render_brief_text(b: dict[str, Any]) -> str:
    lines = [
        f"run {b['runId']}  {b['status']}  step {b.get('stepId') or '-'}"
        + (f" (gate loop {b['gateLoop']} of {b['maxLoops']})" if (b.get("maxLoops") or 0) > 1 else "")
    ]
    lines.append(b.get("message") or "")
    for w in b.get("warnings") or []:
        lines.append(f"warning: {w}")
    if b.get("gateFeedback"):
        lines.append(f"feedback from the last loop: {b['gateFeedback'].get('feedback')}")
    for u in b.get("units") or []:
        lines += _brief_unit_lines(u)
    j = b.get("judge")
    if j:
        lines.append(f"\n== verdict {j['unitId']}")
        lines.append(j["prompt"])
        lines.append(
            f"-> akm workflow report {b['runId']} {j['unitId']} --expect-step {b['stepId']} "
            '--verdict \'{"complete": true, "missing": [], "feedback": ""}\''
        )
    if b.get("kind") == "engine":
        lines.append(f"-> akm workflow run {b['runId']}")
    return "\n".join(lines)


def _brief_unit_lines(u: dict[str, Any]) -> list[str]:
    """One unit of a brief: its heading (and claim), its fan-out item, its prompt and the report command."""
    claim = f", claimed by {u['claim']['holder']} until {u['claim']['expiresAt']}" if u.get("claim") else ""
    lines = [f"\n== unit {u['unitId']} ({u['action']}{claim})"]
    if u["context"].get("itemIndex") is not None:  # a fan-out unit (a solo unit has no item)
        lines.append(f"item {u['context']['itemIndex']}: {json.dumps(u['context']['item'], ensure_ascii=False)}")
    lines.append(u["prompt"])
    rep = u["report"]
    arg = "--result @result.json" if u.get("resultKind") == "json" else "--result @result.txt"
    lines.append(
        f"-> akm workflow report {rep['runId']} {rep['unitId']} --expect-step {rep['expectStep']} "
        f"--attempt {rep['attemptId']} --status completed {arg}" + (" --rerun" if rep.get("rerun") else "")
    )
    return lines


# Characters a terminal may act on rather than show: C0 controls (ESC starts escape sequences, CR
# overwrites a line, BS erases), DEL, C1 controls (0x9b is a one-byte CSI) and the bidi overrides that
# reorder what is displayed. Unit output, file contents and messages quoting them are printed with these
# made visible; newline and tab stay as they are.
_TERMINAL_UNSAFE = (
    [c for c in range(0x20) if c not in (0x09, 0x0A)]
    + list(range(0x7F, 0xA0))
    + [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)
_TEXT_ESCAPES: dict[int, str] | None = None
_JSON_ESCAPES: dict[int, str] | None = None


def _printable(text: str) -> str:
    """Text with every terminal-active character written as a visible escape (`\\x1b`, `\\u202e`)."""
    global _TEXT_ESCAPES
    if _TEXT_ESCAPES is None:
        _TEXT_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _TERMINAL_UNSAFE}
    return text.translate(_TEXT_ESCAPES)


def _json_text(data: Any) -> str:
    """JSON whose strings carry terminal-active characters as `\\u` escapes (the same JSON values)."""
    global _JSON_ESCAPES
    if _JSON_ESCAPES is None:
        _JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _TERMINAL_UNSAFE if c >= 0x7F}  # json.dumps escapes C0
    return json.dumps(data, indent=2, ensure_ascii=False).translate(_JSON_ESCAPES)


def dollars(amount: float) -> str:
    """An amount in US dollars as the api writes it (`akm.text.dollars`, through the api: a front imports it alone)."""
    from akm import api

    return api.dollars(amount)


def _emit_json(data: Any) -> None:
    sys.stdout.write(_json_text(data) + "\n")


def _out(text: str) -> None:
    text = _printable(text)
    sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))


def _err(text: str) -> None:
    text = _printable(text)
    sys.stderr.write(text + ("" if text.endswith("\n") else "\n"))
    sys.stderr.flush()


def _err_json(data: Any) -> None:
    sys.stderr.write(_json_text(data) + "\n")
    sys.stderr.flush()


def workflow_help(entry: dict[str, Any], target: str) -> str:
    """`workflow run TARGET --help`'s first part: what the workflow is and the params it takes (each a flag
    after TARGET), from its catalog entry."""
    from pathlib import Path

    head = entry.get("title") or Path(entry["path"]).stem
    lines = [f"usage: akm workflow run {target} [--<param> VALUE ...] [run flags]", ""]
    lines.append(f"{head}: {entry['description']}" if entry.get("description") else head)
    if entry.get("whenToUse"):
        lines.append(f"When to use: {entry['whenToUse']}")
    for problem in entry.get("problems") or []:
        lines.append(f"  problem: {problem}")
    params = entry.get("params") or []
    lines += ["", "Params of this workflow:" if params else "This workflow takes no params."]
    rows = [_param_row(p) for p in params]
    flag_w = max((len(r[0]) for r in rows), default=0)
    need_w = max((len(r[1]) for r in rows), default=0)
    for flag, need, text in rows:
        lines.append(f"  {flag:<{flag_w}}  {need:<{need_w}}  {text}".rstrip())
    if params:
        lines.append("  (arrays: repeat the flag or pass JSON; objects: JSON; booleans: a bare --name is true)")
    return "\n".join(lines) + "\n"


def _param_row(p: dict[str, Any]) -> tuple[str, str, str]:
    """(flag, required or its default, description) of one param in `workflow_help`."""
    flag = f"--{p['name']} {(p.get('type') or 'value').upper()}"
    need = "required" if p.get("required") else "default " + json.dumps(p.get("default"), ensure_ascii=False)
    return flag, need, p.get("description") or ""


def rewind_text(res: dict[str, Any]) -> str:
    """`workflow rewind`: what it reopened and kept, then the run as it is now."""
    r, rid = res["rewind"], res["run"]["runId"]
    lines = [
        f"rewound run {rid} to step {r['toStep']} (rewind {r['seq']}): reopened {', '.join(res['steps'])}",
        f"  {_plural(res['supersededUnits'], 'unit row')} kept as history, marked superseded; "
        f"{res['reusableUnits']} of them reused when akm meets them unchanged",
        run_text(res["run"]),
        f"continue with: akm workflow run {rid}",
    ]
    return "\n".join(lines)


def preview_text(p: dict[str, Any]) -> str:
    """`workflow run … --plan`: a table of the steps, the budget, and what would happen first."""
    if p.get("runId"):
        head = f"plan: continue run {p['runId']} ({p.get('status')}) of {p['workflow']}"
    else:
        head = f"plan: a new run of {p['workflow']}" + (f", reusing run {p['fromRun']}" if p.get("fromRun") else "")
    lines = [head + " — nothing was written"]
    if p.get("params"):
        lines.append(f"params: {_params_text(p['params'])[0]}")
    steps = p.get("steps") or []
    rows: list[tuple[str, ...]] = [
        ("step", "kind", "status", "units", "done", "reused", "to run", "agent", "by", "judge")
    ]
    rows += [_preview_row(s) for s in steps]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    for s in steps:
        if s.get("runsOn") and s["kind"] != "route":
            lines.append(f"  {s['id']} → {s['runsOn']}")
        if s.get("note"):
            lines.append(f"  {s['id']}: {s['note']}")
    lines.append(_preview_budget_line(p.get("budget") or {}))
    lines.append(
        f"reused {p.get('reused', 0)}, to run {p.get('toRun', 0)}, for the calling agent {p.get('forAgent', 0)}"
    )
    lines.append(f"first: {p.get('first')}")
    return "\n".join(lines)


def _preview_row(s: dict[str, Any]) -> tuple[str, ...]:
    """One step's row of the preview table."""
    who = s.get("engine") or s.get("runner") or "-"
    if s.get("model"):
        who += f" ({s['model']})"
    units = "?" if s.get("units") is None else str(s["units"])
    return (
        s["id"],
        s["kind"],
        s["status"],
        units,
        str(s.get("done") or 0),
        str(s.get("reused") or 0),
        str(s.get("toRun") or 0),
        str(s.get("forAgent") or 0),
        who,
        s.get("judge") or "-",
    )


def _preview_budget_line(b: dict[str, Any]) -> str:
    """The preview's budget: the ceilings set (or none), what the run used so far, the units known to run."""
    ceilings = []
    if b.get("maxUnits") is not None:
        ceilings.append(f"max_units {b['maxUnits']}")
    if b.get("maxTokens") is not None:
        ceilings.append(f"max_tokens {b['maxTokens']}")
    if b.get("maxCost") is not None:
        ceilings.append(f"max_cost {dollars(b['maxCost'])}")
    if b.get("dailyCostLimit") is not None:
        ceilings.append(
            f"limits.maxCostPerDay {dollars(b['dailyCostLimit'])} ({dollars(b.get('spentToday') or 0)} spent today)"
        )
    money = f", {dollars(b.get('usedCost') or 0)} spent" if b.get("usedCost") or b.get("maxCost") is not None else ""
    unknown = f" ({b['unknownUnits']} unit(s) of unknown usage)" if b.get("unknownUnits") else ""
    return (
        f"budget: {', '.join(ceilings) or 'none'}; used {b.get('usedUnits', 0)} unit(s), "
        f"{b.get('usedTokens', 0)} token(s){money}{unknown}; {b.get('toRun', 0)} unit(s) to run in the steps known now"
    )


def remedy_command(rec: dict[str, Any], rid: str) -> str:
    """A run's `recovery` (akm/engine/recovery.py) as the commands that carry it out."""
    import shlex

    action = rec.get("action")
    if action == "resume":
        if rec.get("then") == "judge":
            return (
                f"akm workflow resume {rid} && akm workflow next {rid}  (then report the verdict with "
                f"`akm workflow report {rid} STEP.gate:lN --verdict …`, or `akm workflow run {rid}` asks the judge "
                "engine again)"
            )
        return f"akm workflow resume {rid} && akm workflow run {rid}"
    if action == "rewind":
        redo = " --redo" if rec.get("redo") else ""
        return f"akm workflow rewind {rid} --to {shlex.quote(str(rec.get('stepId')))}{redo} && akm workflow run {rid}"
    flags = ""
    for name, value in (rec.get("params") or {}).items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        flags += f" --{name}={shlex.quote(text)}"
    return f"akm workflow run {shlex.quote(str(rec.get('workflow')))}{flags} --from {rec.get('fromRun') or rid}"


def _spend_line(spend: dict[str, Any]) -> str:
    """`spend: $0.0440 of $1.00; 2 unit(s) of max_units 10; 34 token(s)` — what the run used of its budget."""
    parts = [spend.get("text") or ""]
    units = f"{spend.get('units', 0)} unit(s)"
    if spend.get("maxUnits") is not None:
        units += f" of max_units {spend['maxUnits']}"
    tokens = f"{spend.get('tokens', 0)} token(s)"
    if spend.get("maxTokens") is not None:
        tokens += f" of max_tokens {spend['maxTokens']}"
    if not str(parts[0]).endswith("tokens") and "tokens" not in str(parts[0]):
        parts.append(tokens)
    parts.append(units)
    return "spend: " + "; ".join(p for p in parts if p)


def render_lint(report: "LintReport") -> str:
    """Human output: one `path:line[:col]: severity[code]: message` line per finding, hints indented."""
    out: list[str] = []
    n_err = n_warn = bad_files = 0
    for f in report.files:
        if f.errors:
            bad_files += 1
        hinted: set[tuple[str, str]] = set()  # a repeated warning's hint is printed once per file
        for severity, items in (("error", f.errors), ("warning", f.warnings)):
            for d in items:
                where = f"{f.path}:{d.line}" + (f":{d.column}" if d.column is not None else "")
                out.append(f"{where}: {severity}[{d.code}]: {d.message}")
                if d.hint and (severity == "error" or (d.code, d.hint) not in hinted):
                    hinted.add((d.code, d.hint))
                    out.append(f"    hint: {d.hint}")
        n_err += len(f.errors)
        n_warn += sum(d.count or 1 for d in f.warnings)
    total = len(report.files)
    files_word = "file" if total == 1 else "files"
    if not report.files:
        out.append("no workflow files found")
    elif n_err:
        out.append(
            f"{n_err} error(s), {n_warn} warning(s) in {total} {files_word} checked; "
            f"{bad_files} {'file has' if bad_files == 1 else 'files have'} errors"
        )
    else:
        out.append(f"{total} {files_word} checked: no errors, {n_warn} warning(s)")
    return "\n".join(out) + "\n"
