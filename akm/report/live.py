"""Live progress of a run in a terminal: a line per step, redrawn in place.

`Board` holds what a person wants to see while a run goes — per step, units
done of units dispatched, failures, elapsed time, status — fed either by the
api's progress callbacks (`workflow run` in this process) or by journal
events (`workflow status RUN --watch`, a run driven elsewhere). Two outputs:
`LiveProgress` redraws the board on a terminal (ANSI cursor-up and erase
below, a ticker thread so the clock moves between events; the cursor is never
hidden, so a process killed mid-draw leaves the terminal as it was),
`LineProgress` prints one plain line per
event (for a pipe or a log, the `--verbose` form). Callbacks come from the
engine's worker threads, so every method takes the board's lock.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, TextIO

from akm.report.timeline_svg import duration_text, seconds

# Characters a terminal acts on (escapes, C1 controls, bidi overrides) are shown as visible escapes.
_UNSAFE = (
    [c for c in range(0x20)]
    + list(range(0x7F, 0xA0))
    + [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)
_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _UNSAFE}


def safe(text: object) -> str:
    """One line a terminal shows as-is: every control or bidi character written as a visible escape."""
    return str(text).translate(_ESCAPES)


def activity_text(a: Any) -> str:
    """What a running agent unit is doing, in a few words: `turn 3 · 2 tool calls (last Bash) · 1 retry (HTTP
    429)`. `a` is the api's `UnitActivity` or a `workflow_unit_activity` event's metadata (camelCase)."""

    def get(name: str, camel: str) -> Any:
        return a.get(camel) if isinstance(a, dict) else getattr(a, name, None)

    turns, calls, tool = get("turns", "turns") or 0, get("tool_calls", "toolCalls") or 0, get("tool", "tool")
    retries, status = get("retries", "retries") or 0, get("retry_status", "retryStatus")
    parts = [f"turn {turns}"] if turns else []
    if calls:
        parts.append(f"{calls} tool call{'' if calls == 1 else 's'}" + (f" (last {tool})" if tool else ""))
    if retries:
        parts.append(f"{retries} retr{'y' if retries == 1 else 'ies'}" + (f" (HTTP {status})" if status else ""))
    return " · ".join(parts) or "started"


def _unit_of(attempt_id: str) -> tuple[str, int]:
    """(the unit, its gate loop) an attempt id names: `u~l2~r1` -> (`u`, 2)."""
    head = attempt_id.split("~r", 1)[0] if "~r" in attempt_id else attempt_id
    unit, sep, loop = head.rpartition("~l")
    return (unit, int(loop)) if sep and loop.isdigit() else (head, 1)


class _Step:
    """A step's progress counted in units, not attempts: a unit retried three times is one unit, failed
    only if its latest attempt failed; the total is the units the step dispatches, whatever retries cost."""

    __slots__ = ("step_id", "planned", "units", "loop", "started", "finished", "status", "note", "activity")

    def __init__(self, step_id: str, started: float) -> None:
        self.step_id, self.started = step_id, started
        self.planned = 0  # the units the driver said it dispatches (0: unknown, as when following events)
        self.units: dict[str, bool | None] = {}  # unit -> its latest attempt ok / failed (None: running)
        self.loop = 1
        self.finished: float | None = None
        self.status = "running"
        self.note: str | None = None  # why the step runs fewer units at once than it declares
        self.activity: dict[str, str] = {}  # attempt id -> what its agent CLI is doing (running units only)

    @property
    def done(self) -> int:
        return sum(1 for ok in self.units.values() if ok is not None)

    @property
    def failed(self) -> int:
        return sum(1 for ok in self.units.values() if ok is False)

    @property
    def total(self) -> int:
        return max(self.planned, len(self.units))

    def new_loop(self, loop: int) -> None:
        """A gate loop re-does the step's units: count them afresh."""
        if loop > self.loop:
            self.loop, self.units = loop, {}


class Board:
    """Per-step progress of one run (thread-safe)."""

    def __init__(self, started: float | None = None, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started = clock() if started is None else started
        self.steps: dict[str, _Step] = {}
        self.run_id: str | None = None
        self.note: str | None = None  # a line under the header (who drives the run, why it waits)
        self.lock = threading.RLock()
        self._last_end = self.started

    def _step(self, step_id: str, at: float) -> _Step:
        step = self.steps.get(step_id)
        if step is None:
            # Steps run one after another: a step's clock starts when the one before it finished.
            step = self.steps[step_id] = _Step(step_id, min(at, self._last_end) if self.steps else self.started)
        return step

    # ----------------------------------------------------------- feeds

    def progress(self, p: Any) -> None:
        """An api progress event (`StepStarted`, `UnitFinished` or `StepFinished`) of a run in this process."""
        with self.lock:
            at = self.clock()
            self.run_id = self.run_id or p.run_id
            step = self._step(p.step_id, at)
            if p.kind == "step_started":  # the step shows at once, with its units to do
                if step.units and all(ok is not None for ok in step.units.values()):
                    step.units = {}  # a pass over units all finished before: the next gate loop's re-dos
                step.planned = p.total
                step.note = getattr(p, "note", None)
                if step.finished is None:
                    step.status = "running"
            elif p.kind == "step":
                self._finish(step, p.status, at)
            elif p.kind == "unit_activity":
                if step.finished is None:
                    step.activity[p.attempt_id] = activity_text(p)
            else:
                step.units[p.unit_id] = bool(p.ok)
                step.activity.pop(p.attempt_id, None)

    def event(self, ev: dict[str, Any]) -> str | None:
        """A journal event (`EventView.to_json()`); returns its one-line form for line output, if any."""
        kind, meta = ev.get("eventType"), ev.get("metadata") or {}
        at = seconds(ev.get("ts")) or self.clock()
        step_id = meta.get("stepId")
        with self.lock:
            if not isinstance(step_id, str):
                return f"run {ev.get('runId')}: {kind}" if kind in ("workflow_finished", "workflow_abandoned") else None
            step = self._step(step_id, at)
            if kind in ("workflow_step_completed", "workflow_step_updated"):
                status = str(meta.get("status") or "")
                if status in ("completed", "failed", "skipped", "blocked"):
                    self._finish(step, status, at)
                    return f"[{step_id}] step {status}"
                step.status, step.finished = status or "pending", None
                return None
            return _unit_event(step, kind, meta)

    def _finish(self, step: _Step, status: str, at: float) -> None:
        step.status, step.finished = status, at
        step.activity.clear()
        self._last_end = max(self._last_end, at)

    # ----------------------------------------------------------- view

    def lines(self, width: int = 80, height: int = 24) -> list[str]:
        """The board as terminal lines: a header, then a line per step (the latest ones if too many)."""
        with self.lock:
            now = self.clock()
            steps = list(self.steps.values())
            finished = sum(1 for s in steps if s.finished is not None)
            units = sum(s.done for s in steps)
            failed = sum(s.failed for s in steps)
            # The short id is a run id too (a unique prefix): `akm workflow status <it>` works.
            head = (
                f"akm run {(self.run_id or '')[:8]}".rstrip() + f"  {duration_text(now - self.started)}"
                f"  {finished} step(s) finished, {units} unit(s) done" + (f", {failed} failed" if failed else "")
            )
            out = [_fit(head, width)] + ([_fit(f"  {self.note}", width)] if self.note else [])
            room = max(1, height - len(out) - 1)
            notes = {s.step_id: _wrap(f"note: {s.note}", width, "      ") if s.note else [] for s in steps}
            if sum(1 + len(notes[s.step_id]) for s in steps) > room:
                kept = _latest_that_fit(steps, notes, room)
                out.append(f"  … {len(steps) - len(kept)} earlier step(s)")
                steps = kept
            wid = min(28, max((len(s.step_id) for s in steps), default=4))
            for s in steps:
                out.append(_fit(_step_line(s, now, wid), width))
                out.extend(notes[s.step_id])  # kept once the step finished: why it took that long
            return out


def _latest_that_fit(steps: list[_Step], notes: dict[str, list[str]], room: int) -> list[_Step]:
    """The latest steps whose lines (and notes) fit in `room` lines beside the "earlier steps" line (one at least)."""
    kept: list[_Step] = []
    used = 1  # the "earlier steps" line
    for s in reversed(steps):
        used += 1 + len(notes[s.step_id])
        if used > room and kept:
            break
        kept.insert(0, s)
    return kept


def _step_line(s: _Step, now: float, wid: int) -> str:
    """A step's line: status, name (cut to `wid`), units done, failures, time taken, what its agents do."""
    elapsed = (s.finished if s.finished is not None else now) - s.started
    work = f"{s.done}/{s.total} units" if s.total else ""
    fails = f"{s.failed} failed" if s.failed else ""
    name = s.step_id if len(s.step_id) <= wid else s.step_id[: wid - 1] + "…"
    doing = f"  {next(iter(s.activity.values()))}" if len(s.activity) == 1 else ""
    if len(s.activity) > 1:
        doing = f"  {len(s.activity)} agents at work"
    return f"  {s.status:<10} {name:<{wid}}  {work:<14} {fails:<10} {duration_text(elapsed):>8}{doing}"


def _unit_event(step: _Step, kind: Any, meta: dict[str, Any]) -> str | None:
    """A unit's start, activity or finish on its step's line; the one-line form of the latter two."""
    attempt = str(meta.get("unitId") or "")
    unit, loop = _unit_of(attempt)
    if kind == "workflow_unit_started":
        step.new_loop(loop)
        step.units[unit] = None
        if step.finished is None:
            step.status = "running"
        return None
    if kind == "workflow_unit_activity":
        text = activity_text(meta)
        if step.finished is None:
            step.activity[str(meta.get("unitId"))] = text
        return f"[{step.step_id}] {meta.get('unitId')}: {text}"
    if kind == "workflow_unit_finished":
        step.new_loop(loop)
        step.activity.pop(attempt, None)
        ok = meta.get("status") == "completed"
        step.units[unit] = ok
        mark = "ok" if ok else f"FAILED ({meta.get('failureReason')})"
        return f"[{step.step_id} {step.done}/{step.total}] {attempt} {mark}"
    return None


def _fit(text: str, width: int) -> str:
    """One terminal line of at most `width - 1` columns (the last column would wrap on some terminals),
    shortened at a word boundary with an ellipsis — never cut mid-word."""
    line = safe(text).rstrip()
    room = max(10, width - 1)
    if len(line) <= room:
        return line
    cut = line[: room - 1]
    space = cut.rfind(" ")
    if space > room // 2:
        cut = cut[:space]
    return cut.rstrip(" ,") + "…"


def _wrap(text: str, width: int, indent: str) -> list[str]:
    """A note over as many lines as it needs, each within `width - 1` columns, broken between words."""
    import textwrap

    return textwrap.wrap(safe(text), max(20, width - 1), initial_indent=indent, subsequent_indent=indent + "  ")


class LineProgress:
    """Plain lines on a stream, one per event: what `--verbose` prints, and `--watch` on a pipe."""

    def __init__(self, stream: TextIO, board: Board | None = None) -> None:
        self.stream, self.board = stream, board or Board()

    def progress(self, p: Any) -> None:
        self.board.progress(p)
        if p.kind == "step_started":
            if getattr(p, "note", None):
                self.line(f"note: {p.note}")
            return
        if p.kind == "unit_activity":
            self.line(f"[{p.step_id}] {p.attempt_id}: {activity_text(p)} ({duration_text(p.elapsed_s)})")
        elif p.kind == "step":
            self.line(f"[{p.step_id}] step {p.status}")
        else:
            mark = "ok" if p.ok else f"FAILED ({p.failure_reason})"
            self.line(f"[{p.step_id} {p.done}/{p.total}] {p.attempt_id} {mark}")

    def event(self, ev: dict[str, Any]) -> None:
        text = self.board.event(ev)
        if text is not None:
            self.line(text)

    def line(self, text: str) -> None:
        with self.board.lock:
            self.stream.write("".join(safe(line) + "\n" for line in text.splitlines()))
            self.stream.flush()

    def message(self, text: str) -> None:
        self.line(text)

    def refresh(self) -> None:
        pass

    def stop(self) -> None:
        pass


class LiveProgress:
    """The board redrawn in place on a terminal, every `interval` seconds and on every event."""

    def __init__(self, stream: TextIO, board: Board | None = None, *, interval: float = 0.25) -> None:
        self.stream, self.board, self.interval = stream, board or Board(), interval
        self._drawn = 0
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._ticker = threading.Thread(target=self._tick, name="akm-progress", daemon=True)
        self._ticker.start()

    def _size(self) -> tuple[int, int]:
        try:
            size = os.get_terminal_size(self.stream.fileno())
            return size.columns, size.lines
        except (OSError, ValueError, AttributeError):
            return 80, 24

    def _tick(self) -> None:
        while not self._stopped.wait(self.interval):
            self.refresh()

    def _clear(self) -> str:
        return "\r" + (f"\x1b[{self._drawn}A" if self._drawn else "") + "\x1b[J"

    def refresh(self) -> None:
        with self._lock:
            if not self._drawn and not self.board.steps and self.board.clock() - self.board.started < 1.0:
                return  # nothing to show yet: a command that fails at once prints no empty board
            width, height = self._size()
            lines = self.board.lines(width, height)
            self.stream.write(self._clear() + "\n".join(lines) + "\n")
            self.stream.flush()
            self._drawn = len(lines)

    def progress(self, p: Any) -> None:
        self.board.progress(p)

    def event(self, ev: dict[str, Any]) -> None:
        self.board.event(ev)

    def message(self, text: str) -> None:
        """A line (a warning) printed above the board, which is drawn again below it."""
        with self._lock:
            self.stream.write(self._clear() + "".join(safe(line) + "\n" for line in text.splitlines()))
            self._drawn = 0
        self.refresh()

    def stop(self) -> None:
        """Draw the final board and leave it on screen."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._ticker.join(timeout=2)
        self.refresh()
