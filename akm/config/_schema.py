"""The config schema: the pydantic models (built on first use) and the validation that words every problem.

Why pydantic is imported only inside `_build_models`: building the models costs a run ~100 ms, and a valid
config never needs them (`akm.config.plain` accepts it first). Validation yields `Issue`s, each naming a
file and a dotted key path, so `raise_issues` can report every bad key of every file in one `ConfigError`.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from akm.config._rules import (
    _AGENT_ONLY_KEYS,
    _LLM_ONLY_KEYS,
    _RETIRED_DEFAULTS,
    _RETIRED_TOP_LEVEL,
    AGENT_PLATFORMS,
    ENGINE_NAME_MAX,
    ENGINE_NAME_RE,
    ENV_NAME_RE,
    MAX_CONCURRENCY,
    MAX_TIMEOUT_MS,
    PLATFORMS_WITH_LLM_ENGINE,
    PRICE_KEYS,
    RESERVED_ENGINE_NAMES,
    SESSION_JUDGE,
    _norm_key,
    endpoint_problem,
    env_ref_name,
    price_problem,
    telemetry_endpoint_problem,
)
from akm.errors import ConfigError
from akm.record import dataclass

# --------------------------------------------------------------------------- models


def _models():
    """The pydantic models, built on first use (pydantic costs start-up time the CLI rarely needs)."""
    global _MODELS
    if _MODELS is None:
        _MODELS = _build_models()
    return _MODELS


_MODELS: Any = None


def _build_models():  # noqa: C901 - one place that states the whole schema
    from typing import Annotated, Union

    from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
    from pydantic.alias_generators import to_camel

    from akm.format.grammar import CREDENTIAL_KEYS, PROTECTED_LLM_KEYS

    class ConfigModel(BaseModel):
        """camelCase keys; unknown keys kept (round-trip), known keys strict."""

        model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", strict=True)

        def declared(self, name: str) -> bool:
            """Was this key present in the file? (`null` and absent differ for timeouts.)"""
            return name in self.model_fields_set

    PositiveInt = Annotated[int, Field(ge=1)]
    Width = Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]
    TimeoutMs = Annotated[int, Field(ge=1, le=MAX_TIMEOUT_MS)]
    NonEmpty = Annotated[str, Field(min_length=1)]

    def _forbid(data: Any, keys: tuple[str, ...], kind: str) -> Any:
        if isinstance(data, dict):
            for k in keys:
                if k in data:
                    raise ValueError(f"{k} is not valid on an {kind} engine")
        return data

    def _check_env_names(values: list[str] | None) -> list[str] | None:
        for v in values or []:
            if not ENV_NAME_RE.match(v):
                raise ValueError(f"{v!r} is not an environment variable name")
        return values

    def _check_aliases(value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        seen: dict[str, str] = {}
        for k in value:
            low = k.lower()
            if low in seen:
                raise ValueError(f"aliases {seen[low]!r} and {k!r} differ only in case")
            seen[low] = k
        return value

    def _price(v: Any) -> Any:
        problem = price_problem(v)
        if problem:
            raise ValueError(problem)
        return float(v)

    Money = Annotated[Any, BeforeValidator(_price)]

    class Prices(ConfigModel):
        """USD per million tokens: what a unit of this engine costs (budget.max_cost, limits, status)."""

        input: Money
        output: Money
        cached: Money | None = None

        @model_validator(mode="before")
        @classmethod
        def _known(cls, data: Any) -> Any:
            if isinstance(data, dict):
                for k in data:
                    if k not in PRICE_KEYS:
                        raise ValueError(f"{k!r} is not a price; a price is one of {', '.join(PRICE_KEYS)}")
            return data

    class LlmEngine(ConfigModel):
        kind: Literal["llm"]
        prices: Prices | None = None
        provider: NonEmpty | None = None
        endpoint: str
        model: str
        api_key: str | None = None
        temperature: float | None = None
        max_tokens: PositiveInt | None = None
        context_length: PositiveInt | None = None
        supports_json_schema: bool | None = None
        concurrency: Width | None = None
        extra_params: dict[str, Any] | None = None
        timeout_ms: TimeoutMs | None = None
        enable_thinking: bool | None = None

        @model_validator(mode="before")
        @classmethod
        def _no_agent_keys(cls, data: Any) -> Any:
            return _forbid(data, _AGENT_ONLY_KEYS, "LLM")

        @field_validator("temperature", mode="before")
        @classmethod
        def _number(cls, v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
                raise ValueError("must be a finite number")
            return float(v)

        @field_validator("endpoint")
        @classmethod
        def _endpoint(cls, v: str) -> str:
            problem = endpoint_problem(v)
            if problem:
                raise ValueError(problem)
            return v

        @field_validator("model")
        @classmethod
        def _model(cls, v: str) -> str:
            if not v.strip():
                raise ValueError("must be a model name, not blank")
            return v

        @field_validator("api_key")
        @classmethod
        def _api_key(cls, v: str | None) -> str | None:
            if v is not None and env_ref_name(v) is None:
                raise ValueError(
                    "must be a reference to an environment variable, ${NAME}; a key value never goes in a config file"
                )
            return v

        @field_validator("extra_params")
        @classmethod
        def _extra_params(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
            if v is None:
                return v
            for k in v:
                if _norm_key(k) in PROTECTED_LLM_KEYS:
                    raise ValueError(f"{k} is protected by AKM: akm sets it for every request")

            def walk(node: Any, where: str) -> None:
                if isinstance(node, dict):
                    for k, sub in node.items():
                        if isinstance(k, str) and _norm_key(k) in CREDENTIAL_KEYS:
                            raise ValueError(f"{where}{k} cannot carry credentials; use apiKey: ${{NAME}}")
                        walk(sub, f"{where}{k}.")
                elif isinstance(node, list):
                    for i, sub in enumerate(node):
                        walk(sub, f"{where}{i}.")

            walk(v, "")
            return v

    class AgentEngine(ConfigModel):
        kind: Literal["agent"]
        prices: Prices | None = None
        platform: Literal[AGENT_PLATFORMS]  # type: ignore[valid-type]
        bin: NonEmpty | None = None
        args: list[str] | None = None
        model: NonEmpty | None = None
        llm_engine: str | None = None
        timeout_ms: TimeoutMs | None = None
        env_passthrough: list[str] | None = None
        model_aliases: dict[str, NonEmpty] | None = None
        concurrency: Width | None = None

        @model_validator(mode="before")
        @classmethod
        def _no_llm_keys(cls, data: Any) -> Any:
            if isinstance(data, dict) and data.get("platform") == "opencode-sdk":
                raise ValueError(
                    "platform opencode-sdk is not supported; use platform opencode "
                    "(with llmEngine to run it on an LLM engine's endpoint)"
                )
            return _forbid(data, _LLM_ONLY_KEYS, "agent")

        @field_validator("env_passthrough")
        @classmethod
        def _env(cls, v: list[str] | None) -> list[str] | None:
            return _check_env_names(v)

        @field_validator("model_aliases")
        @classmethod
        def _aliases(cls, v: dict[str, str] | None) -> dict[str, str] | None:
            return _check_aliases(v)

        @model_validator(mode="after")
        def _llm_engine_platform(self) -> "AgentEngine":
            if self.llm_engine is not None and self.platform not in PLATFORMS_WITH_LLM_ENGINE:
                raise ValueError(
                    f"llmEngine is not supported on platform {self.platform} "
                    f"(only {', '.join(PLATFORMS_WITH_LLM_ENGINE)})"
                )
            return self

    Engine = Annotated[Union[LlmEngine, AgentEngine], Field(discriminator="kind")]

    class Defaults(ConfigModel):
        llm_engine: str | None = None
        agent_engine: str | None = None

        @model_validator(mode="before")
        @classmethod
        def _retired(cls, data: Any) -> Any:
            if isinstance(data, dict):
                for k, hint in _RETIRED_DEFAULTS.items():
                    if k in data:
                        raise ValueError(f"defaults.{k} is not a key of this akm ({hint})")
            return data

    class WorkflowSettings(ConfigModel):
        judge_engine: str | None = None
        max_concurrency: Width | None = None
        default_map_concurrency: Width | None = None

    class Limits(ConfigModel):
        """Ceilings across runs: `maxCostPerDay` USD for all of a project's runs together, per UTC day."""

        max_cost_per_day: Money | None = None

        @field_validator("max_cost_per_day")
        @classmethod
        def _positive(cls, v: float | None) -> float | None:
            if v is not None and v <= 0:
                raise ValueError("must be above 0 (leave it out for no daily limit)")
            return v

    class Telemetry(ConfigModel):
        """Where traces go (OTLP/HTTP); the standard OTEL_* variables say the same and win."""

        enabled: bool | None = None
        endpoint: str | None = None
        protocol: Literal["http/protobuf"] | None = None
        service_name: NonEmpty | None = None
        resource_attributes: dict[str, str] | None = None

        @model_validator(mode="before")
        @classmethod
        def _no_headers(cls, data: Any) -> Any:
            if isinstance(data, dict) and "headers" in data:
                raise ValueError(
                    "headers may carry credentials and a config file holds none: set OTEL_EXPORTER_OTLP_HEADERS "
                    "in the environment instead"
                )
            return data

        @field_validator("endpoint")
        @classmethod
        def _endpoint(cls, v: str | None) -> str | None:
            problem = telemetry_endpoint_problem(v) if v is not None else None
            if problem:
                raise ValueError(problem)
            return v

    class Config(ConfigModel):
        engines: dict[str, Engine] = Field(default_factory=dict)
        defaults: Defaults = Field(default_factory=Defaults)
        workflow: WorkflowSettings = Field(default_factory=WorkflowSettings)
        model_aliases: dict[str, dict[str, NonEmpty]] = Field(default_factory=dict)
        limits: Limits = Field(default_factory=Limits)
        telemetry: Telemetry | None = None

        @model_validator(mode="before")
        @classmethod
        def _retired(cls, data: Any) -> Any:
            if isinstance(data, dict):
                for k, hint in _RETIRED_TOP_LEVEL.items():
                    if k in data:
                        raise ValueError(f"top-level key {k!r} is not supported: {hint}")
            return data

        @field_validator("model_aliases")
        @classmethod
        def _aliases(cls, v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
            return _check_aliases(v) or {}

        def engine(self, name: str | None):
            return self.engines.get(name) if name else None

    return {
        "Config": Config,
        "LlmEngine": LlmEngine,
        "AgentEngine": AgentEngine,
        "Defaults": Defaults,
        "WorkflowSettings": WorkflowSettings,
        "Limits": Limits,
        "Telemetry": Telemetry,
    }


# --------------------------------------------------------------------------- validation


@dataclass
class Issue:
    """One problem: the file it is in, the dotted key path, what is wrong."""

    file: str
    path: str
    message: str


def _loc_path(loc: tuple[Any, ...], data: Any) -> str:
    """A pydantic error location as a dotted key path (union tags dropped)."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(node, dict) and item in node:
            parts.append(str(item))
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            parts.append(str(item))
            node = node[item]
        elif item in ("llm", "agent") or (isinstance(item, str) and item.startswith("function-")):
            continue  # a discriminated-union tag, not a key of the file
        else:
            parts.append(str(item))
            node = None
    return ".".join(parts) or "(root)"


def _issues_from(exc: Any, data: Any, file: str) -> list[Issue]:
    out: list[Issue] = []
    for err in exc.errors(include_url=False):
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err.get("type") == "missing":
            msg = "is required"
        elif err.get("type") == "union_tag_invalid":
            msg = "kind must be llm or agent"
        elif err.get("type") == "union_tag_not_found":
            msg = "needs a kind: llm or agent"
        out.append(Issue(file, _loc_path(tuple(err.get("loc", ())), data), msg))
    return out


def _structural(data: dict[str, Any], file: str) -> tuple[Any, list[Issue]]:
    issues: list[Issue] = []
    for name in (data.get("engines") or {}) if isinstance(data.get("engines"), dict) else {}:
        if not isinstance(name, str) or len(name) > ENGINE_NAME_MAX or not ENGINE_NAME_RE.match(name):
            issues.append(
                Issue(
                    file,
                    f"engines.{name}",
                    "engine names are lower-case words of letters and digits "
                    f"joined by '-', at most {ENGINE_NAME_MAX} characters, not starting with akm-",
                )
            )
        elif name in RESERVED_ENGINE_NAMES:
            issues.append(
                Issue(
                    file,
                    f"engines.{name}",
                    f"{name!r} is reserved (workflow.judgeEngine: session means the calling agent judges)",
                )
            )
    if not issues:
        from akm.config.plain import plain_config

        plain = plain_config(data)  # a valid config needs no pydantic (see akm.config.plain)
        if plain is not None:
            return plain, issues
    from pydantic import ValidationError

    Config = _models()["Config"]
    try:
        model = Config.model_validate(data)
    except ValidationError as exc:
        return None, issues + _issues_from(exc, data, file)
    return model, issues


def _cross_field(cfg: Any, where: Callable[[str], str]) -> list[Issue]:
    """Rules that need the whole (merged) config: names must point at the right kind of engine."""
    issues: list[Issue] = []

    def check(path: str, name: str | None, kinds: tuple[str, ...], extra_ok: tuple[str, ...] = ()) -> None:
        if name is None or name in extra_ok:
            return
        engine = cfg.engines.get(name)
        if engine is None:
            known = ", ".join(sorted(cfg.engines)) or "none configured"
            issues.append(
                Issue(where(path), path, f"names engine {name!r}, which is not configured (engines: {known})")
            )
        elif engine.kind not in kinds:
            issues.append(
                Issue(
                    where(path),
                    path,
                    f"names engine {name!r}, which is a {engine.kind} engine; it must be {' or '.join(kinds)}",
                )
            )

    check("defaults.llmEngine", cfg.defaults.llm_engine, ("llm",))
    check("defaults.agentEngine", cfg.defaults.agent_engine, ("agent",))
    check("workflow.judgeEngine", cfg.workflow.judge_engine, ("llm", "agent"), (SESSION_JUDGE,))
    for name, engine in cfg.engines.items():
        if engine.kind == "agent" and engine.llm_engine is not None:
            check(f"engines.{name}.llmEngine", engine.llm_engine, ("llm",))
    return issues


def raise_issues(issues: list[Issue], *, action: str = "Invalid config") -> None:
    if not issues:
        return
    files = list(dict.fromkeys(i.file for i in issues))
    lines = [f"  {i.path}: {i.message}" + (f"  ({i.file})" if len(files) > 1 else "") for i in issues]
    first = issues[0]
    from akm.codes import Code

    raise ConfigError(
        f"{action} in {' and '.join(files)}:\n" + "\n".join(lines),
        code=Code.INVALID_CONFIG_FILE,
        hint="Fix the keys named above; comments (// and /* */) are allowed, trailing commas are not.",
        details={
            "file": first.file,
            "path": first.path,
            "issues": [{"file": i.file, "path": i.path, "message": i.message} for i in issues],
        },
    )
