"""Does an endpoint answer? And does it honour json_schema? (spec/setup.md)

`verify_endpoint` sends exactly one tiny request:

    POST <normalized endpoint>
    {"model": M, "messages": [{"role": "user", "content": "Reply OK"}], "max_tokens": 1, "stream": false}

with `Authorization: Bearer <value of $NAME>` only when a key variable is named.
The result is ok, or a short reason a user can act on:

    <URL problem>                               the URL cannot be an endpoint
    no detected model                           the model is blank
    required credential NAME is unavailable     $NAME is unset or blank (nothing is sent)
    HTTP <status>                               the server said no
    response did not contain choices[0].message.content
    <transport error>                           refused, timed out, not JSON, …

The key value is read from the environment at call time, used for that one
header, and never returned, stored or logged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from akm.config import engine_env_key_name, env_ref_name, normalize_chat_endpoint

VERIFY_TIMEOUT_S = 10.0
PROBE_TIMEOUT_MS = 30_000
VERIFY_PROMPT = "Reply OK"


@dataclass
class Verification:
    ok: bool
    endpoint: str | None  # normalized (None when the URL itself was the problem)
    model: str
    reason: str | None = None
    api_key_env: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "endpoint": self.endpoint,
            "model": self.model,
            "reason": self.reason,
            "apiKeyEnv": self.api_key_env,
        }


def verify_endpoint(
    endpoint: str,
    model: str,
    api_key_env: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = VERIFY_TIMEOUT_S,
) -> Verification:
    """One 1-token chat request; see the module docstring for the reasons."""
    from akm.dispatch.llm import LlmCallError, post_chat

    env = os.environ if environ is None else environ
    model = model if isinstance(model, str) else ""
    try:
        url = normalize_chat_endpoint(endpoint)
    except ValueError as exc:
        return Verification(False, None, model, str(exc), api_key_env)
    if not model.strip():
        return Verification(False, url, model, "no detected model", api_key_env)
    key = None
    if api_key_env:
        key = (env.get(api_key_env) or "").strip()
        if not key:
            return Verification(False, url, model, f"required credential {api_key_env} is unavailable", api_key_env)
    body = {"model": model, "messages": [{"role": "user", "content": VERIFY_PROMPT}], "max_tokens": 1, "stream": False}
    try:
        resp = post_chat(url, body, api_key=key or None, timeout_ms=int(timeout_s * 1000))
    except LlmCallError as err:
        if err.status is not None and not 200 <= err.status < 300:
            return Verification(False, url, model, f"HTTP {err.status}", api_key_env)
        if err.code == "bad_response" and "no choices" in err.message:
            return Verification(False, url, model, "response did not contain choices[0].message.content", api_key_env)
        return Verification(False, url, model, _short(err.message, url), api_key_env)
    choices = resp.raw.get("choices") if isinstance(resp.raw, dict) else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("content"), str):
        return Verification(False, url, model, "response did not contain choices[0].message.content", api_key_env)
    return Verification(True, url, model, None, api_key_env)


def _short(message: str, url: str) -> str:
    """The transport error without the URL repeated (the caller shows it next to the reason)."""
    for prefix in (f"network error talking to {url}: ", f"request to {url} ", f"{url} "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def engine_api_key(
    name: str, engine: Mapping[str, Any], *, default_llm: str | None, environ: Mapping[str, str] | None = None
) -> tuple[str | None, str | None]:
    """(key value, missing variable name) for a configured LLM engine, by the dispatch rules (spec/config.md §3).

    An explicit `apiKey: ${NAME}` must be set (else the name comes back as missing);
    otherwise `AKM_ENGINE_<NAME>_API_KEY`, then `AKM_LLM_API_KEY` for the default engine, else no key.
    """
    env = os.environ if environ is None else environ
    ref = env_ref_name(engine.get("apiKey"))
    if ref:
        value = (env.get(ref) or "").strip()
        return (value, None) if value else (None, ref)
    for var in [engine_env_key_name(name), *(["AKM_LLM_API_KEY"] if default_llm == name else [])]:
        value = (env.get(var) or "").strip()
        if value:
            return value, None
    return None, None


@dataclass
class JsonSchemaProbe:
    engine: str
    reachable: bool
    supported: bool | None  # None: could not tell (unreachable, or its key is missing)
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "reachable": self.reachable, "supported": self.supported, "reason": self.reason}


def probe_json_schema(
    name: str, engine: Mapping[str, Any], *, default_llm: str | None, environ: Mapping[str, str] | None = None
) -> JsonSchemaProbe:
    """Ask the engine for a fixed JSON object under `response_format: json_schema` (§5.6)."""
    from akm.dispatch.llm import probe_json_schema as probe

    key, missing = engine_api_key(name, engine, default_llm=default_llm, environ=environ)
    if missing:
        return JsonSchemaProbe(name, False, None, f"required credential {missing} is unavailable")
    result = probe(dict(engine), api_key=key or "", timeout_ms=PROBE_TIMEOUT_MS)
    if not result.reachable:
        return JsonSchemaProbe(name, False, None, result.error)
    return JsonSchemaProbe(name, True, result.structured_output)
