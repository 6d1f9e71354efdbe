"""A real OTLP/HTTP trace receiver on 127.0.0.1 (protobuf bodies decoded with opentelemetry-proto)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OtlpReceiver:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.bodies.append(body)
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                ok = self.path == "/v1/traces"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[dict[str, Any]]:
        """Every span received: name, ids in hex, parent, kind, status, attributes as a plain dict, the resource."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        out = []
        with self._lock:
            bodies = list(self.bodies)
        for body in bodies:
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            for rs in req.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append(
                            {
                                "name": s.name,
                                "traceId": s.trace_id.hex(),
                                "spanId": s.span_id.hex(),
                                "parentSpanId": s.parent_span_id.hex(),
                                "kind": s.kind,
                                "status": s.status.code,
                                "statusMessage": s.status.message,
                                "attributes": {a.key: _value(a.value) for a in s.attributes},
                                "events": [e.name for e in s.events],
                                "links": [link.span_id.hex() for link in s.links],
                                "resource": resource,
                                "scope": ss.scope.name,
                            }
                        )
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
