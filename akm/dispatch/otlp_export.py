"""Send a run's spans to an OTLP/HTTP collector (protobuf), without ever slowing or failing the run.

The spans go in batches from one background thread; the caller waits for it at most `WAIT_S` (the run is
over by then: this is the tail of its process), and a collector that is down or slow costs one warning and
the spans are dropped. The OpenTelemetry SDK's own log lines are silenced: the warning says it once.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Sequence

from akm.telemetry.journal_spans import SpanRecord
from akm.telemetry.settings import TraceSettings

BATCH = 256  # spans per request
WAIT_S = 15.0  # the longest a finished run's process waits for its spans to leave (a hard cap: the request
# timeout below bounds the exporter's retries, so only a machine under heavy load comes near it)
REQUEST_TIMEOUT_S = 3.0  # per request, unless OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT says otherwise


def _transport() -> Any:
    """The exporter's HTTP transport on httpx (which akm has anyway), so `requests` and `urllib3` — the
    exporter's default transport — are not bundled (bundle/build.py prunes them)."""
    from dataclasses import dataclass, field

    import httpx
    from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport

    @dataclass(frozen=True, slots=True)
    class Result(BaseHTTPResult):
        body: bytes = b""
        response_headers: dict[str, str] = field(default_factory=dict)

        def content(self) -> bytes:
            return self.body

        def headers(self) -> dict[str, str]:
            return self.response_headers

    class HttpxTransport(BaseHTTPTransport):
        def __init__(self) -> None:
            ca = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE") or os.environ.get(
                "OTEL_EXPORTER_OTLP_CERTIFICATE"
            )
            self._client = httpx.Client(verify=ca or True)

        def request(
            self,
            method: str,
            url: str,
            *,
            headers: dict[str, str] | None = None,
            timeout: float | None = None,
            data: bytes | None = None,
        ) -> BaseHTTPResult:
            try:
                r = self._client.request(method, url, headers=headers, content=data, timeout=timeout)
            except httpx.HTTPError as exc:
                return Result(error=exc)
            return Result(r.status_code, r.reason_phrase, None, r.content, {k.lower(): v for k, v in r.headers.items()})

        def close(self) -> None:
            self._client.close()

        def is_connection_error(self, exception: Exception | None) -> bool:
            return isinstance(exception, (httpx.ConnectError, httpx.TimeoutException, httpx.NetworkError))

    return HttpxTransport()


def _exporter(settings: TraceSettings) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # failures are said once, by `export`
    timeout = None
    if not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")):
        timeout = REQUEST_TIMEOUT_S
    endpoint = None
    if settings.endpoint is not None:
        endpoint = settings.endpoint.rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint, timeout=timeout, _transport=_transport())


def export(
    settings: TraceSettings,
    trace_id: str,
    records: Sequence[SpanRecord],
    warn: Callable[[str], None],
    *,
    wait_s: float = WAIT_S,
) -> threading.Thread | None:
    """Export `records` of one trace in the background; returns the thread (already waited on for up to
    `wait_s`). Never raises: whatever goes wrong is one warning, and the spans are dropped."""
    if not records:
        return None
    if settings.problem:
        warn(settings.problem)
        return None

    def send() -> None:
        try:
            from opentelemetry.sdk.trace.export import SpanExportResult

            from akm.telemetry.otlp import resource, sdk_spans

            spans = sdk_spans(trace_id, records, resource(settings.service_name, settings.resource_attributes))
            exporter = _exporter(settings)
            try:
                for start in range(0, len(spans), BATCH):
                    if exporter.export(spans[start : start + BATCH]) is not SpanExportResult.SUCCESS:
                        where = settings.endpoint or "the OTEL_EXPORTER_OTLP endpoint"
                        warn(
                            f"the trace of this run was not exported: the collector at {where} did not take it "
                            f"({len(spans) - start} span(s) dropped); `akm trace export RUN` writes it from the journal"
                        )
                        return
            finally:
                exporter.shutdown()
        except Exception as exc:  # noqa: BLE001 - tracing never fails a run
            warn(f"the trace of this run was not exported ({type(exc).__name__}: {exc}); spans dropped")

    thread = threading.Thread(target=send, name="akm-otlp-export", daemon=True)
    thread.start()
    thread.join(wait_s)
    return thread
