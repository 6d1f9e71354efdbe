"""What this machine offers: model servers, agent CLIs, harness configs, API-key variables.

Everything here is read-only and quick. Network probes run in parallel with a
short timeout each, so a port that accepts connections but never answers
costs at most `PROBE_TIMEOUT_S` once, not once per question asked of it.

Secrets: only environment variable NAMES are ever recorded. Harness config
files are read for a model, a base URL and the NAME of the variable holding
their key; a key written literally in such a file is noted ("not imported")
and dropped on the spot. A key value is read from the environment only to
send it as a Bearer header to a server a harness config names.

Where akm looks for servers, in this order (duplicates dropped):

1. `AKM_SETUP_PROBE_URLS` (comma-separated base URLs) when set, else
   http://127.0.0.1:11434 (Ollama), http://127.0.0.1:1234 (LM Studio),
   http://127.0.0.1:8080 (llama.cpp, vLLM and friends);
2. endpoints named by `OLLAMA_HOST`, `LM_STUDIO_BASE_URL` (and spellings),
   `AKM_LLM_ENDPOINT`, `AKM_LLM_BASE_URL`;
3. base URLs from imported harness configs (OpenCode providers).

Each base is asked `GET /api/tags` (Ollama's model list), `GET /v1/models`
(OpenAI-compatible) and `GET /api/v0/models` (LM Studio's, which says which
models are chat models). When no Ollama server answers but an `ollama` binary
is on PATH, `ollama list` names its installed models.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from akm.canonical import json_object
from akm.config import ENV_NAME_RE, normalize_chat_endpoint, strip_jsonc

PROBE_URLS_ENV = "AKM_SETUP_PROBE_URLS"
PROBE_TIMEOUT_S = 2.0
OLLAMA_LIST_TIMEOUT_S = 5.0
VERSION_TIMEOUT_S = 10.0  # an agent CLI's `--version` (gemini, a node program, takes ~3 s to start)

DEFAULT_PROBE_BASES: tuple[tuple[str, str], ...] = (
    ("http://127.0.0.1:11434", "Ollama"),
    ("http://127.0.0.1:1234", "LM Studio"),
    ("http://127.0.0.1:8080", "local server"),
)


# Environment variables whose presence tells something (spec/setup.md): name → (provider, kind).
ENV_SIGNALS: tuple[tuple[str, str, str], ...] = (
    ("ANTHROPIC_API_KEY", "anthropic", "apiKey"),
    ("OPENAI_API_KEY", "openai", "apiKey"),
    ("GEMINI_API_KEY", "gemini", "apiKey"),
    ("GOOGLE_API_KEY", "gemini", "apiKey"),
    ("GROQ_API_KEY", "groq", "apiKey"),
    ("AKM_LLM_API_KEY", "akm-llm", "apiKey"),
    ("OLLAMA_HOST", "ollama", "endpoint"),
    ("OLLAMA_BASE_URL", "ollama", "endpoint"),
    ("LM_STUDIO_BASE_URL", "lmstudio", "endpoint"),
    ("LM_STUDIO_API_BASE", "lmstudio", "endpoint"),
    ("LMSTUDIO_BASE_URL", "lmstudio", "endpoint"),
    ("LMSTUDIO_API_BASE", "lmstudio", "endpoint"),
    ("AKM_LLM_ENDPOINT", "akm-llm", "endpoint"),
    ("AKM_LLM_BASE_URL", "akm-llm", "endpoint"),
)

_EMBEDDING = re.compile(r"(?i)(embed|bge-|bge:|minilm|nomic-bert|\be5-|gte-|rerank)")


@dataclass
class ModelServer:
    """One base URL that was asked for its models."""

    base: str  # probed base, e.g. http://127.0.0.1:11434
    endpoint: str  # its chat-completions URL
    label: str  # how to name it to a user: "Ollama", "LM Studio", "OpenCode provider x", …
    source: str  # "probe", "env:OLLAMA_HOST", "harness:opencode"
    provider: str = "local"  # ollama | lmstudio | local | the harness's provider id
    answered: bool = False
    models: list[str] = field(default_factory=list)  # every model it lists
    chat_models: list[str] = field(default_factory=list)  # those that can chat (embedding models dropped)
    default_model: str | None = None
    api_key_env: str | None = None  # the NAME of the variable holding its key (from a harness config)
    error: str | None = None


@dataclass
class AgentCli:
    platform: str
    path: str
    version: str | None = None  # what its `--version` said (None: it said nothing usable)
    # the version akm's CI runs for real (akm.dispatch.harnesses.TESTED_VERSIONS); None: akm drives this
    # platform from its documented output shapes, untested against the real CLI
    tested_version: str | None = None


@dataclass
class HarnessConfig:
    """What a harness's own config says about its model connection (never a key value)."""

    harness: str  # claude-code | opencode
    file: str | None
    provider: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    note: str | None = None


@dataclass
class EnvSignal:
    name: str
    provider: str
    kind: str  # apiKey | endpoint


@dataclass
class Detection:
    servers: list[ModelServer] = field(default_factory=list)
    agent_clis: list[AgentCli] = field(default_factory=list)
    harness_configs: list[HarnessConfig] = field(default_factory=list)
    env_vars: list[EnvSignal] = field(default_factory=list)
    ollama_cli_models: list[str] | None = None  # from `ollama list` when no Ollama server answered
    seconds: float = 0.0

    @property
    def answering(self) -> list[ModelServer]:
        return [s for s in self.servers if s.answered]

    def to_json(self) -> dict[str, Any]:
        def camel(d: dict[str, Any]) -> dict[str, Any]:
            return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): v for k, v in d.items()}

        return {
            "servers": [camel(asdict(s)) for s in self.servers],
            "agentClis": [camel(asdict(a)) for a in self.agent_clis],
            "harnessConfigs": [camel(asdict(h)) for h in self.harness_configs],
            "envVars": [camel(asdict(e)) for e in self.env_vars],
            "ollamaCliModels": self.ollama_cli_models,
            "seconds": round(self.seconds, 3),
        }


# --------------------------------------------------------------------------- small pure helpers


def pick_default_model(ids: list[str]) -> str | None:
    """The model setup suggests: among non-empty ids prefer "instruct" ones, then the longest, ties by name."""
    ids = [i for i in ids if isinstance(i, str) and i.strip()]
    if not ids:
        return None
    instruct = [i for i in ids if "instruct" in i.lower()]
    pool = instruct or ids
    return min(pool, key=lambda i: (-len(i), i))


def env_name_of(value: Any) -> str | None:
    """The variable NAME a harness config points its key at: `$X`, `${X}` or `{env:X}`; None for anything else.

    Braces are stripped (upstream kept them and produced `{X}`, which no shell can set).
    """
    if not isinstance(value, str):
        return None
    text = value.strip()
    m = re.fullmatch(r"\$\{([^}]*)\}|\$(\S+)|\{env:([^}]*)\}", text)
    if not m:
        return None
    name = (m.group(1) or m.group(2) or m.group(3) or "").strip()
    return name if ENV_NAME_RE.match(name) else None


def probe_base(url: str) -> str:
    """A base URL to ask for models: trailing `/` and one `/v1` (and a `/chat/completions`) removed."""
    base = url.strip().rstrip("/")
    for suffix in ("/chat/completions", "/v1"):
        if base.endswith(suffix):
            base = base[: -len(suffix)].rstrip("/")
    return base


def _present(environ: Mapping[str, str], name: str) -> bool:
    return bool((environ.get(name) or "").strip())


def scan_env(environ: Mapping[str, str]) -> list[EnvSignal]:
    """Which of the known variables are set (non-blank). Names only."""
    return [EnvSignal(name, provider, kind) for name, provider, kind in ENV_SIGNALS if _present(environ, name)]


def _env_endpoint(name: str, raw: str) -> str | None:
    """A base URL from an endpoint variable (`OLLAMA_HOST=0.0.0.0:11434` → http://127.0.0.1:11434), or None.

    Ollama's own reading of `OLLAMA_HOST`: without a scheme the port defaults
    to 11434; with `http://` or `https://` to that scheme's port (a server
    behind a reverse proxy), so `https://ollama.example.com` is not asked on :11434.
    """
    text = raw.strip()
    if not text:
        return None
    schemeless = "://" not in text
    if schemeless:
        text = "http://" + text
    try:
        from urllib.parse import urlsplit

        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if parts.username or parts.password or parts.query or parts.fragment or not parts.hostname:
        return None  # never probe (or print) a URL carrying credentials
    host = parts.hostname
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if port is None and schemeless and name.startswith("OLLAMA"):
        port = 11434
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return probe_base(f"{parts.scheme}://{netloc}{parts.path}")


# --------------------------------------------------------------------------- harness configs


def _read_json_file(path: Path) -> dict[str, Any] | None:
    import json

    try:
        if not path.is_file() or path.stat().st_size > 1024 * 1024:
            return None
        text = path.read_text(encoding="utf-8-sig")
        text = re.sub(r",(\s*[}\]])", r"\1", strip_jsonc(text))  # JSONC with trailing commas (OpenCode allows them)
        data = json.loads(text)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def import_claude_code(home: Path) -> HarnessConfig | None:
    """Claude Code (`~/.claude/`): its model and the variable its key lives in. It speaks Anthropic's API,
    not chat completions, so it never becomes an LLM engine — it tells the wizard what the user runs."""
    if not (home / ".claude").is_dir():
        return None
    model = None
    source = None
    for path in (home / ".claude" / "settings.json", home / ".claude.json"):
        data = _read_json_file(path)
        if data is None:
            continue
        env = json_object(data.get("env"))
        candidate = data.get("model") or env.get("ANTHROPIC_MODEL")
        if isinstance(candidate, str) and candidate.strip():
            model, source = candidate.strip(), str(path)
            break
    return HarnessConfig(
        "claude-code", source, provider="anthropic", model=model or "claude-sonnet-4-5", api_key_env="ANTHROPIC_API_KEY"
    )


def _opencode_dirs(home: Path, environ: Mapping[str, str]) -> list[Path]:
    dirs = []
    xdg = (environ.get("XDG_CONFIG_HOME") or "").strip()
    if xdg:
        dirs.append(Path(xdg) / "opencode")
    dirs += [home / ".config" / "opencode"]
    return list(dict.fromkeys(dirs))


def import_opencode(home: Path, cwd: Path, environ: Mapping[str, str]) -> HarnessConfig | None:
    """OpenCode: model, provider, base URL and key variable from the first config file found.

    Reads both the current shape (`provider: {id: {options: {baseURL, apiKey}}}`,
    `model: "id/model"`) and the older one (`providers: [{id, baseUrl, apiKey}]`).
    """
    dirs = _opencode_dirs(home, environ)
    if not any(d.is_dir() for d in dirs) and not (home / ".opencode").is_dir():
        return None
    candidates = [d / name for d in dirs for name in ("opencode.json", "opencode.jsonc", "config.json")]
    candidates += [home / ".opencode" / "config.json", cwd / "opencode.json", cwd / ".opencode" / "config.json"]
    for path in candidates:
        data = _read_json_file(path)
        if data is None:
            continue
        return _opencode_from(data, str(path))
    return HarnessConfig("opencode", None, note="no config file found")


def _opencode_from(data: dict[str, Any], file: str) -> HarnessConfig:
    model = data.get("model") if isinstance(data.get("model"), str) else None
    prefix, _, bare = (model or "").partition("/")
    provider_id = base_url = None
    key_value: Any = None
    providers = data.get("provider")
    if isinstance(providers, dict) and providers:
        ids = [k for k, v in providers.items() if isinstance(v, dict)]
        chosen = (
            prefix
            if prefix in ids
            else next(
                (
                    k
                    for k in ids
                    if isinstance(providers[k].get("options"), dict)
                    and (providers[k]["options"].get("baseURL") or providers[k]["options"].get("baseUrl"))
                ),
                None,
            )
        )
        if chosen:
            opts = json_object(providers[chosen].get("options"))
            provider_id = chosen
            base_url = opts.get("baseURL") or opts.get("baseUrl") or opts.get("base_url")
            key_value = opts.get("apiKey")
    elif isinstance(data.get("providers"), list) and data["providers"] and isinstance(data["providers"][0], dict):
        first = data["providers"][0]
        provider_id = first.get("id") if isinstance(first.get("id"), str) else None
        base_url = first.get("baseUrl") or first.get("base_url") or first.get("baseURL")
        key_value = first.get("apiKey")
    if model and provider_id and prefix == provider_id and bare:
        model = bare
    api_key_env = env_name_of(key_value)
    notes = []
    if key_value is not None and api_key_env is None:
        notes.append("its API key is written in the file; akm did not import it (use an environment variable)")
    del key_value  # never kept, never shown
    base_url = base_url.strip() if isinstance(base_url, str) and base_url.strip() else None
    if base_url is not None and _carries_secrets(base_url):
        base_url = None  # never kept, never shown: it may hold a password or a key
        notes.append("its base URL carries a user name, password, query or fragment; akm did not import it")
    return HarnessConfig(
        "opencode",
        file,
        provider=provider_id,
        model=model,
        base_url=base_url,
        api_key_env=api_key_env,
        note="; ".join(notes) or None,
    )


def _carries_secrets(url: str) -> bool:
    """Whether a URL has parts where keys hide (`user:pass@`, `?key=…`, `#…`) or cannot be parsed at all."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return True
    return bool(parts.username or parts.password or parts.query or parts.fragment or "@" in parts.netloc)


# --------------------------------------------------------------------------- servers


def probe_list(environ: Mapping[str, str], harnesses: list[HarnessConfig]) -> list[ModelServer]:
    """The servers to ask, in order, deduplicated by base URL."""
    out: dict[str, ModelServer] = {}

    def add(
        url: str,
        label: str,
        source: str,
        *,
        provider: str = "local",
        api_key_env: str | None = None,
        original: str | None = None,
    ) -> None:
        base = probe_base(url)
        if not base:
            return
        if base in out:
            # a harness config naming a server already on the list (say its llama.cpp on :8080) brings the NAME
            # of the variable holding its key: without it that server answers 401 and is never considered
            if api_key_env and not out[base].api_key_env:
                out[base].api_key_env = api_key_env
            return
        try:
            endpoint = normalize_chat_endpoint(original or base)
        except ValueError:
            return
        out[base] = ModelServer(
            base=base, endpoint=endpoint, label=label, source=source, provider=provider, api_key_env=api_key_env
        )

    override = (environ.get(PROBE_URLS_ENV) or "").strip()
    if override:
        for url in (u.strip() for u in override.split(",")):
            if url:
                add(url, "local server", "probe")
    else:
        for url, label in DEFAULT_PROBE_BASES:
            add(url, label, "probe")
    for name, _provider, kind in ENV_SIGNALS:
        if kind == "endpoint" and _present(environ, name):
            named = _env_endpoint(name, environ[name])
            if named:
                add(named, f"${name}", f"env:{name}")
    for h in harnesses:
        if h.base_url:
            add(
                h.base_url,
                f"{_HARNESS_LABEL.get(h.harness, h.harness)} provider {h.provider or ''}".strip(),
                f"harness:{h.harness}",
                provider=h.provider or "local",
                api_key_env=h.api_key_env,
                original=h.base_url,
            )
    return list(out.values())


_HARNESS_LABEL = {"claude-code": "Claude Code", "opencode": "OpenCode"}
_SHAPE_LABEL = {"ollama": "Ollama", "lmstudio": "LM Studio", "local": "OpenAI-compatible server"}


def _chat_models_ollama(doc: Any) -> tuple[list[str], list[str]] | None:
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, list):
        return None
    names, chat = [], []
    for m in models:
        if not isinstance(m, dict) or not isinstance(m.get("name") or m.get("model"), str):
            continue
        name = str(m.get("name") or m.get("model")).removesuffix(":latest")
        names.append(name)
        details = json_object(m.get("details"))
        families = [str(details.get("family") or "")] + [str(f) for f in details.get("families") or []]
        if not _EMBEDDING.search(name) and not any("bert" in f.lower() for f in families):
            chat.append(name)
    return sorted(set(names)), sorted(set(chat))


def _ids(doc: Any) -> list[dict[str, Any]] | None:
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    return [d for d in data if isinstance(d, dict) and isinstance(d.get("id"), str) and d["id"].strip()]


def _interpret(server: ModelServer, tags: Any, openai: Any, lmstudio: Any, preferred_model: str | None) -> None:
    """Fill `server` from the three answers (each a parsed JSON doc or None)."""
    names: list[str] = []
    chat: list[str] = []
    if tags is not None and (parsed := _chat_models_ollama(tags)) is not None:
        shape = "ollama"
        names, chat = parsed
    elif lmstudio is not None and (entries := _ids(lmstudio)) is not None:
        shape = "lmstudio"
        names = sorted({e["id"] for e in entries})
        chat_entries = [e for e in entries if str(e.get("type") or "llm") in ("llm", "vlm")]
        loaded = [e["id"] for e in chat_entries if e.get("state") == "loaded"]
        chat = sorted(set(loaded or [e["id"] for e in chat_entries]))
    elif openai is not None and (entries := _ids(openai)) is not None:
        shape = "local"
        names = sorted({e["id"] for e in entries})
        chat = [n for n in names if not _EMBEDDING.search(n)] or names
    else:
        return
    if not server.source.startswith("harness:"):
        server.provider = shape
        name = _SHAPE_LABEL[shape]
        server.label = name if server.source == "probe" else f"{name} ({server.label})"
    server.answered = True
    server.error = None
    server.models = names
    server.chat_models = chat
    if preferred_model and (preferred_model in names or not names):
        server.default_model = preferred_model
    else:
        server.default_model = pick_default_model(chat)


def _probe_servers(
    servers: list[ModelServer], environ: Mapping[str, str], harnesses: list[HarnessConfig], pool: ThreadPoolExecutor
) -> None:
    from akm.dispatch.probe import get_json

    preferred = {probe_base(h.base_url): h.model for h in harnesses if h.base_url}
    jobs = []
    for s in servers:
        key = (environ.get(s.api_key_env) or "").strip() if s.api_key_env else ""
        # the value goes straight into a header of a request to the server the harness config names
        urls = (f"{s.base}/api/tags", f"{s.base}/v1/models", f"{s.base}/api/v0/models")
        jobs.append((s, [pool.submit(get_json, u, timeout_s=PROBE_TIMEOUT_S, api_key=key or None) for u in urls]))
    for s, futures in jobs:
        tags, openai, lms = (f.result() for f in futures)
        _interpret(
            s,
            tags.doc if tags.ok else None,
            openai.doc if openai.ok else None,
            lms.doc if lms.ok else None,
            preferred.get(s.base),
        )
        if not s.answered:
            statuses = [a.status for a in (tags, openai, lms) if a.status is not None]
            s.error = f"HTTP {statuses[0]}" if statuses else (openai.error or tags.error or "no answer")


def _ollama_list(path: str | None) -> list[str] | None:
    exe = shutil.which("ollama", path=path)
    if not exe:
        return None
    from akm.dispatch.probe import run_listing

    out = run_listing([exe, "list"], timeout_s=OLLAMA_LIST_TIMEOUT_S)
    if out is None:
        return None
    names = []
    for i, line in enumerate(out.splitlines()):
        first = line.split()[0] if line.split() else ""
        if i == 0 and first.upper() == "NAME":
            continue
        if first:
            names.append(first.removesuffix(":latest"))
    return sorted(set(names))


def agent_clis(path: str | None = None, *, versions: bool = True) -> list[AgentCli]:
    """Agent CLIs on PATH in preference order (`harnesses.DETECTION_ORDER`: opencode, claude, codex, copilot,
    pi, gemini, aider, amazonq as `q`, openhands), each with the version its `--version` prints (asked of
    all at once, `VERSION_TIMEOUT_S` each) and the version akm is tested with, if any."""
    from akm.dispatch.harnesses import TESTED_VERSIONS
    from akm.dispatch.harnesses import detect as on_path

    found = [AgentCli(p, exe, tested_version=TESTED_VERSIONS.get(p)) for p, exe in on_path(path).items()]
    for cli in found:
        cli.version = npm_package_version(cli.path)
    ask = [c for c in found if c.version is None]
    if versions and ask:
        from akm.dispatch.probe import cli_version

        with ThreadPoolExecutor(max_workers=len(ask), thread_name_prefix="akm-setup-version") as pool:
            asked = pool.map(lambda c: cli_version(c.path, timeout_s=VERSION_TIMEOUT_S), ask)
            for cli, version in zip(ask, asked, strict=True):
                cli.version = version
    return found


def npm_package_version(exe: str) -> str | None:
    """The version of the npm package an executable belongs to (`node_modules/.bin/gemini` → the
    `package.json` of @google/gemini-cli that lists it under `bin`): what its `--version` prints, read
    without starting it (a node CLI takes seconds to start). None when it is not such a package."""
    try:
        real = Path(exe).resolve()
    except OSError:
        return None
    name = Path(exe).name
    for folder in list(real.parents)[:6]:
        manifest = folder / "package.json"
        if not manifest.is_file():
            continue
        try:
            doc = json_object(json.loads(manifest.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None
        bins = doc.get("bin")
        # `bin` names each command, or is one path whose command is the package's name (without its scope)
        listed = name in bins if isinstance(bins, dict) else str(doc.get("name") or "").rsplit("/", 1)[-1] == name
        version = doc.get("version")
        return str(version) if listed and isinstance(version, str) and version else None
    return None


def detect(
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    cwd: Path | None = None,
    path: str | None = None,
) -> Detection:
    """Look around. Never raises for what it finds (or does not find)."""
    started = time.monotonic()
    env = os.environ if environ is None else environ
    home = home or Path(env.get("HOME") or os.path.expanduser("~"))
    cwd = cwd or Path.cwd()
    det = Detection(env_vars=scan_env(env))
    for importer in (lambda: import_claude_code(home), lambda: import_opencode(home, cwd, env)):
        try:
            found = importer()
        except Exception:  # a harness file we cannot make sense of is simply not imported
            found = None
        if found is not None:
            det.harness_configs.append(found)
    det.servers = probe_list(env, det.harness_configs)
    with ThreadPoolExecutor(
        max_workers=max(4, min(24, 3 * len(det.servers) + 1)), thread_name_prefix="akm-setup-probe"
    ) as pool:
        clis = pool.submit(agent_clis, path if path is not None else env.get("PATH"))
        _probe_servers(det.servers, env, det.harness_configs, pool)
        det.agent_clis = clis.result()
    if not any(s.provider == "ollama" and s.answered for s in det.servers):
        det.ollama_cli_models = _ollama_list(path if path is not None else env.get("PATH"))
    det.seconds = time.monotonic() - started
    return det
