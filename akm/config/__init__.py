"""Engine configuration: where it lives, what it may say, how it is read and written.

One user file (`<config dir>/config.json`, see `akm.paths.config_dir`) deep-merged
under an optional project file (`<project root>/.akm/config.json`): objects merge
key by key, arrays and scalars replace, the project wins (spec/decisions.md D14). Both are
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

The package: this module loads, merges and caches; `_rules` states what a config
may say (shared with the pydantic-free `plain` fast path); `_schema` holds the
pydantic models and the validation that words each problem; `_files` reads,
locks, backs up and writes the files. Every name other modules use is
re-exported here: import from `akm.config`, not from its private modules.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Callable, Literal, Mapping
from urllib.parse import urlsplit

from akm.config._files import (
    BACKUPS_KEPT,
    CONFIG_FILE_NAME,
    LOCK_TIMEOUT_S,
    MAX_CONFIG_BYTES,
    read_config_file,
    render_config,
    strip_jsonc,
    write_locked,
)
from akm.config._rules import (
    AGENT_PLATFORMS,
    ENGINE_NAME_MAX,
    ENGINE_NAME_RE,
    ENV_NAME_RE,
    MAX_CONCURRENCY,
    MAX_TIMEOUT_MS,
    PLATFORMS_WITH_LLM_ENGINE,
    RESERVED_ENGINE_NAMES,
    SESSION_JUDGE,
    endpoint_problem,
    env_ref_name,
)
from akm.config._schema import (
    Issue,
    _cross_field,
    _structural,
    raise_issues,
)
from akm.config._schema import (
    _models as _models,  # the pydantic models, for tests that compare them with the fast path
)
from akm.record import dataclass

PROJECT_CONFIG_RELPATH = Path(".akm") / CONFIG_FILE_NAME

__all__ = [
    "AGENT_PLATFORMS",
    "BACKUPS_KEPT",
    "CONFIG_FILE_NAME",
    "ENGINE_NAME_MAX",
    "ENGINE_NAME_RE",
    "ENV_NAME_RE",
    "Issue",
    "LOCK_TIMEOUT_S",
    "LoadedConfig",
    "MAX_CONCURRENCY",
    "MAX_CONFIG_BYTES",
    "MAX_TIMEOUT_MS",
    "PLATFORMS_WITH_LLM_ENGINE",
    "PROJECT_CONFIG_RELPATH",
    "RESERVED_ENGINE_NAMES",
    "SESSION_JUDGE",
    "check_layers",
    "config_files_exist",
    "deep_merge",
    "endpoint_problem",
    "engine_env_key_name",
    "engine_fingerprint",
    "env_ref_name",
    "find_engine",
    "load_config",
    "load_config_if_any",
    "normalize_chat_endpoint",
    "project_config_path",
    "raise_issues",
    "read_config_file",
    "render_config",
    "set_default_if_unset",
    "slug_engine_name",
    "strip_jsonc",
    "unique_engine_name",
    "update_config_file",
    "upsert_engine",
    "user_config_path",
]


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


def engine_env_key_name(engine_name: str) -> str:
    """`AKM_ENGINE_<NAME>_API_KEY` (upper-cased, `-` → `_`): an engine's conventional key variable."""
    return f"AKM_ENGINE_{engine_name.upper().replace('-', '_')}_API_KEY"


# --------------------------------------------------------------------------- files


def user_config_path() -> Path:
    from akm import paths

    return paths.config_dir() / CONFIG_FILE_NAME


def project_config_path(cwd: str | os.PathLike[str] | None = None) -> Path:
    from akm import paths

    return paths.project_root(cwd) / PROJECT_CONFIG_RELPATH


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
    target, other = (project_path, user_path) if project else (user_path, project_path)

    def check(new: dict[str, Any], other_data: dict[str, Any] | None) -> None:
        layers = (other_data, new) if project else (new, other_data)
        _validate_layers(user_path, layers[0], project_path, layers[1], action="Refusing to save invalid config")

    new, written = write_locked(target, other, mutate, check)
    if written:
        _CACHE.clear()
    return new, written


# --------------------------------------------------------------------------- helpers for setup and writers


def _chat_completions_path(path: str) -> str:
    """A base URL's path made the chat-completions one: `/v1` added unless it ends in `/v1` or names `/openai`."""
    path = path.rstrip("/")
    if not path.endswith("/chat/completions"):
        if not (path.endswith("/v1") or "/openai" in path):
            path += "/v1"
        path += "/chat/completions"
    return path


def normalize_chat_endpoint(endpoint: str) -> str:
    """The chat-completions URL for a base URL a user or a harness gave (spec/setup.md).

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
    path = _chat_completions_path(parts.path)
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

    Text that does not start with a letter gives `local` (spec/setup.md: a
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
