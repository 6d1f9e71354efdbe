"""Read how units are dispatched: a `unit:` / `map.unit:` bag and the `defaults:` it falls back to.

`defaults` and a unit bag share their dispatch fields (engine, model, llm,
timeout, on_error), so both go through one reader per field and an author sees
the same rules and messages in either place. Durations become milliseconds here
(`timeout: none` is kept apart from "not written", see UnitBag), retry reasons
are checked against the closed list, and `llm.extra_params` is screened for keys
akm owns and for credentials, which must never sit in a workflow file.
"""

from __future__ import annotations

import math
import re
from typing import Any

from akm.format.field_reader import FieldReader, as_int, describe, suggest
from akm.format.grammar import (
    CREDENTIAL_KEYS,
    DEFAULTS_KEYS,
    DURATION_HINT,
    DURATION_RE,
    ENGINE_NAME_RE,
    ENV_REF_RE,
    LLM_KEYS,
    MAX_ENV_REFS,
    MAX_EXTRA_PARAMS_BYTES,
    MAX_RETRY,
    MAX_TIMEOUT_MS,
    ON_ERROR_CHOICES,
    PROTECTED_LLM_KEYS,
    RETRY_KEYS,
    UNIT_KEYS,
)
from akm.format.model import RETRYABLE_REASONS, Defaults, LlmOptions, RetrySpec, UnitBag
from akm.format.read_exec import read_exec
from akm.format.read_schemas import read_output_schema
from akm.format.yaml12 import js_string

_REASONS_HINT = f"choose from: {', '.join(RETRYABLE_REASONS)}"


def read_defaults(ctx: FieldReader, root: dict) -> Defaults | None:
    node = ctx.section(root, "defaults", DEFAULTS_KEYS)
    if node is None:
        return None
    out: dict[str, Any] = {}
    for key in ("engine", "model", "timeout", "on_error", "llm"):
        if key in node:
            _read_dispatch_field(ctx, node, key, ("defaults",), "defaults", out)
    out = {k: v for k, v in out.items() if v is not None}
    return Defaults(**out) if out else None


def read_unit_bag(ctx: FieldReader, value: Any, yp: tuple, label: str, prefix: str) -> UnitBag | None:
    """Read a `unit:` / `map.unit:` bag. Messages name fields as `<label>: <prefix>.<key>`."""
    what = f"{label}: {prefix}"
    node = ctx.strict_mapping(
        value, yp, what, UNIT_KEYS, hint="e.g. `unit: { timeout: 10m, retry: { max: 1, on: [timeout] } }`"
    )
    if node is None:
        return None
    out: dict[str, Any] = {}
    if "exec" in node:
        out["exec"] = read_exec(ctx, node["exec"], yp + ("exec",), f"{what}.exec")
        for k in ("engine", "model", "llm"):
            if k in node:
                ctx.error(
                    "exec_engine_conflict",
                    f'{label}: {prefix} declares both "exec" and "{k}"; an exec unit runs a command and names no engine',
                    yp + (k,),
                    key=True,
                    hint=f'remove "{k}" (or remove "exec" to dispatch to an engine)',
                )
    for key in ("engine", "model", "llm", "timeout"):
        if key in node:
            _read_dispatch_field(ctx, node, key, yp, what, out)
    if "retry" in node:
        out["retry"] = _read_retry(ctx, node["retry"], yp + ("retry",), f"{what}.retry")
    if "on_error" in node:
        _read_dispatch_field(ctx, node, "on_error", yp, what, out)
    if "output" in node:
        out["output"] = read_output_schema(ctx, node["output"], yp + ("output",), f"{what}.output", "{ type: object }")
    if "env" in node:
        out["env"] = _read_env_refs(ctx, node["env"], yp + ("env",), f"{what}.env")
    if "isolation" in node:
        out["isolation"] = ctx.choice(node["isolation"], yp + ("isolation",), f"{what}.isolation", ("none", "worktree"))
    keep = {k: v for k, v in out.items() if v is not None or k == "timeout_ms"}
    return UnitBag(**keep)


def _read_env_refs(ctx: FieldReader, value: Any, yp: tuple, what: str) -> list[str] | None:
    """`env/<name>` refs. Checked here, not at dispatch: a bad ref must fail lint, not a run midway."""
    refs = ctx.string_list(value, yp, what, limit=MAX_ENV_REFS, unique=True)
    if refs is None:
        return None
    # Upstream's colon spelling `env:<name>` (its own tests freeze and run it) is the same ref as `env/<name>`.
    refs = list(dict.fromkeys("env/" + r[4:] if r.startswith("env:") else r for r in refs))
    ok = True
    for i, ref in enumerate(refs):
        if not ENV_REF_RE.match(ref):
            ctx.error(
                "invalid_env_ref",
                f"{what}[{i}] is {describe(ref)}, not an env ref of the form env/<name>",
                yp + (i,),
                hint="<name> is letters, digits, _, . and - (not starting with a dot), e.g. env/ci; "
                "it names the file .akm/env/<name>.env",
            )
            ok = False
    return refs if ok else None


def _read_dispatch_field(ctx: FieldReader, node: dict, key: str, yp: tuple, what: str, out: dict[str, Any]) -> None:
    """Read one field `defaults` and a unit bag share into `out` (None = reported as invalid)."""
    value, kyp, kwhat = node[key], yp + (key,), f"{what}.{key}"
    if key == "engine":
        out["engine"] = _read_engine_name(ctx, value, kyp, kwhat)
    elif key == "model":
        out["model"] = ctx.text(value, kyp, kwhat)
    elif key == "llm":
        out["llm"] = _read_llm(ctx, value, kyp, kwhat)
    elif key == "timeout":
        ok, ms = read_duration(ctx, value, kyp, kwhat)
        if ok:
            out["timeout_set"], out["timeout_ms"] = True, ms
    elif key == "on_error":
        out["on_error"] = ctx.choice(value, kyp, kwhat, ON_ERROR_CHOICES)
    else:
        raise ValueError(f"not a shared dispatch field: {key}")


def _read_engine_name(ctx: FieldReader, value: Any, yp: tuple, what: str) -> str | None:
    name = ctx.text(value, yp, what)
    if name is None:
        return None
    if len(name) > 63 or not ENGINE_NAME_RE.match(name):
        ctx.error(
            "invalid_value",
            f'{what} "{name}" is not a valid engine name: lower-case letters and digits in '
            "dash-separated words, at most 63 characters",
            yp,
        )
        return None
    return name


def read_duration(ctx: FieldReader, value: Any, yp: tuple, what: str) -> tuple[bool, int | None]:
    """(ok, milliseconds). `none` -> (True, None): explicitly unbounded."""
    ms: int | None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        ctx.error("invalid_duration", f"{what} must be a duration, not {describe(value)}", yp, hint=DURATION_HINT)
        return (False, None)
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "none":
            return (True, None)
        m = DURATION_RE.match(text)
        if not m:
            ctx.error("invalid_duration", f'{what} "{value}" is not a valid duration', yp, hint=DURATION_HINT)
            return (False, None)
        ms = int(m.group(1)) * {None: 1, "ms": 1, "s": 1000, "m": 60_000}[m.group(2)]
    else:
        n = as_int(value)
        if n is None or n <= 0:
            ctx.error(
                "invalid_duration",
                f"{what} must be a positive whole number of milliseconds; got {js_string(value)}",
                yp,
                hint=DURATION_HINT,
            )
            return (False, None)
        ms = n
    if ms <= 0:
        ctx.error("invalid_duration", f'{what} must be longer than zero; got "{value}"', yp, hint=DURATION_HINT)
        return (False, None)
    if ms > MAX_TIMEOUT_MS:
        ctx.error(
            "out_of_range",
            f"{what} is {ms} ms; the longest allowed is {MAX_TIMEOUT_MS} ms (about 24.8 days)",
            yp,
            hint='use "none" for no limit',
        )
        return (False, None)
    return (True, ms)


def _read_retry(ctx: FieldReader, value: Any, yp: tuple, what: str) -> RetrySpec | None:
    """`retry: { max, on }`; `what` is the field's own name (`<label>: unit.retry`)."""
    before = len(ctx.errors)
    node = ctx.strict_mapping(value, yp, what, RETRY_KEYS, hint="write `retry: { max: 2, on: [timeout] }`")
    if node is None:
        return None
    max_n = None
    if "max" not in node:
        ctx.error(
            "missing_key",
            f"{what}.max is required: how many extra attempts to allow",
            yp,
            hint="e.g. `retry: { max: 2, on: [timeout] }`",
        )
    else:
        max_n = ctx.integer(node["max"], yp + ("max",), f"{what}.max", 0, MAX_RETRY)
    reasons: list[str] = []
    if "on" not in node:
        ctx.error(
            "missing_key", f"{what}.on is required: the failure reasons that trigger a retry", yp, hint=_REASONS_HINT
        )
    elif not isinstance(node["on"], list):
        ctx.error(
            "invalid_type",
            f"{what}.on must be a list of failure reasons, not {describe(node['on'])}",
            yp + ("on",),
            hint=_REASONS_HINT,
        )
    elif not node["on"]:
        ctx.error("invalid_value", f"{what}.on must list at least one failure reason", yp + ("on",), hint=_REASONS_HINT)
    else:
        for i, reason in enumerate(node["on"]):
            if not isinstance(reason, str) or reason not in RETRYABLE_REASONS:
                shown = f'"{reason}"' if isinstance(reason, str) else describe(reason)
                ctx.error(
                    "invalid_retry_reason",
                    f"{what}.on[{i}] {shown} is not a retryable failure reason",
                    yp + ("on", i),
                    hint=f"{suggest(reason, RETRYABLE_REASONS) if isinstance(reason, str) else ''}"
                    f"valid reasons: {', '.join(RETRYABLE_REASONS)}",
                )
            elif reason in reasons:
                ctx.duplicate(f"{what}.on", reason, yp + ("on", i))
            else:
                reasons.append(reason)
    if len(ctx.errors) != before or max_n is None:
        return None
    return RetrySpec(max=max_n, on=reasons)


def _as_float(value: Any) -> float | None:
    """A YAML number as a finite float; None for anything else (a bool, text, NaN, infinity, or an
    integer too large for a float — a 400-digit `temperature` is a mistake to report, not a crash)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _read_llm(ctx: FieldReader, value: Any, yp: tuple, what: str) -> LlmOptions | None:
    node = ctx.strict_mapping(value, yp, what, LLM_KEYS)
    if node is None:
        return None
    out: dict[str, Any] = {}
    if "temperature" in node:
        t = node["temperature"]
        number = _as_float(t)
        if number is None:
            ctx.error(
                "invalid_type", f"{what}.temperature must be a finite number, not {describe(t)}", yp + ("temperature",)
            )
        else:
            out["temperature"] = number  # `temperature: 1` is 1.0 in the plan (as when this was a pydantic float)
    for k in ("max_tokens", "context_length"):
        if k in node:
            out[k] = ctx.integer(node[k], yp + (k,), f"{what}.{k}", 1, 2**53 - 1)
    for k in ("supports_json_schema", "enable_thinking"):
        if k in node:
            out[k] = ctx.boolean(node[k], yp + (k,), f"{what}.{k}")
    if "extra_params" in node:
        out["extra_params"] = _read_extra_params(
            ctx, node["extra_params"], yp + ("extra_params",), f"{what}.extra_params"
        )
    out = {k: v for k, v in out.items() if v is not None}
    return LlmOptions(**out) if out else None


def _read_extra_params(ctx: FieldReader, value: Any, yp: tuple, what: str) -> dict | None:
    """Provider pass-through parameters: JSON-able, bounded, and free of protected or secret keys."""
    node = ctx.mapping(value, yp, what)
    if node is None:
        return None
    before = len(ctx.errors)
    if not ctx.json_value(node, yp, what):
        return None
    ctx.json_size(node, yp, what, MAX_EXTRA_PARAMS_BYTES)  # reported, but keep checking the keys
    for k in node:
        if _norm_key(k) in PROTECTED_LLM_KEYS:
            ctx.error(
                "protected_llm_param",
                f"{what}.{k} is protected by AKM: akm sets it for every request",
                yp + (k,),
                key=True,
                hint="use the dedicated llm keys (temperature, max_tokens, enable_thinking) or the unit's model",
            )

    def walk(v: Any, p: tuple) -> None:
        if isinstance(v, dict):
            for k, sub in v.items():
                if _norm_key(k) in CREDENTIAL_KEYS:
                    ctx.error(
                        "credential_in_llm",
                        f'{what} key "{k}" cannot carry credentials in a workflow file',
                        p + (k,),
                        key=True,
                        hint="configure the engine's API key in akm config as ${ENV_NAME}; workflow files are not secret",
                    )
                walk(sub, p + (k,))
        elif isinstance(v, list):
            for i, sub in enumerate(v):
                walk(sub, p + (i,))

    walk(node, yp)
    return node if len(ctx.errors) == before else None


def _norm_key(key: str) -> str:
    """Case and punctuation removed, so `Max-Tokens` and `max_tokens` are the same key."""
    return re.sub(r"[^a-z0-9]", "", key.lower())
