"""What a config may say, stated once for both validators: limits, names, platforms, retired keys, URL rules.

Why a module of its own: the pydantic models (`akm.config._schema`) and the pydantic-free fast path
(`akm.config.plain`) must apply the same rules, and the fast path runs before the models are tried.
Both import this leaf, so neither imports the other's package `__init__` (that was an import cycle).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import SplitResult, urlsplit

from akm.format.grammar import CONFIG_ENGINE_NAME_RE, ENV_VAR_RE, ENV_VAR_REF_RE
from akm.format.grammar import MAX_TIMEOUT_MS as MAX_TIMEOUT_MS  # an engine's timeout bound is a step's

MAX_CONCURRENCY = 64

ENGINE_NAME_RE = CONFIG_ENGINE_NAME_RE  # the name rules live in akm/format/grammar.py
ENGINE_NAME_MAX = 63
ENV_NAME_RE = ENV_VAR_RE
_ENV_REF_RE = ENV_VAR_REF_RE

# `workflow.judgeEngine: session` = the calling agent judges (D12). Not an engine name.
SESSION_JUDGE = "session"
RESERVED_ENGINE_NAMES = frozenset({SESSION_JUDGE})

# Agent harnesses akm knows how to drive (akm.dispatch.agents has one profile each).
AGENT_PLATFORMS: tuple[str, ...] = (
    "claude",
    "codex",
    "opencode",
    "gemini",
    "aider",
    "copilot",
    "amazonq",
    "pi",
    "openhands",
)
# Harnesses that can be pointed at an OpenAI-compatible endpoint (an agent engine's `llmEngine`).
PLATFORMS_WITH_LLM_ENGINE: tuple[str, ...] = ("opencode", "aider", "openhands")

# Keys that belong to the other kind: named in the error instead of a generic "extra key".
_LLM_ONLY_KEYS = (
    "provider",
    "endpoint",
    "apiKey",
    "temperature",
    "maxTokens",
    "supportsJsonSchema",
    "extraParams",
    "contextLength",
    "enableThinking",
)
_AGENT_ONLY_KEYS = ("platform", "bin", "args", "llmEngine", "envPassthrough", "modelAliases")

# Top-level keys of the upstream tool's older formats: refused with a pointer instead of silently ignored.
_RETIRED_TOP_LEVEL = {
    "profiles": "engine profiles are now `engines.<name>` with a `kind` (llm or agent)",
    "llm": "the LLM connection is now an engine: `engines.<name>` with kind llm, and `defaults.llmEngine`",
    "agent": "agent CLIs are now engines: `engines.<name>` with kind agent, and `defaults.agentEngine`",
}
_RETIRED_DEFAULTS = {
    "engine": "use defaults.llmEngine or defaults.agentEngine",
    "llm": "use defaults.llmEngine",
    "agent": "use defaults.agentEngine",
}


# Money (config `engines.<name>.prices`, `limits.maxCostPerDay`): US dollars; a price is per million tokens.
PRICE_KEYS = ("input", "output", "cached")
MAX_PRICE_USD = 1e6
TELEMETRY_PROTOCOLS = ("http/protobuf",)


def price_problem(value: Any) -> str | None:
    """Why `value` is not a price (a finite number of US dollars from 0 to MAX_PRICE_USD), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return "must be a number of US dollars"
    if not 0 <= value <= MAX_PRICE_USD:
        return f"must be from 0 to {MAX_PRICE_USD:g}"
    return None


def telemetry_endpoint_problem(value: Any) -> str | None:
    """Why `value` is not an OTLP/HTTP collector URL, or None."""
    if not isinstance(value, str) or not value.strip():
        return "must be a URL such as http://localhost:4318"
    try:
        parts = urlsplit(value)
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL such as http://localhost:4318"
    if parts.username or parts.password:
        return "must not carry credentials (set OTEL_EXPORTER_OTLP_HEADERS in the environment instead)"
    return None


def env_ref_name(value: Any) -> str | None:
    """`NAME` for a `${NAME}` / `$NAME` reference, else None."""
    if not isinstance(value, str):
        return None
    m = _ENV_REF_RE.match(value)
    return (m.group(1) or m.group(2)) if m else None


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


def endpoint_problem(endpoint: Any) -> str | None:
    """Why `endpoint` is not a usable chat-completions URL, or None."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        return "must be a URL ending in /chat/completions"
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError:
        return "is not a valid URL"
    if any(ch.isspace() for ch in endpoint):
        return "is not a valid URL (it contains whitespace)"
    return _endpoint_shape_problem(endpoint, parts)


def _endpoint_shape_problem(endpoint: str, parts: SplitResult) -> str | None:
    """Why a well-formed URL is not a chat-completions endpoint (scheme, credentials, query, path), or None."""
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be an http:// or https:// URL ending in /chat/completions"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user name or password (use apiKey: ${NAME})"
    if parts.query or parts.fragment or "?" in endpoint or "#" in endpoint:
        return "must not have a query or fragment"
    if not parts.path.rstrip("/").endswith("/chat/completions") or parts.path.endswith("/"):
        return "must end with /chat/completions (for example http://127.0.0.1:11434/v1/chat/completions)"
    return None
