"""Engine configuration: where it lives, what it may say, how it is read and written.

One user file (`<config dir>/config.json`, see `akm.paths.config_dir`) deep-merged
under an optional project file (`<project root>/.akm/config.json`): objects merge
key by key, arrays and scalars replace, the project wins (DECISIONS D14). Both are
JSON with `//` and `/* */` comments allowed.

Why the shape is strict where it is:

* Secrets never sit in a config file. An LLM engine's `apiKey` is only ever a
  reference, `${NAME}` (or `$NAME`), resolved from the environment at dispatch
  time; a literal key is a validation error, and `extraParams` may not carry
  credential-named keys either.
* A bad file is ONE `ConfigError` (exit 78) that names the file and every bad key
  path, so a user fixes everything in one go instead of one error per run.
* Unknown keys are kept and written back (a newer akm's config must survive an
  older akm's `config set`); known keys are type-checked strictly.
* Reading is cheap when there is nothing to read: with no file at all, no model
  is built (exec-only runs on a fresh machine pay for a `stat` or two).

Writing goes through `update_config_file`: an exclusive lock, re-read and
re-validate inside the lock, apply the mutation, validate the result merged with
the other layer, back the old file up, then an atomic replace with mode 0600.

Helpers for `akm setup` (engine fingerprints, unique names, upserts) live here
too, so every writer follows the same rules.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Literal, Mapping
from urllib.parse import urlsplit

from akm.errors import ConfigError
from akm.format.grammar import CONFIG_ENGINE_NAME_RE, ENV_VAR_RE, ENV_VAR_REF_RE
from akm.record import dataclass

CONFIG_FILE_NAME = "config.json"
PROJECT_CONFIG_RELPATH = Path(".akm") / CONFIG_FILE_NAME
MAX_CONFIG_BYTES = 1024 * 1024
BACKUPS_KEPT = 5
LOCK_TIMEOUT_S = 5.0
MAX_TIMEOUT_MS = 2_147_483_647
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


# --------------------------------------------------------------------------- plain-dict helpers


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`: objects merge recursively, everything else replaces.

    Inputs are never mutated. A key cannot be deleted by merging (absent = keep);
    `null` is a real value and replaces.
    """
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def env_ref_name(value: Any) -> str | None:
    """`NAME` for a `${NAME}` / `$NAME` reference, else None."""
    if not isinstance(value, str):
        return None
    m = _ENV_REF_RE.match(value)
    return (m.group(1) or m.group(2)) if m else None


def engine_env_key_name(engine_name: str) -> str:
    """`AKM_ENGINE_<NAME>_API_KEY` (upper-cased, `-` → `_`): an engine's conventional key variable."""
    return f"AKM_ENGINE_{engine_name.upper().replace('-', '_')}_API_KEY"


def strip_jsonc(text: str) -> str:
    """Remove `//` and `/* */` comments outside string literals (escape-aware).

    Newlines inside comments are kept so JSON error positions still point at the
    right line. Trailing commas stay an error (the JSON parser reports them).
    """
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string = True
            out.append(ch)
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end == -1 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            chunk = text[i:] if end == -1 else text[i : end + 2]
            out.append("\n" * chunk.count("\n"))
            i = n if end == -1 else end + 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


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

    from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
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

    class LlmEngine(ConfigModel):
        kind: Literal["llm"]
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

    class Config(ConfigModel):
        engines: dict[str, Engine] = Field(default_factory=dict)
        defaults: Defaults = Field(default_factory=Defaults)
        workflow: WorkflowSettings = Field(default_factory=WorkflowSettings)
        model_aliases: dict[str, dict[str, NonEmpty]] = Field(default_factory=dict)

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
    }


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
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be an http:// or https:// URL ending in /chat/completions"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user name or password (use apiKey: ${NAME})"
    if parts.query or parts.fragment or "?" in endpoint or "#" in endpoint:
        return "must not have a query or fragment"
    if not parts.path.rstrip("/").endswith("/chat/completions") or parts.path.endswith("/"):
        return "must end with /chat/completions (for example http://127.0.0.1:11434/v1/chat/completions)"
    return None


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
    raise ConfigError(
        f"{action} in {' and '.join(files)}:\n" + "\n".join(lines),
        code="INVALID_CONFIG_FILE",
        hint="Fix the keys named above; comments (// and /* */) are allowed, trailing commas are not.",
        details={
            "file": first.file,
            "path": first.path,
            "issues": [{"file": i.file, "path": i.path, "message": i.message} for i in issues],
        },
    )


# --------------------------------------------------------------------------- files


def user_config_path() -> Path:
    from akm import paths

    return paths.config_dir() / CONFIG_FILE_NAME


def project_config_path(cwd: str | os.PathLike[str] | None = None) -> Path:
    from akm import paths

    return paths.project_root(cwd) / PROJECT_CONFIG_RELPATH


def read_config_file(path: Path) -> dict[str, Any] | None:
    """The file's JSON object (comments stripped), or None when there is no file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ConfigError(
            f"Config file {path} is a directory.", code="INVALID_CONFIG_FILE", details={"file": str(path)}
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"Cannot read config file {path}: {exc.strerror}.", code="INVALID_CONFIG_FILE", details={"file": str(path)}
        ) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"Config file {path} is larger than {MAX_CONFIG_BYTES} bytes.",
            code="INVALID_CONFIG_FILE",
            details={"file": str(path)},
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"Config file {path} is not UTF-8 text (byte {exc.start}).",
            code="INVALID_CONFIG_FILE",
            details={"file": str(path)},
        ) from None
    if not text.strip():
        return {}
    try:
        data = json.loads(strip_jsonc(text))
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        raise ConfigError(
            f"Config file {path}{f' line {line}' if line else ''} is not valid JSON: {getattr(exc, 'msg', str(exc))}.",
            code="INVALID_CONFIG_FILE",
            hint="Comments (// and /* */) are allowed; trailing commas are not.",
            details={"file": str(path), "line": line},
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {path} must hold a JSON object at the top, not {type(data).__name__}.",
            code="INVALID_CONFIG_FILE",
            details={"file": str(path)},
        )
    return data


@dataclass
class LoadedConfig:
    """The effective configuration and where each part came from.

    `config` is the validated model of `merged` (user file under project file).
    `user` / `project` are the raw objects as read (None = no such file).
    """

    config: Any
    merged: dict[str, Any]
    user_path: Path
    project_path: Path
    user: dict[str, Any] | None = None
    project: dict[str, Any] | None = None

    @property
    def files(self) -> list[Path]:
        return [p for p, d in ((self.user_path, self.user), (self.project_path, self.project)) if d is not None]

    def source_of(self, dotted: str) -> str:
        """The file that sets `dotted` (the project file wins), for error messages.

        When neither file holds the full path (a required key is missing), the
        file holding its nearest parent is named.
        """
        keys = dotted.split(".")
        while keys:
            for path, data in ((self.project_path, self.project), (self.user_path, self.user)):
                node: Any = data
                for k in keys:
                    if not isinstance(node, dict) or k not in node:
                        break
                    node = node[k]
                else:
                    return str(path)
            keys = keys[:-1]
        return str(self.project_path if self.project is not None and self.user is None else self.user_path)


def _validate_layers(
    user_path: Path,
    user: dict[str, Any] | None,
    project_path: Path,
    project: dict[str, Any] | None,
    *,
    action: str = "Invalid config",
) -> LoadedConfig:
    """Validate the merged layers; each issue names the file that sets the offending key.

    Layers are not validated alone: a project file may override one key of an
    engine the user file defines.
    """
    merged = deep_merge(user or {}, project or {})
    model, issues = _structural(merged, "")
    loaded = LoadedConfig(
        config=model, merged=merged, user_path=user_path, project_path=project_path, user=user, project=project
    )
    for issue in issues:
        issue.file = loaded.source_of(issue.path)
    raise_issues(issues, action=action)
    raise_issues(_cross_field(model, loaded.source_of), action=action)
    return loaded


def check_layers(
    user: dict[str, Any] | None,
    project: dict[str, Any] | None,
    *,
    cwd: str | os.PathLike[str] | None = None,
    action: str = "Invalid config",
) -> LoadedConfig:
    """Validate a user and a project object as if they were on disk (ConfigError naming each bad key)."""
    return _validate_layers(user_config_path(), user, project_config_path(cwd), project, action=action)


_CACHE: dict[tuple[Any, ...], LoadedConfig] = {}


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def load_config(cwd: str | os.PathLike[str] | None = None) -> LoadedConfig:
    """The effective config for a command run in `cwd` (validated; raises ConfigError).

    Cached on the files' (mtime, size) so a long-lived MCP server re-reads only
    what changed. With no file at all an empty config is returned.
    """
    user_path, project_path = user_config_path(), project_config_path(cwd)
    key = (str(user_path), _stamp(user_path), str(project_path), _stamp(project_path))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    user, project = read_config_file(user_path), read_config_file(project_path)
    loaded = _validate_layers(user_path, user, project_path, project)
    if len(_CACHE) > 16:
        _CACHE.clear()
    _CACHE[key] = loaded
    return loaded


def config_files_exist(cwd: str | os.PathLike[str] | None = None) -> bool:
    """Cheap: is there any config file to read? (Two `stat`s, no parsing, no pydantic.)"""
    return user_config_path().is_file() or project_config_path(cwd).is_file()


def load_config_if_any(cwd: str | os.PathLike[str] | None = None) -> LoadedConfig | None:
    """`load_config`, or None when no config file exists (the exec-only fast path)."""
    if not config_files_exist(cwd):
        return None
    return load_config(cwd)


# --------------------------------------------------------------------------- writing


class _FileLock:
    """An exclusive advisory lock on `<file>.lock` (released by the OS if we die)."""

    def __init__(self, path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.fd: int | None = None

    def __enter__(self) -> "_FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                _lock_fd(self.fd)
                return self
            except OSError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise ConfigError(
                        f"Could not lock {self.path} within {self.timeout_s:.0f} s: another process may be "
                        "updating the config.",
                        code="CONFIG_LOCKED",
                        details={"file": str(self.path)},
                    ) from None
                time.sleep(0.05)

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            try:
                _unlock_fd(self.fd)
            finally:
                os.close(self.fd)
                self.fd = None


def _lock_fd(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        return
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _unlock_fd(fd: int) -> None:
    try:
        import fcntl
    except ImportError:
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        return
    fcntl.flock(fd, fcntl.LOCK_UN)


def _backup(path: Path) -> None:
    """Copy the current file into `<dir>/config-backups/` (0700/0600), keeping the newest few."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    folder = path.parent / "config-backups"
    folder.mkdir(mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime()) + f"-{time.time_ns() % 1_000_000_000:09d}"
    stem = path.stem if path.name == CONFIG_FILE_NAME else path.name.replace(".", "-")
    target = folder / f"{stem}-{stamp}.json"
    _write_private(target, data)
    backups = sorted(folder.glob(f"{stem}-*.json"))
    for old in backups[:-BACKUPS_KEPT]:
        try:
            old.unlink()
        except OSError:
            pass


def _write_private(path: Path, data: bytes) -> None:
    """Atomic write with mode 0600: temp file in the same dir, fsync, rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def render_config(data: Mapping[str, Any]) -> str:
    """The on-disk form: 2-space JSON, non-ASCII kept, trailing newline."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def update_config_file(
    mutate: Callable[[dict[str, Any]], dict[str, Any] | None],
    *,
    project: bool = False,
    cwd: str | os.PathLike[str] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Apply `mutate` to the user (or project) file under the write lock; returns (new data, written).

    `mutate` gets a deep copy of the file's current object (`{}` when absent) and
    returns the new object (or None to keep the one it was given, mutated in place).
    The result, merged with the other layer, must validate or nothing is written
    (ConfigError "Refusing to save invalid config"). An unchanged object writes
    nothing (no backup, no new mtime), so re-running the same command is idempotent.
    """
    user_path, project_path = user_config_path(), project_config_path(cwd)
    target = project_path if project else user_path
    with _FileLock(target.with_name(target.name + ".lock")):
        current = read_config_file(target)
        other = read_config_file(user_path if project else project_path)
        base = copy.deepcopy(current) if current is not None else {}
        new = mutate(copy.deepcopy(base))
        if new is None:
            new = base
        if current is not None and new == current:
            return new, False
        if current is None and not new:
            return new, False
        layers = (other, new) if project else (new, other)
        _validate_layers(user_path, layers[0], project_path, layers[1], action="Refusing to save invalid config")
        if current is not None:
            _backup(target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_private(target, render_config(new).encode("utf-8"))
    _CACHE.clear()
    return new, True


# --------------------------------------------------------------------------- helpers for setup and writers


def normalize_chat_endpoint(endpoint: str) -> str:
    """The chat-completions URL for a base URL a user or a harness gave (spec-setup §4.7).

    Trailing slashes go; a path not ending in `/chat/completions` gets `/v1`
    (unless it already ends in `/v1` or contains `/openai`) and then
    `/chat/completions`. Scheme and host are lower-cased. Raises ValueError
    (with a message fit for a user) for what cannot be an endpoint: not http(s),
    a user name or password, a query or a fragment.

        http://localhost:11434                → http://localhost:11434/v1/chat/completions
        https://api.groq.com/openai/v1        → https://api.groq.com/openai/v1/chat/completions
        https://host/v1beta/openai            → https://host/v1beta/openai/chat/completions
        http://h:1234/v1/chat/completions/    → http://h:1234/v1/chat/completions
        https://h:443/v1                      → https://h/v1/chat/completions
    """
    from urllib.parse import urlunsplit

    text = str(endpoint or "").strip()
    if not text:
        raise ValueError("no endpoint URL given")
    parts = urlsplit(text)  # raises ValueError for malformed ports / brackets
    parts.port  # noqa: B018 - validates the port (raises ValueError)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL must not carry a user name or password (keys go in an environment variable)")
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError("the URL must not have a query or fragment")
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        if not (path.endswith("/v1") or "/openai" in path):
            path += "/v1"
        path += "/chat/completions"
    scheme, netloc = parts.scheme.lower(), parts.netloc.lower()
    if netloc.endswith(":") or parts.port == {"http": 80, "https": 443}[scheme]:
        netloc = netloc.rsplit(":", 1)[0]  # as a WHATWG URL serializes: no empty or default port
    return urlunsplit((scheme, netloc, path, "", "")).rstrip("/")


def engine_fingerprint(engine: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes two engine entries "the same engine" (for upserts that must not duplicate).

    LLM: the normalised endpoint (one server is one engine, whatever model a
    user tuned it to); agent: the platform (and the LLM engine it runs on, if
    any) — a user's `reviewer` engine on claude counts as "the claude engine".
    """
    if engine.get("kind") == "llm":
        raw = str(engine.get("endpoint") or "")
        try:
            endpoint = normalize_chat_endpoint(raw)
        except ValueError:
            endpoint = raw.strip().rstrip("/").lower()
        # setup probes 127.0.0.1; a user's `localhost` engine on the same port is the same server
        endpoint = re.sub(r"^(https?://)localhost(?=[:/]|$)", r"\g<1>127.0.0.1", endpoint)
        return ("llm", endpoint)
    return ("agent", str(engine.get("platform") or ""), str(engine.get("llmEngine") or ""))


def find_engine(engines: Mapping[str, Mapping[str, Any]], engine: Mapping[str, Any]) -> str | None:
    """Name of an existing engine with the same fingerprint (alphabetically first), else None."""
    fp = engine_fingerprint(engine)
    for name in sorted(engines):
        if isinstance(engines[name], Mapping) and engine_fingerprint(engines[name]) == fp:
            return name
    return None


def slug_engine_name(text: str) -> str:
    """A valid engine name derived from free text (`"LM Studio"` → `lm-studio`).

    Text that does not start with a letter gives `local` (spec-setup §4.8: a
    provider id like `302ai` names a local engine, not an `ai` one).
    """
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    while slug.startswith("akm-"):
        slug = slug[4:]
    if not slug[:1].isalpha():
        return "local"
    slug = slug[:ENGINE_NAME_MAX].rstrip("-")
    return "engine" if slug in RESERVED_ENGINE_NAMES else slug


def unique_engine_name(engines: Mapping[str, Any], base: str) -> str:
    """`base`, or `base-2`, `base-3`, … — the first name not taken."""
    base = slug_engine_name(base)
    if base not in engines:
        return base
    n = 2
    while True:
        suffix = f"-{n}"
        candidate = base[: ENGINE_NAME_MAX - len(suffix)].rstrip("-") + suffix
        if candidate not in engines:
            return candidate
        n += 1


def upsert_engine(data: dict[str, Any], engine: Mapping[str, Any], *, name_hint: str) -> tuple[str, bool]:
    """Add `engine` to `data["engines"]` unless an engine with the same fingerprint exists.

    Never retunes an existing entry. Returns (name, added). Mutates `data`.
    """
    engines = data.setdefault("engines", {})
    existing = find_engine(engines, engine)
    if existing is not None:
        return existing, False
    name = unique_engine_name(engines, name_hint)
    engines[name] = dict(engine)
    return name, True


def set_default_if_unset(data: dict[str, Any], key: Literal["llmEngine", "agentEngine"], name: str) -> bool:
    """Set `defaults.<key>` when it is not set yet. Mutates `data`; returns whether it changed."""
    defaults = data.setdefault("defaults", {})
    if defaults.get(key):
        return False
    defaults[key] = name
    return True
