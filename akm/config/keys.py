"""`akm config get|set|unset`: dotted key paths, and turning a command-line string into a value.

Why a table and not pydantic introspection: the CLI must say "unknown key" for a
typo before anything is written, coerce `0.2` to a number for `temperature` but
keep `0.2` a string for `model`, and refuse a literal API key with a hint —
decisions about single leaves, made before the whole file is validated. The
whole-file rules (engine kinds, names pointing at the right engine) still run
on save, in `akm.config.update_config_file`.

Pure functions on plain dicts: no files, no printing.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from typing import Any

from akm.codes import Code
from akm.config import AGENT_PLATFORMS, endpoint_problem, engine_env_key_name, env_ref_name
from akm.errors import UsageError
from akm.text import MAX_WHOLE_DIGITS, shown, whole_number

# Leaf kinds: "string", "number", "integer", "boolean", "timeout" (ms or null),
# "secret" (${NAME} only), "object", "array", ("enum", choices), ("record", value kind).
_ENGINE_FIELDS: dict[str, Any] = {
    "kind": ("enum", ("llm", "agent")),
    "provider": "string",
    "endpoint": "string",
    "model": "string",
    "apiKey": "secret",
    "temperature": "number",
    "maxTokens": "integer",
    "contextLength": "integer",
    "supportsJsonSchema": "boolean",
    "concurrency": "integer",
    "extraParams": "object",
    "timeoutMs": "timeout",
    "enableThinking": "boolean",
    "platform": ("enum", AGENT_PLATFORMS),
    "bin": "string",
    "args": "array",
    "llmEngine": "string",
    "envPassthrough": "array",
    "modelAliases": ("record", "string"),
    "prices": {"input": "number", "output": "number", "cached": "number"},
}
_ENGINE = ("engine", _ENGINE_FIELDS)

SCHEMA: dict[str, Any] = {
    "engines": ("record", _ENGINE),
    "defaults": {"llmEngine": "string", "agentEngine": "string"},
    "workflow": {"judgeEngine": "string", "maxConcurrency": "integer", "defaultMapConcurrency": "integer"},
    "modelAliases": ("record", ("record", "string")),
    "journal": {"url": "string"},
    "limits": {"maxCostPerDay": "number"},
    "telemetry": {
        "enabled": "boolean",
        "endpoint": "string",
        "protocol": ("enum", ("http/protobuf",)),
        "serviceName": "string",
        "resourceAttributes": ("record", "string"),
    },  # a postgresql:// journal server (akm.store.open_journal); password as ${NAME}
}

_DURATION = re.compile(r"(\d+)(ms|s|m|h)?\Z")


def split_key(key: str) -> list[str]:
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise UsageError(
            f"Config key {shown(key)} is malformed: write dotted names like engines.fast.model.",
            code=Code.INVALID_ARGUMENT,
        )
    return parts


def _unknown(key: str) -> UsageError:
    return UsageError(
        f"Unknown config key {shown(key)}.",
        code=Code.INVALID_ARGUMENT,
        hint=f"Top-level keys: {', '.join(sorted(SCHEMA))}. Engine keys: {', '.join(sorted(_ENGINE_FIELDS))}.",
    )


def unknown_keys(data: Any) -> list[tuple[str, list[str]]]:
    """(dotted key, the keys known at that place) for every key of a config object akm does not know.

    Such keys are kept and written back (a newer akm's config must survive an older akm, as upstream keeps
    them), but they do nothing: `engines.fast.timeoutMS` is not `timeoutMs`, and nobody would know."""
    found: list[tuple[str, list[str]]] = []

    def walk(node: Any, schema: Any, path: list[str]) -> None:
        if not isinstance(node, dict):
            return
        if isinstance(schema, tuple) and schema[0] == "record":
            for name, child in node.items():
                walk(child, schema[1], [*path, str(name)])
            return
        fields = schema[1] if isinstance(schema, tuple) and schema[0] == "engine" else schema
        if not isinstance(fields, dict):
            return
        for key, child in node.items():
            if key not in fields:
                found.append((".".join([*path, str(key)]), sorted(fields)))
            else:
                walk(child, fields[key], [*path, key])

    walk(data, SCHEMA, [])
    return found


def unknown_key_warnings(data: Any, where: str | None = None) -> list[str]:
    """One warning per unknown key, with the known key it most likely means ("did you mean …")."""
    out: list[str] = []
    for dotted, known in unknown_keys(data):
        import difflib

        key = dotted.rpartition(".")[2]
        same = [k for k in known if k.lower() == key.lower()]
        near = same or difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        place = f" in {where}" if where else ""
        advice = f"did you mean {near[0]}?" if near else f"keys here: {', '.join(known)}"
        out.append(f"config key {dotted}{place} is not one akm knows: it is kept but does nothing ({advice})")
    return out


def leaf_kind(key: str) -> Any:
    """The kind of value at `key` (see the table above); UsageError for a key the schema lacks."""
    node: Any = SCHEMA
    for part in split_key(key):
        if isinstance(node, dict):
            if part not in node:
                raise _unknown(key)
            node = node[part]
        elif isinstance(node, tuple) and node[0] == "record":
            node = node[1]
        elif isinstance(node, tuple) and node[0] == "engine":
            if part not in node[1]:
                raise _unknown(key)
            node = node[1][part]
        else:  # a scalar leaf has no children
            raise _unknown(key)
    return node


def get_value(data: dict[str, Any], key: str) -> Any:
    """The value at `key` in `data`, or None when unset (the key must exist in the schema)."""
    leaf_kind(key)
    node: Any = data
    for part in split_key(key):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return copy.deepcopy(node)


def _parse_json(key: str, raw: str, want: type, what: str) -> Any:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, nested too deep, or a number of > 4300 digits
        raise UsageError(f"{key}: expected {what} as JSON, got {shown(raw)}.", code=Code.INVALID_ARGUMENT) from None
    if not isinstance(value, want):
        raise UsageError(f"{key}: expected {what}, got {type(value).__name__}.", code=Code.INVALID_ARGUMENT)
    return value


def _refuse_literal_keys(key: str, value: Any, engine_name: str | None) -> None:
    """Any `apiKey` in an object being set must be a `${NAME}` reference."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "apiKey" and env_ref_name(v) is None:
                _literal_secret(f"{key}.{k}", engine_name)
            _refuse_literal_keys(f"{key}.{k}", v, engine_name)


def _check_endpoint(key: str, value: Any) -> None:
    """An LLM endpoint typed on the command line is checked as it is typed (spec/setup.md: a leaf
    value that does not validate is a usage error, before anything is read or written)."""
    problem = endpoint_problem(value)
    if problem:
        # the value is not echoed: a URL refused for carrying a password would print it
        raise UsageError(f"{key}: the endpoint {problem}.", code=Code.INVALID_ARGUMENT)


def _check_journal_url(key: str, raw: str) -> None:
    """A journal server URL is stored only with its password as a `${NAME}` reference (or none at all),
    so the config file never holds the secret; the value is not echoed."""
    from urllib.parse import unquote, urlsplit

    from akm.store.postgres.connect import password_ref  # a leaf: stdlib and akm.errors only

    try:
        parts = urlsplit(raw)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("postgresql", "postgres"):
        raise UsageError(f"{key}: expected a postgresql:// URL.", code=Code.INVALID_ARGUMENT)
    if parts.password is not None and password_ref(unquote(parts.password)) is None:
        raise UsageError(
            f"{key}: akm does not store passwords in config; write the password as ${{NAME}} of an environment "
            "variable.",
            code=Code.INVALID_ARGUMENT,
            hint=f"export AKM_JOURNAL_PASSWORD=… and run `akm config set {key} "
            "'postgresql://USER:${AKM_JOURNAL_PASSWORD}@HOST/DATABASE'`.",
        )


def _literal_secret(key: str, engine_name: str | None) -> None:
    var = engine_env_key_name(engine_name) if engine_name else "MY_API_KEY"
    raise UsageError(
        f"{key}: akm does not store key values in config; give the name of an environment variable instead.",
        code=Code.INVALID_ARGUMENT,
        hint=f"export {var}=… and run `akm config set {key} '${{{var}}}'` (or leave apiKey unset: "
        f"akm reads {var} on its own).",
    )


def coerce(key: str, raw: str) -> tuple[Any, bool]:
    """(value, unset) for `akm config set key raw`: the string turned into the leaf's type.

    `unset` is True when the value means "remove the key" (`""` or `null` for an
    object, array or nullable leaf).
    """
    kind = leaf_kind(key)
    parts = split_key(key)
    engine_name = parts[1] if parts[0] == "engines" and len(parts) >= 2 else None
    if isinstance(kind, tuple) and kind[0] == "enum":
        if raw not in kind[1]:
            raise UsageError(
                f"{key}: expected one of {', '.join(kind[1])}, got {shown(raw)}.", code=Code.INVALID_ARGUMENT
            )
        return raw, False
    if isinstance(kind, (tuple, dict)) or kind in ("object", "array"):  # a dict: a section (`prices`, `limits`)
        return _structured(key, raw, kind, parts, engine_name)
    leaf = _LEAVES.get(kind)
    if leaf is None:  # pragma: no cover - every kind is handled
        raise _unknown(key)
    return leaf(key, raw, parts, engine_name)


def _structured(key: str, raw: str, kind: Any, parts: list[str], engine_name: str | None) -> tuple[Any, bool]:
    """An object or array leaf (or a whole section) given as JSON; `""` or `null` removes it."""
    if raw.strip() in ("", "null"):
        return None, True
    if kind == "array":
        return _parse_json(key, raw, list, "an array"), False
    value = _parse_json(key, raw, dict, "an object")
    _refuse_literal_keys(key, value, engine_name)
    if len(parts) == 2 and parts[0] == "engines" and "endpoint" in value:
        _check_endpoint(f"{key}.endpoint", value["endpoint"])
    return value, False


def _secret(key: str, raw: str, parts: list[str], engine_name: str | None) -> tuple[Any, bool]:
    """A secret: only a `${NAME}` reference to an environment variable is stored."""
    if raw.strip() in ("", "null"):
        return None, True
    if env_ref_name(raw) is None:
        _literal_secret(key, engine_name)
    return raw, False


def _string(key: str, raw: str, parts: list[str], engine_name: str | None) -> tuple[Any, bool]:
    """A string, checked where it is an engine's endpoint or the journal's URL."""
    if parts[0] == "engines" and parts[-1] == "endpoint":
        _check_endpoint(key, raw)
    if parts == ["journal", "url"]:
        _check_journal_url(key, raw)
    return raw, False


def _boolean(key: str, raw: str, parts: list[str], engine_name: str | None) -> tuple[Any, bool]:
    if raw not in ("true", "false"):
        raise UsageError(f"{key}: expected true or false, got {shown(raw)}.", code=Code.INVALID_ARGUMENT)
    return raw == "true", False


def _integer(key: str, raw: str, parts: list[str], engine_name: str | None) -> tuple[Any, bool]:
    number = whole_number(raw) if re.fullmatch(r"-?\d+", raw.strip()) else None
    if number is None or number < 1:  # every whole-number key counts from 1
        raise UsageError(
            f"{key}: expected a whole number of at least 1 (at most {MAX_WHOLE_DIGITS} digits), got {shown(raw)}.",
            code=Code.INVALID_ARGUMENT,
        )
    return number, False


def _number(key: str, raw: str, parts: list[str], engine_name: str | None) -> tuple[Any, bool]:
    """A finite number: an int when written as one, else a float."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(f"{key}: expected a number, got {shown(raw)}.", code=Code.INVALID_ARGUMENT)
    return (int(value) if value.is_integer() and re.fullmatch(r"-?\d+", raw.strip()) else value), False


def _timeout(key: str, raw: str, parts: list[str], engine_name: str | None) -> tuple[Any, bool]:
    """Milliseconds, or a duration like 90s / 10m / 1h; `none` (no timeout) is kept, `""` removes the key."""
    text = raw.strip().lower()
    if text in ("null", "none"):
        return None, False
    if text == "":
        return None, True
    m = _DURATION.match(text)
    if not m or not whole_number(m.group(1)):
        raise UsageError(
            f"{key}: expected milliseconds, a duration like 90s / 10m / 1h, or none; got {shown(raw)}.",
            code=Code.INVALID_ARGUMENT,
        )
    factor = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}[m.group(2)]
    return int(m.group(1)) * factor, False


# How `coerce` reads each scalar kind of leaf: (key, raw, the key's parts, the engine it names) -> (value, unset).
_LEAVES: dict[str, Callable[[str, str, list[str], str | None], tuple[Any, bool]]] = {
    "secret": _secret,
    "string": _string,
    "boolean": _boolean,
    "integer": _integer,
    "number": _number,
    "timeout": _timeout,
}


def set_value(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of `data` with `value` at `key`; an object deep-merges into an existing object there."""
    from akm.config import deep_merge

    out = copy.deepcopy(data)
    parts = split_key(key)
    node = out
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    last = parts[-1]
    if isinstance(value, dict) and isinstance(node.get(last), dict):
        node[last] = deep_merge(node[last], value)
    else:
        node[last] = copy.deepcopy(value)
    return out


def unset_value(data: dict[str, Any], key: str) -> dict[str, Any]:
    """A copy of `data` without `key`; parents left empty by the removal are pruned."""
    leaf_kind(key)
    out = copy.deepcopy(data)
    parts = split_key(key)
    trail: list[tuple[dict[str, Any], str]] = []
    node: Any = out
    for part in parts[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return out
        trail.append((node, part))
        node = node[part]
    if not isinstance(node, dict) or parts[-1] not in node:
        return out
    del node[parts[-1]]
    for parent, part in reversed(trail):
        if parent[part] == {}:
            del parent[part]
        else:
            break
    return out
