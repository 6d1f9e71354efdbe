"""Span records as OpenTelemetry SDK spans, and as OTLP/JSON: the SDK, its OTLP encoder and protobuf are
imported here only, when a trace is exported (a run without tracing loads none of it)."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any, Sequence

from akm import __version__
from akm.telemetry.journal_spans import SpanRecord

SCOPE = "akm"


def _nanos(ts: str) -> int:
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1_000_000_000)


def resource(service_name: str, attributes: dict[str, str] | None = None) -> Any:
    """The SDK resource: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (read by the SDK) win over config."""
    from opentelemetry.sdk.resources import Resource

    base = dict(attributes or {})
    base.setdefault("service.name", service_name)
    return Resource.create(base)


def sdk_spans(trace_id: str, records: Sequence[SpanRecord], res: Any) -> list[Any]:
    """ReadableSpans with the journal's ids and times (the SDK's tracer would make new ones)."""
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    tid = int(trace_id, 16)
    flags = TraceFlags(TraceFlags.SAMPLED)
    scope = InstrumentationScope(SCOPE, __version__)

    def ctx(span_id: str, remote: bool = False) -> Any:
        return SpanContext(tid, int(span_id, 16), is_remote=remote, trace_flags=flags)

    out = []
    for r in records:
        status = Status(StatusCode.ERROR, r.error) if r.error else Status(StatusCode.OK if r.end else StatusCode.UNSET)
        out.append(
            ReadableSpan(
                name=r.name,
                context=ctx(r.span_id),
                parent=ctx(r.parent_span_id, remote=False) if r.parent_span_id else None,
                resource=res,
                attributes=BoundedAttributes(attributes=r.attributes, immutable=True),
                events=[Event(n, BoundedAttributes(attributes=a), _nanos(t)) for n, t, a in r.events],
                links=[Link(ctx(s)) for s in r.links],
                kind=SpanKind.CLIENT if r.client else SpanKind.INTERNAL,
                status=status,
                start_time=_nanos(r.start),
                end_time=_nanos(r.end),
                instrumentation_scope=scope,
            )
        )
    return out


def otlp_json(trace_id: str, records: Sequence[SpanRecord], res: Any) -> dict[str, Any]:
    """An OTLP/JSON `ExportTraceServiceRequest` (ids in hex, as OTLP/JSON wants, not protobuf's base64)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    doc = MessageToDict(encode_spans(sdk_spans(trace_id, records, res)), use_integers_for_enums=True)
    _hex_ids(doc)
    return doc


def _hex_ids(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)
