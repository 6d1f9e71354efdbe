"""W3C trace context of a run: its trace id and the ids of its spans, derived from the journal's ids.

A span's id is a hash of what identifies it in the journal (the run, the step, the unit attempt and when it
started), so every process that looks at the same journal computes the same ids with nothing stored: the
coordinator exporting, a worker handing TRACEPARENT to the unit it runs, `akm trace export` a week later. A run
started under a caller's trace (W3C `traceparent` in an MCP request's `_meta`) takes that trace id and has that
span as its parent; the journal keeps it in the run's `workflow_started` event.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping

from akm.record import dataclass

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")


def _digest(n: int, *parts: str) -> str:
    text = hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:n]
    return text if int(text, 16) else "0" * (n - 1) + "1"  # an all-zero id is invalid in W3C trace context


def parse_traceparent(value: Any) -> tuple[str, str, bool] | None:
    """(trace id, parent span id, sampled) of a W3C `traceparent` (version 00), or None when it is not one."""
    if not isinstance(value, str):
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or not int(m.group(1), 16) or not int(m.group(2), 16):
        return None
    return m.group(1), m.group(2), bool(int(m.group(3), 16) & 1)


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


@dataclass(frozen=True)
class RunTrace:
    """A run's trace: its id, and the caller's span its root spans are children of (None: a root)."""

    run_id: str
    trace_id: str
    parent_span_id: str | None = None

    def root_span_id(self, segment: int) -> str:
        """The run's span of one stretch of driving (0: to its first end; a resumed run adds one)."""
        return _digest(16, "akm-run", self.run_id, str(segment))

    def step_span_id(self, step_id: str, segment: int) -> str:
        return _digest(16, "akm-step", self.run_id, step_id, str(segment))

    def unit_span_id(self, unit_id: str, started_at: str) -> str:
        """The span of one attempt of a unit (its journal row's id and the time it started)."""
        return _digest(16, "akm-unit", self.run_id, unit_id, started_at)

    def unit_traceparent(self, unit_id: str, started_at: str) -> str:
        """TRACEPARENT for the process of a unit attempt: its spans become children of the attempt's span."""
        return traceparent(self.trace_id, self.unit_span_id(unit_id, started_at))


def run_trace(run_id: str, started_meta: Mapping[str, Any] | None = None) -> RunTrace:
    """The trace of a run, from its `workflow_started` event's metadata (a caller's `traceparent`, if any)."""
    parent = parse_traceparent((started_meta or {}).get("traceparent"))
    if parent is not None:
        return RunTrace(run_id, parent[0], parent[1])
    return RunTrace(run_id, _digest(32, "akm-trace", run_id))
