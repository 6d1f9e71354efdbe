"""The LLM dispatcher against a real OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from akm.dispatch.base import UnitRequest
from akm.dispatch.llm import LlmCallError, LlmDispatcher, build_body, chat, post_chat, probe_json_schema
from tests.helpers import wait_until

KEY = "s3cr3t-key-value-9431"


def snap(server, model: str = "plain", **extra) -> dict:
    return {
        "name": "fast",
        "kind": "llm",
        "endpoint": server.url,
        "model": model,
        "concurrency": 4,
        "credential": {"names": ["AKM_ENGINE_FAST_API_KEY"], "required": False},
        **extra,
    }


def req(
    engine: dict, *, prompt: str = "Do it.", schema=None, timeout_ms=10_000, env=None, attempt="s:solo", **kw
) -> UnitRequest:
    return UnitRequest(
        run_id="r1",
        step_id="s",
        unit_id="s:solo",
        attempt_id=attempt,
        kind="llm",
        cwd="/tmp",
        prompt=prompt,
        output_schema=schema,
        timeout_ms=timeout_ms,
        engine_name=engine["name"],
        engine=engine,
        parent_env=env if env is not None else {},
        **kw,
    )


def run(request: UnitRequest, cancel: threading.Event | None = None, feedback=None, dispatcher=None):
    return (dispatcher or LlmDispatcher()).dispatch(request, cancel or threading.Event(), feedback)


def test_plain_answer_request_body_and_tokens(fake_openai):
    res = run(req(snap(fake_openai)))
    assert res.ok and res.text == "hello" and res.tokens == 17 and res.failure_reason is None
    [r] = fake_openai.requests
    assert r["body"] == {"model": "plain", "messages": [{"role": "user", "content": "Do it."}], "temperature": 0.3}
    assert "authorization" not in {k.lower() for k in r["headers"]}


def test_structured_request_uses_json_schema_only_when_supported(fake_openai):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    res = run(req(snap(fake_openai, "json", supportsJsonSchema=True), schema=schema))
    assert res.ok and json.loads(res.text) == {"ok": True} and res.tokens == 7
    assert fake_openai.requests[-1]["body"]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "akm_response", "schema": schema, "strict": False},
    }
    closed = {**schema, "required": ["ok"], "additionalProperties": False}
    run(req(snap(fake_openai, "json", supportsJsonSchema=True), schema=closed))
    assert fake_openai.requests[-1]["body"]["response_format"]["json_schema"]["strict"] is True
    run(req(snap(fake_openai, "json"), schema=schema))
    assert "response_format" not in fake_openai.requests[-1]["body"]


def test_engine_and_unit_options_shape_the_body(fake_openai):
    engine = snap(
        fake_openai,
        "plain",
        temperature=0.1,
        maxTokens=50,
        extraParams={"top_k": 5},
        provider="vllm",
        enableThinking=False,
    )
    run(req(engine, llm_options={"temperature": 0.7}, system_prompt="Be brief."))
    body = fake_openai.requests[-1]["body"]
    assert body["temperature"] == 0.7 and body["max_tokens"] == 50 and body["top_k"] == 5
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and "stream" not in body
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert build_body({"model": "m", "enableThinking": True}, [])["enable_thinking"] is True


def test_reasoning_content_is_the_answer_when_content_is_empty(fake_openai):
    assert run(req(snap(fake_openai, "reasoning"))).text == "thought"


def test_rate_limit_honours_retry_after(fake_openai):
    start = time.monotonic()
    res = run(req(snap(fake_openai, "rate-limit-1")))
    assert res.ok and res.text == "ok"
    times = [r["at"] for r in fake_openai.requests]
    assert len(times) == 2 and times[1] - times[0] >= 0.95
    assert time.monotonic() - start < 30


def test_rate_limit_without_retry_after_fails_at_once(fake_openai):
    res = run(req(snap(fake_openai, "rate-limit")))
    assert not res.ok and res.failure_reason == "llm_rate_limit" and "429" in res.error
    assert len(fake_openai.requests) == 1


def test_rate_limit_retry_after_beyond_the_budget_is_not_waited_for(fake_openai):
    res = run(req(snap(fake_openai, "rate-limit-30"), timeout_ms=2000))
    assert res.failure_reason == "llm_rate_limit" and "retry after 30 s" in res.error
    assert len(fake_openai.requests) == 1


def test_one_transport_retry_for_a_500(fake_openai):
    assert run(req(snap(fake_openai, "flaky-500"))).text == "ok"
    assert len(fake_openai.bodies("flaky-500")) == 2
    res = run(req(snap(fake_openai, "fail-500")))
    assert res.failure_reason == "llm_http_error" and "HTTP 500" in res.error and "boom" in res.error
    assert len(fake_openai.bodies("fail-500")) == 2
    # a JSON error that merely mentions HTML is still a 5xx of the model server: retried
    assert run(req(snap(fake_openai, "flaky-500-words"))).text == "ok"
    assert len(fake_openai.bodies("flaky-500-words")) == 2


@pytest.mark.parametrize(
    "model,reason,words",
    [
        ("malformed", "llm_bad_response", "not JSON"),
        ("html-200", "llm_bad_response", "HTML page"),
        ("no-choices", "llm_bad_response", "no choices"),
        ("stream", "llm_bad_response", "event stream"),
        ("html-502", "llm_http_error", "HTTP 502"),
        ("filtered", "llm_content_filter", "content_filter"),
        ("nope", "llm_http_error", "HTTP 404"),
    ],
)
def test_bad_answers_map_to_failure_reasons(fake_openai, model, reason, words):
    res = run(req(snap(fake_openai, model)))
    assert not res.ok and res.failure_reason == reason and words in res.error, res.error
    assert fake_openai.url in res.error
    assert len(fake_openai.bodies(model)) == 1  # none of these is retried


def test_dropped_connection_is_retried_once_then_a_network_error(fake_openai):
    res = run(req(snap(fake_openai, "drop")))
    assert res.failure_reason == "llm_network_error" and len(fake_openai.bodies("drop")) == 2


def test_connection_refused_is_a_network_error_not_retried():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    engine = {
        "name": "gone",
        "kind": "llm",
        "endpoint": f"http://127.0.0.1:{port}/v1/chat/completions",
        "model": "m",
        "credential": {"names": [], "required": False},
    }
    start = time.monotonic()
    res = run(req(engine))
    assert res.failure_reason == "llm_network_error" and time.monotonic() - start < 5


def test_timeout_is_prompt(fake_openai):
    start = time.monotonic()
    res = run(req(snap(fake_openai, "slow-30"), timeout_ms=300))
    took = time.monotonic() - start
    # generous for a loaded CI box, and still far below the 30 s the server would take
    assert res.failure_reason == "timeout" and "300 ms" in res.error and took < 15.0, (res, took)


def test_unbounded_timeout_waits(fake_openai):
    res = run(req(snap(fake_openai, "slow-0.3"), timeout_ms=None))
    assert res.ok and res.tokens == 2


def test_cancel_aborts_an_in_flight_request_promptly(fake_openai):
    cancel = threading.Event()
    cancelled_at: list[float] = []

    def cancel_once_asked() -> None:  # the event, not a fixed 0.3 s: a loaded box may not have sent it by then
        wait_until(lambda: fake_openai.bodies("slow-60"), what="the request to reach the server")
        cancelled_at.append(time.monotonic())
        cancel.set()

    threading.Thread(target=cancel_once_asked, daemon=True).start()
    res = run(req(snap(fake_openai, "slow-60"), timeout_ms=None), cancel)
    took = time.monotonic() - cancelled_at[0]
    assert res.failure_reason == "aborted" and took < 30.0, (res, took)  # not the 60 s the server takes to answer
    assert len(fake_openai.bodies("slow-60")) == 1


def test_cancelled_before_dispatch_sends_nothing(fake_openai):
    cancel = threading.Event()
    cancel.set()
    assert run(req(snap(fake_openai)), cancel).failure_reason == "aborted"
    assert fake_openai.requests == []


def test_engine_concurrency_caps_requests_in_flight(fake_openai):
    engine = snap(fake_openai, "hold-0.3", concurrency=2)
    dispatcher = LlmDispatcher()
    results = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(run(req(engine, attempt=f"u{i}"), dispatcher=dispatcher)))
        for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 6 and all(r.ok for r in results)
    assert fake_openai.max_inflight == 2


def test_key_from_env_reference_is_sent_and_scrubbed_everywhere(fake_openai):
    engine = snap(fake_openai, "echo-auth", credential={"names": ["FAST_KEY"], "required": True})
    res = run(req(engine, env={"FAST_KEY": KEY}))
    assert fake_openai.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert res.ok and KEY not in res.text and "[REDACTED]" in res.text
    bad = run(req({**engine, "model": "unauthorized"}, env={"FAST_KEY": KEY}))
    assert bad.failure_reason == "llm_http_error" and "401" in bad.error and KEY not in bad.error
    assert fake_openai.url in bad.error


def test_conventional_key_names_and_the_default_fallback(fake_openai):
    engine = snap(
        fake_openai,
        "echo-auth",
        credential={"names": ["AKM_ENGINE_FAST_API_KEY", "AKM_LLM_API_KEY"], "required": False},
    )
    run(req(engine, env={"AKM_ENGINE_FAST_API_KEY": "aaaa1", "AKM_LLM_API_KEY": "bbbb2"}))
    assert fake_openai.requests[-1]["headers"]["Authorization"] == "Bearer aaaa1"
    run(req(engine, env={"AKM_LLM_API_KEY": "bbbb2"}))
    assert fake_openai.requests[-1]["headers"]["Authorization"] == "Bearer bbbb2"


def test_missing_required_key_fails_without_a_request(fake_openai):
    engine = snap(fake_openai, credential={"names": ["FAST_KEY"], "required": True})
    res = run(req(engine, env={}))
    assert res.failure_reason == "dispatch_error" and "$FAST_KEY" in res.error
    assert fake_openai.requests == []


def test_env_bindings_are_refused_on_llm_units(fake_openai):
    res = run(req(snap(fake_openai), env_bindings={"TOKEN": "abcdefgh"}))
    assert res.failure_reason == "env_unsupported" and fake_openai.requests == []


def test_sensitive_values_are_scrubbed_from_answers(fake_openai):
    res = run(req(snap(fake_openai, "echo"), prompt="the password is hunter2-long", sensitive_values=["hunter2-long"]))
    assert res.text == "the password is [REDACTED]"


def test_feedback_continues_the_conversation(fake_openai):
    dispatcher = LlmDispatcher()
    engine = snap(fake_openai, "transcript")
    first = run(req(engine, prompt="Give JSON."), dispatcher=dispatcher)
    second = run(req(engine, prompt="Give JSON."), feedback="That was not JSON.", dispatcher=dispatcher)
    msgs = json.loads(second.text)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == first.text and msgs[2]["content"] == "That was not JSON."
    fresh = run(req(engine, prompt="Give JSON.", attempt="other"), feedback="Again.", dispatcher=LlmDispatcher())
    assert json.loads(fresh.text) == [{"role": "user", "content": "Give JSON.\n\nAgain."}]


def test_chat_and_post_chat_for_judges_and_setup(fake_openai):
    resp = chat(snap(fake_openai, "plain"), [{"role": "user", "content": "hi"}], environ={})
    assert resp.text == "hello" and resp.tokens == 17 and resp.finish_reason == "stop"
    body = {"model": "plain", "messages": [{"role": "user", "content": "Reply OK"}], "max_tokens": 1, "stream": False}
    post_chat(fake_openai.url, body)
    assert fake_openai.requests[-1]["body"] == body
    with pytest.raises(LlmCallError) as info:
        post_chat(fake_openai.url, {**body, "model": "fail-500"})
    assert info.value.code == "http_error" and info.value.status == 500
    assert len(fake_openai.bodies("fail-500")) == 1  # post_chat never retries


def test_probe_json_schema(fake_openai):
    ok = probe_json_schema({"endpoint": fake_openai.url, "model": "probe-ok"})
    assert ok.reachable and ok.structured_output
    assert fake_openai.requests[-1]["body"]["response_format"]["json_schema"] == {
        "name": "akm_response",
        "schema": fake_openai.requests[-1]["body"]["response_format"]["json_schema"]["schema"],
        "strict": True,
    }
    assert fake_openai.requests[-1]["body"]["max_tokens"] == 64 and fake_openai.requests[-1]["body"]["temperature"] == 0
    bad = probe_json_schema({"endpoint": fake_openai.url, "model": "plain"})
    assert bad.reachable and not bad.structured_output
    down = probe_json_schema({"endpoint": fake_openai.url, "model": "fail-500"}, timeout_ms=5000)
    assert not down.reachable and "500" in down.error
