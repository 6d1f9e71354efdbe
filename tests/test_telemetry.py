"""Traces of runs (issue 38): a real OTLP/HTTP receiver on loopback, decoded with opentelemetry-proto.

A run of an exec fan-out (each unit prints its TRACEPARENT, with a secret in its environment) and an LLM unit
(tests/fake_openai.py, `plain`: 12 prompt + 5 completion tokens) yields one trace: the run's root span, a span
per step and per unit attempt, GenAI usage on the LLM span, and no secret in any payload.
"""

from __future__ import annotations

import json
import sys
import threading

import pytest

from akm import api, cli
from tests.helpers import write_wf
from tests.otlp_receiver import OtlpReceiver

SECRET = "tok-ci-5f3a9b2c7d"
HEADER_SECRET = "hdr-sekrit-8c1e42"


@pytest.fixture
def receiver(monkeypatch):
    r = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"x-api-key={HEADER_SECRET}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "akm-test")
    try:
        yield r
    finally:
        r.close()


PRINT = (
    "import os; e = os.environ.get; "
    "print(e('TRACEPARENT', '') + ' ' + e('DEPLOY_TOKEN', '') + ' ' + e('OTEL_EXPORTER_OTLP_HEADERS', 'no-headers'))"
)


def _workflow(project, capsys, fake_openai):
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "ci.env").write_text(f"DEPLOY_TOKEN={SECRET}\n", encoding="utf-8")
    engine = {"kind": "llm", "endpoint": fake_openai.url, "model": "plain", "prices": {"input": 1000, "output": 2000}}
    assert cli.main(["config", "set", "engines.fast", json.dumps(engine)]) == 0
    capsys.readouterr()
    return write_wf(
        project,
        "traced.md",
        f"""
        params: {{ items: {{ type: array, default: [1, 2, 3] }} }}
        steps:
          - id: fan
            map:
              over: params.items
              concurrency: 2
              unit:
                env: [env/ci]
                exec: {{ command: {json.dumps([sys.executable, "-c", PRINT])} }}
          - id: ask
            unit: {{ engine: fast }}
        """,
        "## fan\n\nPrint.\n\n## ask\n\nSay something.",
    )


def _check_trace(receiver, res, *, workers: bool = False):
    spans = receiver.spans()
    assert spans, "the receiver got no span"
    trace_ids = {s["traceId"] for s in spans}
    assert len(trace_ids) == 1, trace_ids
    (trace_id,) = trace_ids
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s["name"].split(" ")[0], []).append(s)
    (root,) = by_name["invoke_workflow"]
    assert root["parentSpanId"] == "" and root["attributes"]["gen_ai.operation.name"] == "invoke_workflow"
    assert root["attributes"]["akm.run.id"] == res.run.run_id and root["resource"]["service.name"] == "akm-test"
    steps = {s["attributes"]["akm.step.id"]: s for s in by_name["step"]}
    assert set(steps) == {"fan", "ask"} and all(s["parentSpanId"] == root["spanId"] for s in steps.values())
    execs = by_name["exec"]
    assert len(execs) == 3  # one span per unit attempt
    assert all(s["parentSpanId"] == steps["fan"]["spanId"] for s in execs)
    assert all(s["attributes"]["process.exit.code"] == 0 and s["attributes"]["process.executable.name"] for s in execs)
    (chat,) = by_name["chat"]
    attrs = chat["attributes"]
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "plain"
    assert attrs["gen_ai.usage.input_tokens"] == 12 and attrs["gen_ai.usage.output_tokens"] == 5
    assert attrs["akm.engine"] == "fast" and attrs["akm.cost.usd"] == pytest.approx(0.022)
    if workers:
        assert all("akm.worker" in s["attributes"] for s in execs)
    # each exec unit printed its TRACEPARENT: the run's trace, its own attempt's span as parent
    status = api.run_status(res.run.run_id, units=True).to_json()
    printed = {}
    for u in status["units"]:
        if u["stepId"] == "fan":
            text = u["result"] if isinstance(u["result"], str) else json.dumps(u["result"])
            printed[u["unitId"]] = text
    exec_ids = {s["spanId"] for s in execs}
    for text in printed.values():
        tp = text.split()[0]
        version, tid, span_id, flags = tp.split("-")
        assert (version, tid, flags) == ("00", trace_id, "01") and span_id in exec_ids, text
        assert "no-headers" in text  # a command gets no OTLP credentials
    # no secret in any payload (the unit's environment, nor the collector's header)
    raw = b"".join(receiver.bodies)
    assert SECRET.encode() not in raw and HEADER_SECRET.encode() not in raw
    assert all(h.get("x-api-key") == HEADER_SECRET for h in receiver.headers)  # the header went as a header


def test_a_run_exports_one_trace_with_a_span_per_unit_attempt(project, fake_openai, receiver, capsys):
    wf = _workflow(project, capsys, fake_openai)
    res = api.run_workflow(str(wf), cwd=str(project))
    assert res.run.status == "completed", res.run
    _check_trace(receiver, res)


def test_the_same_trace_over_workers(project, fake_openai, receiver, capsys):
    wf = _workflow(project, capsys, fake_openai)
    box: dict = {}
    coord = threading.Thread(
        target=lambda: box.update(res=api.run_workflow(str(wf), cwd=str(project), workers=True)), daemon=True
    )
    coord.start()
    api.run_worker(project=str(project), concurrency=2, poll="50ms", idle_exit="2s")
    coord.join(120)
    assert not coord.is_alive()
    res = box["res"]
    assert res.run.status == "completed", res.run
    _check_trace(receiver, res, workers=True)


def test_nothing_is_exported_without_configuration(project, fake_openai, capsys, monkeypatch):
    r = OtlpReceiver()
    try:
        wf = _workflow(project, capsys, fake_openai)
        res = api.run_workflow(str(wf), cwd=str(project))
        assert res.run.status == "completed"
        assert r.bodies == []
        printed = [u.result for u in api.run_status(res.run.run_id, units=True).units or [] if u.step_id == "fan"]
        assert all(not str(p).startswith("00-") for p in printed)  # no TRACEPARENT either
    finally:
        r.close()


def test_a_collector_that_is_down_costs_one_warning_and_the_run_completes(project, fake_openai, capsys, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    wf = _workflow(project, capsys, fake_openai)
    warnings: list[str] = []
    res = api.run_workflow(str(wf), cwd=str(project), on_warning=lambda w: warnings.append(w.message))
    assert res.run.status == "completed"
    dropped = [w for w in warnings if "was not exported" in w]
    assert len(dropped) == 1 and "dropped" in dropped[0], "\n".join(warnings)


def test_trace_export_writes_the_trace_from_the_journal(project, fake_openai, capsys, monkeypatch):
    wf = _workflow(project, capsys, fake_openai)
    res = api.run_workflow(str(wf), cwd=str(project))
    doc = api.trace_export(res.run.run_id)
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len({s["traceId"] for s in spans}) == 1 and len(spans[0]["traceId"]) == 32
    names = sorted(s["name"].split(" ")[0] for s in spans)
    assert names.count("exec") == 3 and names.count("chat") == 1 and names.count("invoke_workflow") == 1
    code = cli.main(["trace", "export", res.run.run_id])
    out = capsys.readouterr()[0]
    assert code == 0 and json.loads(out) == doc
    code = cli.main(["workflow", "status", res.run.run_id, "--format", "otlp-json"])
    assert code == 0 and json.loads(capsys.readouterr()[0]) == doc
    assert SECRET not in out


def test_a_session_report_that_ends_the_run_exports_its_trace(project, receiver):
    wf = write_wf(project, "s.md", "steps:\n  - id: write", "## write\n\nWrite it.")
    res = api.run_workflow(str(wf), cwd=str(project))
    assert res.run.status == "awaiting_session" and receiver.bodies == []  # nothing ended yet
    unit = api.next_brief(res.run.run_id).to_json()["units"][0]["unitId"]
    api.report_unit(res.run.run_id, unit, cwd=str(project), status="completed", result="done")
    names = sorted(s["name"] for s in receiver.spans())
    assert names == ["invoke_agent session", "invoke_workflow s", "step write"], names


def test_a_resumed_run_continues_its_trace_linked_to_the_first_stretch(project, receiver):
    flag = project / "flag"
    code = f"import pathlib, sys; p = pathlib.Path({str(flag)!r}); sys.exit(0 if p.exists() else (p.touch() or 3))"
    wf = write_wf(
        project,
        "r.md",
        f"steps:\n  - id: a\n    unit: {{ exec: {{ command: {json.dumps([sys.executable, '-c', code])} }} }}",
        "## a\n\nA.",
    )
    first = api.run_workflow(str(wf), cwd=str(project))
    assert first.run.status == "failed"
    (root1,) = [s for s in receiver.spans() if s["name"].startswith("invoke_workflow")]
    (step1,) = [s for s in receiver.spans() if s["name"] == "step a"]
    assert step1["status"] == 2 and "exited 3" in step1["statusMessage"], step1
    assert root1["status"] == 2 and root1["attributes"]["akm.run.status"] == "failed"  # STATUS_CODE_ERROR
    (failed,) = [s for s in receiver.spans() if s["name"].startswith("exec")]
    assert failed["attributes"]["process.exit.code"] == 3 and failed["attributes"]["error.type"] == "non_zero_exit"
    api.resume(first.run.run_id)
    again = api.run_workflow(first.run.run_id, cwd=str(project))
    assert again.run.status == "completed"
    spans = receiver.spans()
    roots = [s for s in spans if s["name"].startswith("invoke_workflow")]
    assert len(roots) == 2 and len({s["spanId"] for s in spans}) == len(spans)  # nothing sent twice
    assert len({s["traceId"] for s in spans}) == 1
    second = next(r for r in roots if r["spanId"] != root1["spanId"])
    assert second["links"] == [root1["spanId"]] and second["attributes"]["akm.run.segment"] == 1


def test_workflow_run_without_tracing_loads_none_of_opentelemetry(project, tmp_path):
    import subprocess

    wf = write_wf(project, "q.md", 'steps:\n  - id: a\n    unit: { exec: { command: ["true"] } }', "## a\n\nA.")
    code = (
        "import sys, akm.cli; rc = akm.cli.main(['workflow', 'run', sys.argv[1], '--format', 'json']); "
        "print([m for m in sys.modules if m.startswith(('opentelemetry', 'google.protobuf', 'requests'))])"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code, str(wf)], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_an_mcp_workflow_run_with_trace_context_in_meta_is_a_child_of_the_callers_span(project, receiver):
    import anyio
    from mcp import Client

    from akm.mcp import build_server

    wf = write_wf(project, "m.md", 'steps:\n  - id: a\n    unit: { exec: { command: ["true"] } }', "## a\n\nA.")
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    server = build_server(cwd=str(project))

    async def main():
        async with Client(server) as client:
            return await client.call_tool(
                "workflow_run", {"target": wf.name}, meta={"traceparent": f"00-{caller_trace}-{caller_span}-01"}
            )

    try:
        result = anyio.run(main)
    finally:
        server.drives.shutdown()
    assert not result.is_error and result.structured_content["run"]["status"] == "completed"
    assert result.structured_content["run"]["spend"]["units"] == 1  # MCP results carry the run's spend
    spans = receiver.spans()
    assert spans and {s["traceId"] for s in spans} == {caller_trace}
    (root,) = [s for s in spans if s["name"].startswith("invoke_workflow")]
    assert root["parentSpanId"] == caller_span


@pytest.mark.slow
def test_the_built_file_exports_the_trace(akm_zipapp, project):
    """The zipapp carries the SDK and exporter it prunes around (bundle/build.py): a traced run from it."""
    r = OtlpReceiver()
    try:
        write_wf(project, "z.md", 'steps:\n  - id: a\n    unit: { exec: { command: ["true"] } }', "## a\n\nA.")
        akm_zipapp.env = dict(akm_zipapp.env, OTEL_EXPORTER_OTLP_ENDPOINT=r.url)
        out = akm_zipapp.json("workflow", "run", "z.md", "--format", "json")
        assert out["run"]["status"] == "completed"
        names = sorted(s["name"] for s in r.spans())
        assert names == ["exec true", "invoke_workflow z", "step a"], names
        doc = akm_zipapp.json("trace", "export", out["run"]["runId"])
        assert len(doc["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 3
    finally:
        r.close()


def test_config_telemetry_turns_tracing_on_and_holds_no_headers(project, capsys, monkeypatch):
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    r = OtlpReceiver()
    try:
        assert (
            cli.main(["config", "set", "telemetry", json.dumps({"endpoint": r.url, "serviceName": "from-config"})]) == 0
        )
        code = cli.main(["config", "set", "telemetry", json.dumps({"endpoint": r.url, "headers": {"x": "y"}})])
        assert code == 78 and "OTEL_EXPORTER_OTLP_HEADERS" in capsys.readouterr()[1]
        wf = write_wf(project, "c.md", 'steps:\n  - id: a\n    unit: { exec: { command: ["true"] } }', "## a\n\nA.")
        assert api.run_workflow(str(wf), cwd=str(project)).run.status == "completed"
        spans = r.spans()
        assert len(spans) == 3 and {s["resource"]["service.name"] for s in spans} == {"from-config"}
    finally:
        r.close()


def test_an_agent_cli_gets_traceparent_and_the_otel_settings(project, receiver, tmp_path, capsys, monkeypatch):
    """A harness CLI (tests/fake_harness.py, claude) joins the run's trace: TRACEPARENT names its attempt's
    span, and it gets the OTEL_* settings, headers included, to send its own spans to the same collector."""
    import os

    from tests import fake_harness

    bin_dir = tmp_path / "bin"
    fake_harness.install(str(bin_dir), ["claude"])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    engine = {"kind": "agent", "platform": "claude", "model": "sonnet", "prices": {"input": 3, "output": 15}}
    assert cli.main(["config", "set", "engines.coder", json.dumps(engine)]) == 0
    capsys.readouterr()
    wf = write_wf(project, "a.md", "steps:\n  - id: code\n    unit: { engine: coder }", "## code\n\nWrite it.")
    res = api.run_workflow(str(wf), cwd=str(project))
    assert res.run.status == "completed", res.run
    [call] = fake_harness.calls(str(bin_dir))
    (agent,) = [s for s in receiver.spans() if s["name"].startswith("invoke_agent")]
    assert call["env"]["TRACEPARENT"] == f"00-{agent['traceId']}-{agent['spanId']}-01"
    assert call["env"]["OTEL_EXPORTER_OTLP_HEADERS"] == f"x-api-key={HEADER_SECRET}"
    assert call["env"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == receiver.url and "OTEL_SERVICE_NAME" not in call["env"]
    attrs = agent["attributes"]
    assert attrs["gen_ai.operation.name"] == "invoke_agent" and attrs["gen_ai.agent.name"] == "coder"
    assert attrs["gen_ai.provider.name"] == "claude" and attrs["akm.usage.tokens"] == 150
    assert attrs["akm.cost.usd"] > 0
