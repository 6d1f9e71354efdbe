"""What a unit's process gets of the run's trace: TRACEPARENT for its attempt's span, and the OTEL_* settings so
a CLI that traces sends its spans to the same collector (an agent CLI gets the headers too; a command does
not — it was given no credentials of akm's)."""

from __future__ import annotations

from typing import Any

from akm.telemetry.settings import passed_env


def unit_trace_env(trace: Any, attempt_id: str, started_at: str | None, runner: str | None) -> dict[str, str] | None:
    """The environment a unit attempt adds for tracing (None: tracing is off, or the unit is no process)."""
    if trace is None or started_at is None or runner not in ("exec", "agent"):
        return None
    env = passed_env()
    if runner == "exec":
        env = {k: v for k, v in env.items() if not k.endswith("_HEADERS")}
    env["TRACEPARENT"] = trace.unit_traceparent(attempt_id, started_at)
    return env
