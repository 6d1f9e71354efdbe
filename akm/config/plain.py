"""A valid config as plain records, without pydantic: the fast path of every `workflow run` with a config file.

Why: building the config's pydantic models costs a run more than everything else it does
at start (~100 ms). Most config files are valid, and saying so needs no error messages.
`plain_config(data)` checks the merged config object against the same rules as the models
in `akm.config._schema` (strict types, camelCase keys, unknown keys kept and ignored)
and returns records with the same attributes — or None at the first thing it does not
accept, and the caller then validates with the models, which word every problem. So it may
only ever be stricter than the models, never looser (tests compare both on many configs).
"""

from __future__ import annotations

import math
from typing import Any

from akm.config import _rules as R

_DOUBT = object()  # "not certainly valid": the pydantic models decide


class _Record:
    """Attributes for every field (None when absent); `declared` says which keys the file gave."""

    def __init__(self, values: dict[str, Any], given: set[str]) -> None:
        self.__dict__.update(values)
        self._given = frozenset(given)

    def declared(self, name: str) -> bool:
        return name in self._given

    @property
    def model_fields_set(self) -> frozenset[str]:
        return self._given


class PlainLlmEngine(_Record):
    pass


class PlainAgentEngine(_Record):
    pass


class PlainDefaults(_Record):
    pass


class PlainWorkflow(_Record):
    pass


class PlainPrices(_Record):
    pass


class PlainLimits(_Record):
    pass


class PlainTelemetry(_Record):
    pass


class PlainConfig(_Record):
    engines: dict[str, Any]  # set from the file by `_Record.__init__`, like every field

    def engine(self, name: str | None) -> Any:
        return self.engines.get(name) if name else None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _string(v: Any, min_len: int = 0) -> Any:
    return v if type(v) is str and len(v) >= min_len else _DOUBT


def _integer(lo: int, hi: int | None = None) -> Any:
    def check(v: Any) -> Any:
        return v if type(v) is int and v >= lo and (hi is None or v <= hi) else _DOUBT

    return check


def _boolean(v: Any) -> Any:
    return v if type(v) is bool else _DOUBT


def _strings(v: Any) -> Any:
    return list(v) if type(v) is list and all(type(x) is str for x in v) else _DOUBT


def _no_case_twins(keys: Any) -> bool:
    lowered = [k.lower() for k in keys]
    return len(set(lowered)) == len(lowered)


def _aliases(v: Any) -> Any:
    if type(v) is not dict or not all(type(x) is str and x for x in v.values()) or not _no_case_twins(v):
        return _DOUBT
    return dict(v)


def _temperature(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return _DOUBT
    return float(v)


def _extra_params(v: Any) -> Any:
    from akm.format.grammar import CREDENTIAL_KEYS, PROTECTED_LLM_KEYS

    if type(v) is not dict or any(R._norm_key(k) in PROTECTED_LLM_KEYS for k in v):
        return _DOUBT

    def clean(node: Any) -> bool:
        if isinstance(node, dict):
            return all(
                not (isinstance(k, str) and R._norm_key(k) in CREDENTIAL_KEYS) and clean(s) for k, s in node.items()
            )
        if isinstance(node, list):
            return all(clean(s) for s in node)
        return True

    return dict(v) if clean(v) else _DOUBT


def _price(v: Any) -> Any:
    return float(v) if R.price_problem(v) is None else _DOUBT


def _prices(v: Any) -> Any:
    if type(v) is not dict or any(k not in R.PRICE_KEYS for k in v):
        return _DOUBT
    return _fields(v, _PRICES, PlainPrices)


_PRICES: dict[str, tuple[Any, bool]] = {"input": (_price, True), "output": (_price, True), "cached": (_price, False)}
_WIDTH = _integer(1, R.MAX_CONCURRENCY)
_TIMEOUT = _integer(1, R.MAX_TIMEOUT_MS)

# field -> (check, required); `None` values are accepted for optional fields (as `X | None` is)
_LLM: dict[str, tuple[Any, bool]] = {
    "kind": (lambda v: v if v == "llm" else _DOUBT, True),
    "provider": (lambda v: _string(v, 1), False),
    "endpoint": (lambda v: v if type(v) is str and R.endpoint_problem(v) is None else _DOUBT, True),
    "model": (lambda v: v if type(v) is str and v.strip() else _DOUBT, True),
    "api_key": (lambda v: v if type(v) is str and R.env_ref_name(v) is not None else _DOUBT, False),
    "temperature": (_temperature, False),
    "max_tokens": (_integer(1), False),
    "context_length": (_integer(1), False),
    "supports_json_schema": (_boolean, False),
    "concurrency": (_WIDTH, False),
    "extra_params": (_extra_params, False),
    "timeout_ms": (_TIMEOUT, False),
    "enable_thinking": (_boolean, False),
    "prices": (_prices, False),
}
_AGENT: dict[str, tuple[Any, bool]] = {
    "kind": (lambda v: v if v == "agent" else _DOUBT, True),
    "platform": (lambda v: v if type(v) is str and v in R.AGENT_PLATFORMS else _DOUBT, True),
    "bin": (lambda v: _string(v, 1), False),
    "args": (_strings, False),
    "model": (lambda v: _string(v, 1), False),
    "llm_engine": (_string, False),
    "timeout_ms": (_TIMEOUT, False),
    "env_passthrough": (
        lambda v: v if _strings(v) is not _DOUBT and all(R.ENV_NAME_RE.match(x) for x in v) else _DOUBT,
        False,
    ),
    "model_aliases": (_aliases, False),
    "concurrency": (_WIDTH, False),
    "prices": (_prices, False),
}
_DEFAULTS = {"llm_engine": (_string, False), "agent_engine": (_string, False)}
_LIMITS = {"max_cost_per_day": (lambda v: v if (p := _price(v)) is not _DOUBT and p > 0 else _DOUBT, False)}
_TELEMETRY = {
    "enabled": (_boolean, False),
    "endpoint": (lambda v: v if R.telemetry_endpoint_problem(v) is None else _DOUBT, False),
    "protocol": (lambda v: v if v in R.TELEMETRY_PROTOCOLS else _DOUBT, False),
    "service_name": (lambda v: _string(v, 1), False),
    "resource_attributes": (
        lambda v: dict(v) if type(v) is dict and all(type(x) is str for x in v.values()) else _DOUBT,
        False,
    ),
}
_WORKFLOW = {
    "judge_engine": (_string, False),
    "max_concurrency": (_WIDTH, False),
    "default_map_concurrency": (_WIDTH, False),
}


def _fields(data: Any, spec: dict[str, tuple[Any, bool]], cls: type[_Record], forbidden: tuple[str, ...] = ()) -> Any:
    if type(data) is not dict or any(k in data for k in forbidden):
        return _DOUBT
    values: dict[str, Any] = {}
    given: set[str] = set()
    for name, (check, required) in spec.items():
        key = _camel(name)
        if key != name and name in data:
            return _DOUBT  # a field by its Python name: the models' rules for that are theirs to apply
        if key not in data:
            if required:
                return _DOUBT
            values[name] = None
            continue
        raw = data[key]
        value = None if raw is None and not required and name != "temperature" else check(raw)
        if value is _DOUBT:
            return _DOUBT
        values[name] = value
        given.add(name)
    return cls(values, given)


def plain_config(data: Any) -> PlainConfig | None:
    """Records for `data` (the merged config object) when it is certainly valid, else None."""
    if type(data) is not dict or any(k in data for k in R._RETIRED_TOP_LEVEL):
        return None
    if any(name in data for name in ("model_aliases",)):
        return None
    engines: dict[str, Any] = {}
    raw_engines = data.get("engines", {})
    if type(raw_engines) is not dict:
        return None
    for name, raw in raw_engines.items():
        kind = raw.get("kind") if type(raw) is dict else None
        if kind == "llm":
            engine = _fields(raw, _LLM, PlainLlmEngine, R._AGENT_ONLY_KEYS)
        elif kind == "agent":
            if raw.get("platform") == "opencode-sdk":
                return None
            engine = _fields(raw, _AGENT, PlainAgentEngine, R._LLM_ONLY_KEYS)
            if (
                engine is not _DOUBT
                and engine.llm_engine is not None
                and engine.platform not in R.PLATFORMS_WITH_LLM_ENGINE
            ):
                return None
        else:
            return None
        if engine is _DOUBT:
            return None
        engines[name] = engine
    raw_defaults = data.get("defaults", {})
    if type(raw_defaults) is dict and any(k in raw_defaults for k in R._RETIRED_DEFAULTS):
        return None
    defaults = _fields(raw_defaults, _DEFAULTS, PlainDefaults)
    workflow = _fields(data.get("workflow", {}), _WORKFLOW, PlainWorkflow)
    limits = _fields(data.get("limits", {}), _LIMITS, PlainLimits)
    raw_telemetry = data.get("telemetry")
    telemetry = (
        None
        if raw_telemetry is None
        else _DOUBT
        if type(raw_telemetry) is not dict or "headers" in raw_telemetry
        else _fields(raw_telemetry, _TELEMETRY, PlainTelemetry)
    )
    if limits is _DOUBT or telemetry is _DOUBT:
        return None
    raw_aliases = data.get("modelAliases", {})
    if defaults is _DOUBT or workflow is _DOUBT or type(raw_aliases) is not dict or not _no_case_twins(raw_aliases):
        return None
    aliases: dict[str, dict[str, str]] = {}
    for column, table in raw_aliases.items():
        checked = _aliases(table)
        if checked is _DOUBT:
            return None
        aliases[column] = checked
    given = {
        n
        for n, k in (
            ("engines", "engines"),
            ("defaults", "defaults"),
            ("workflow", "workflow"),
            ("model_aliases", "modelAliases"),
            ("limits", "limits"),
            ("telemetry", "telemetry"),
        )
        if k in data
    }
    return PlainConfig(
        {
            "engines": engines,
            "defaults": defaults,
            "workflow": workflow,
            "model_aliases": aliases,
            "limits": limits,
            "telemetry": telemetry,
        },
        given,
    )
