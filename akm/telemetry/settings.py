"""Is tracing on, and where do spans go: the standard OTEL_* variables, else config `telemetry`.

Cheap on purpose: a run asks this once, and with tracing off nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from akm.record import dataclass, field

DEFAULT_ENDPOINT = "http://localhost:4318"
SUPPORTED_PROTOCOL = "http/protobuf"
# Passed to agent CLIs (and exec units) with TRACEPARENT so a CLI that traces sends its spans to the same
# collector; OTEL_SERVICE_NAME stays the CLI's own.
PASSED_TO_UNITS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_RESOURCE_ATTRIBUTES",
)


@dataclass(frozen=True)
class TraceSettings:
    """Where a run's spans go. `endpoint` None: the OTEL_* variables name it (the exporter reads them)."""

    endpoint: str | None
    service_name: str = "akm"
    resource_attributes: dict[str, str] = field(default_factory=dict)
    problem: str | None = None  # set: tracing was asked for but cannot be done (said once, nothing exported)


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def trace_settings(config_telemetry: Any = None, env: Mapping[str, str] | None = None) -> TraceSettings | None:
    """The tracing settings, or None when nothing asks for traces (the default: nothing is exported)."""
    env = os.environ if env is None else env
    if _truthy(env.get("OTEL_SDK_DISABLED")) or (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower() == "none":
        return None
    from_env = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    t = config_telemetry
    enabled = getattr(t, "enabled", None) if t is not None else None
    configured = t is not None and enabled is not False and (enabled or getattr(t, "endpoint", None))
    if not from_env and not configured:
        return None
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or (getattr(t, "protocol", None) if t is not None else None)
        or SUPPORTED_PROTOCOL
    )
    attrs = dict(getattr(t, "resource_attributes", None) or {}) if t is not None else {}
    service = env.get("OTEL_SERVICE_NAME") or (getattr(t, "service_name", None) if t is not None else None) or "akm"
    problem = None
    if protocol.strip().lower() != SUPPORTED_PROTOCOL:
        problem = (
            f"OTLP protocol {protocol!r} is not supported by akm (only {SUPPORTED_PROTOCOL}); no trace is exported"
        )
    endpoint = None if from_env else (getattr(t, "endpoint", None) or DEFAULT_ENDPOINT)
    return TraceSettings(endpoint=endpoint, service_name=service, resource_attributes=attrs, problem=problem)


def passed_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The OTEL_* settings a unit's CLI gets with its TRACEPARENT (its own spans join the run's trace)."""
    env = os.environ if env is None else env
    return {k: env[k] for k in PASSED_TO_UNITS if env.get(k)}
