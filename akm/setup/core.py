"""Setup's decisions and its one write.

Every entry point (`--yes`, `--config`/`--from`, the wizard, the MCP tool)
ends in the same place: a `SetupIntent` — an optional blob to deep-merge, an
LLM engine and an agent engine to upsert, a judge policy — applied by
`apply_intent` inside ONE `update_config_file` call (exclusive lock, re-read,
validate the merged result, back up the old file, atomic replace).

Rules (spec/setup.md):

* Upsert by fingerprint: an engine already configured for the same server
  (normalized endpoint) or the same agent platform is reused by name and never
  modified — a user's tuning survives. Otherwise the engine gets a slug of its
  provider/platform, made unique (`ollama`, `ollama-2`, …).
* Defaults are set only where unset (the wizard sets what the user picked).
* `workflow.judgeEngine`, when unset, goes to the LLM engine (else the agent
  engine), so gated steps are judged without anyone at the keyboard.
* The same environment gives the same decisions, and an unchanged result
  writes nothing: a second `setup --yes` leaves the file byte-identical.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from akm import config as cfg
from akm.canonical import json_object
from akm.codes import Code
from akm.errors import ConfigError
from akm.setup.detect import Detection, ModelServer
from akm.setup.verify import JsonSchemaProbe, Verification, probe_json_schema, verify_endpoint

# Top-level keys a setup blob may carry; anything else is dropped with a warning.
BLOB_KEYS = ("engines", "defaults", "workflow", "modelAliases")

Warn = Callable[[str], None]


@dataclass
class EngineChoice:
    """An engine to upsert, and whether it becomes the default of its kind."""

    engine: dict[str, Any]
    name_hint: str
    make_default: bool = True
    force_default: bool = False  # the wizard: the user picked it, so it replaces the current default
    on_llm: bool = False  # agent engines: run on the LLM choice (`llmEngine` = that engine's name)
    match_model: bool = False  # the wizard: reuse an engine only if it also has the model the user picked
    label: str = ""  # for summaries: "Ollama at http://…", "claude (/usr/bin/claude)"
    short: str = ""  # a shorter label for hints ("qwen2.5:7b at http://127.0.0.1:11434")


@dataclass
class SetupIntent:
    blob: dict[str, Any] | None = None
    llm: EngineChoice | None = None
    agent: EngineChoice | None = None
    judge: str | None = "auto"  # auto (where unset: llm, else agent) | llm | agent | session | keep
    clear_defaults: tuple[str, ...] = ()  # the wizard's "none": defaults.<key> removed (engines stay)
    json_schema: bool | None = None  # record supportsJsonSchema on the default LLM engine (--probe)


@dataclass
class Action:
    engine: str
    kind: str
    action: str  # added | kept | updated
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "kind": self.kind, "action": self.action, "detail": self.detail}


@dataclass
class Applied:
    actions: list[Action] = field(default_factory=list)
    llm_name: str | None = None
    agent_name: str | None = None


# --------------------------------------------------------------------------- applying an intent


def _get(d: Mapping[str, Any], *keys: str) -> Any:
    node: Any = d
    for k in keys:
        if not isinstance(node, Mapping) or k not in node:
            return None
        node = node[k]
    return node


def _upsert(
    data: dict[str, Any], effective: dict[str, Any], engine: dict[str, Any], hint: str, match_model: bool = False
) -> tuple[str, bool]:
    """Reuse an engine with the same fingerprint (looked up in both layers), else add one with a free name.

    `match_model`: the wizard asked for a particular model, so an engine on the
    same server with another model is not "the same" (it is left alone, and a
    new engine is added beside it).
    """
    engines = json_object(effective.get("engines"))
    pool = {
        n: e
        for n, e in engines.items()
        if not match_model or (isinstance(e, dict) and e.get("model") == engine.get("model"))
    }
    existing = cfg.find_engine(pool, engine)
    if existing is not None:
        return existing, False
    name = cfg.unique_engine_name(engines, hint)
    data.setdefault("engines", {})[name] = dict(engine)
    return name, True


def _set_default(data: dict[str, Any], effective: dict[str, Any], key: str, name: str, force: bool) -> None:
    if force or not _get(effective, "defaults", key):
        if _get(data, "defaults", key) != name:
            data.setdefault("defaults", {})[key] = name


def apply_intent(
    data: dict[str, Any], other: dict[str, Any] | None, intent: SetupIntent, *, project: bool = False
) -> Applied:
    """Apply `intent` to `data` (the target file's object; mutated). `other` is the other layer, read-only.

    Lookups (fingerprints, what is already set) use the two layers merged the
    way akm reads them (the project file wins).
    """

    def effective() -> dict[str, Any]:
        layers = (other or {}, data) if project else (data, other or {})
        return cfg.deep_merge(layers[0], layers[1])

    out = Applied()
    if intent.blob:
        merged = cfg.deep_merge(data, intent.blob)
        data.clear()
        data.update(merged)
    for key in intent.clear_defaults:
        defaults = data.get("defaults")
        if isinstance(defaults, dict) and key in defaults:
            del defaults[key]
            if not defaults:
                del data["defaults"]
    if intent.llm is not None:
        name, added = _upsert(data, effective(), intent.llm.engine, intent.llm.name_hint, intent.llm.match_model)
        out.llm_name = name
        out.actions.append(Action(name, "llm", "added" if added else "kept", intent.llm.label))
        if intent.llm.make_default:
            _set_default(data, effective(), "llmEngine", name, intent.llm.force_default)
    if intent.agent is not None:
        engine = dict(intent.agent.engine)
        if intent.agent.on_llm and out.llm_name:
            engine["llmEngine"] = out.llm_name
        name, added = _upsert(data, effective(), engine, intent.agent.name_hint)
        out.agent_name = name
        out.actions.append(Action(name, "agent", "added" if added else "kept", intent.agent.label))
        if intent.agent.make_default:
            _set_default(data, effective(), "agentEngine", name, intent.agent.force_default)
    eff = effective()
    judge = intent.judge
    target: str | None = None
    if judge == "auto":
        if not _get(eff, "workflow", "judgeEngine"):
            target = _get(eff, "defaults", "llmEngine") or _get(eff, "defaults", "agentEngine")
    elif judge == "llm":
        target = out.llm_name or _get(eff, "defaults", "llmEngine")
    elif judge == "agent":
        target = out.agent_name or _get(eff, "defaults", "agentEngine")
    elif judge == "session":
        target = cfg.SESSION_JUDGE
    if target and _get(data, "workflow", "judgeEngine") != target and _get(eff, "workflow", "judgeEngine") != target:
        data.setdefault("workflow", {})["judgeEngine"] = target
    if intent.json_schema is not None:
        name = _get(effective(), "defaults", "llmEngine")
        llm = _get(data, "engines", name) if name else None
        if isinstance(llm, dict) and llm.get("supportsJsonSchema") is not intent.json_schema:
            llm["supportsJsonSchema"] = intent.json_schema
            flag = str(intent.json_schema).lower()
            out.actions.append(Action(name, "llm", "updated", f"supportsJsonSchema = {flag}"))
    return out


# --------------------------------------------------------------------------- deciding what --yes writes


def llm_engine_for(server: ModelServer, verification: Verification) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "kind": "llm",
        "provider": server.provider,
        "endpoint": verification.endpoint,
        "model": verification.model,
    }
    if server.api_key_env:
        engine["apiKey"] = "${" + server.api_key_env + "}"
    return engine


@dataclass
class Recommendation:
    intent: SetupIntent
    verifications: list[Verification] = field(default_factory=list)
    llm_server: ModelServer | None = None


def recommend(
    detection: Detection,
    effective: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    warn: Warn | None = None,
) -> Recommendation:
    """What `--yes` writes: the first answering server that passes verification, the preferred CLI on PATH.

    Only for kinds whose default is unset in `effective` (the merged config).
    """
    warn = warn or (lambda _m: None)
    rec = Recommendation(SetupIntent())
    if not _get(effective, "defaults", "llmEngine"):
        env = os.environ if environ is None else environ
        for server in detection.servers:
            if not server.answered and server.api_key_env and not (env.get(server.api_key_env) or "").strip():
                warn(
                    f"Skipping {server.label} at {server.base}: required credential {server.api_key_env} is "
                    f"unavailable (set it and run setup again)."
                )
        for server in detection.answering:
            if not server.default_model:
                warn(f"Skipping {server.label} at {server.base}: it lists no chat model.")
                continue
            v = verify_endpoint(server.endpoint, server.default_model, server.api_key_env, environ=environ)
            rec.verifications.append(v)
            if v.ok:
                rec.intent.llm = EngineChoice(
                    llm_engine_for(server, v), server.provider, label=f"{server.label}: {v.model} at {v.endpoint}"
                )
                rec.llm_server = server
                break
            warn(f"Skipping detected LLM {server.label} at {server.base} (model {server.default_model}): {v.reason}")
    if not _get(effective, "defaults", "agentEngine") and detection.agent_clis:
        # a platform the user already configured an engine for wins (that engine is then reused as is)
        engines = json_object(effective.get("engines"))
        configured: dict[str, dict[str, Any]] = {}
        for name in sorted(engines):  # the alphabetically first engine of a platform, like find_engine
            e = engines[name]
            if isinstance(e, dict) and e.get("kind") == "agent" and isinstance(e.get("platform"), str):
                configured.setdefault(e["platform"], e)
        cli = next((c for c in detection.agent_clis if c.platform in configured), detection.agent_clis[0])
        engine: dict[str, Any] = {"kind": "agent", "platform": cli.platform}
        if cli.platform in configured and configured[cli.platform].get("llmEngine"):
            # the fingerprint includes llmEngine: without it the user's engine would not be found, and a
            # second engine of that platform would be added beside it
            engine["llmEngine"] = configured[cli.platform]["llmEngine"]
        rec.intent.agent = EngineChoice(engine, cli.platform, label=f"{cli.platform} ({cli.path})")
    return rec


# --------------------------------------------------------------------------- blobs


def clean_blob(blob: Any, warn: Warn) -> dict[str, Any]:
    """A setup blob: a JSON object whose top-level keys are config sections; others are dropped with a warning."""
    if not isinstance(blob, dict):
        raise ConfigError(
            f"The setup config must be a JSON object, not {type(blob).__name__}.", code=Code.INVALID_CONFIG_FILE
        )
    out = {}
    for key, value in blob.items():
        if key in BLOB_KEYS:
            out[key] = value
        else:
            warn(f"Ignoring unknown or restricted config key {key!r} (setup accepts {', '.join(BLOB_KEYS)}).")
    from akm.config.keys import unknown_key_warnings

    for message in unknown_key_warnings(out):  # kept, as a config file's are, but said
        warn(message)
    return out


def read_blob_file(path: str, cwd: Path) -> Any:
    """A setup blob from a file: JSON (comments allowed), or YAML for .yml/.yaml. ConfigError when unusable."""
    p = Path(os.path.expanduser(path))
    if not p.is_absolute():
        p = cwd / p
    try:
        text = p.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError(
            f"Cannot read setup config {p}: {exc.strerror or exc}.",
            code=Code.INVALID_CONFIG_FILE,
            details={"file": str(p)},
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"Setup config {p} is not UTF-8 text.", code=Code.INVALID_CONFIG_FILE, details={"file": str(p)}
        ) from None
    if p.suffix.lower() in (".yml", ".yaml"):
        from akm.format.yaml12 import load_yaml

        doc = load_yaml(text)
        if doc.problems:
            first = doc.problems[0]
            raise ConfigError(
                f"Setup config {p} line {first.line} is not valid YAML: {first.message}.",
                code=Code.INVALID_CONFIG_FILE,
                details={"file": str(p), "line": first.line},
            )
        return doc.value
    import json

    try:
        return json.loads(cfg.strip_jsonc(text))
    except ValueError as exc:
        raise ConfigError(
            f"Setup config {p} is not valid JSON: {exc}.", code=Code.INVALID_CONFIG_FILE, details={"file": str(p)}
        ) from None


# --------------------------------------------------------------------------- preflight and the whole run


def preflight(cwd: str | None) -> cfg.LoadedConfig | None:
    """The current config, or a ConfigError saying setup cannot run and the file was left untouched."""
    try:
        return cfg.load_config_if_any(cwd)
    except ConfigError as exc:
        raise ConfigError(
            f"Setup cannot run: the existing config is not valid, and it was left untouched.\n{exc.message}",
            code=exc.code,
            hint="Fix the keys named above (or move the file aside), then run setup again.",
            details=exc.details,
        ) from None


def layers(cwd: str | None, project: bool) -> tuple[Path, dict[str, Any], dict[str, Any] | None]:
    """(target path, target object, other layer) as they are on disk now."""
    user_path, project_path = cfg.user_config_path(), cfg.project_config_path(cwd)
    target, other = (project_path, user_path) if project else (user_path, project_path)
    return target, cfg.read_config_file(target) or {}, cfg.read_config_file(other)


def effective_after(intent: SetupIntent, cwd: str | None, project: bool) -> tuple[dict[str, Any], Applied]:
    """The merged config `intent` would produce (nothing written)."""
    _, data, other = layers(cwd, project)
    data = copy.deepcopy(data)
    applied = apply_intent(data, other, intent, project=project)
    merged = cfg.deep_merge(*(((other or {}), data) if project else (data, (other or {}))))
    return merged, applied


def probe_default_llm(merged: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> JsonSchemaProbe | None:
    name = _get(merged, "defaults", "llmEngine")
    engine = _get(merged, "engines", name) if name else None
    if not isinstance(engine, dict) or engine.get("kind") != "llm":
        return None
    return probe_json_schema(name, engine, default_llm=name, environ=environ)


def save(intent: SetupIntent, *, cwd: str | None, project: bool) -> tuple[Path, dict[str, Any], bool, Applied]:
    """The one write: (target path, new file object, written, what was done)."""
    user_path, project_path = cfg.user_config_path(), cfg.project_config_path(cwd)
    target = project_path if project else user_path
    other = cfg.read_config_file(user_path if project else project_path)
    if not target.exists():
        # nothing to write into a file that does not exist: leave no directory or lock file behind either
        empty: dict[str, Any] = {}
        applied = apply_intent(empty, other, intent, project=project)
        if not empty:
            return target, empty, False, applied
    box: dict[str, Applied] = {}

    def mutate(data: dict[str, Any]) -> dict[str, Any]:
        box["applied"] = apply_intent(data, other, intent, project=project)
        return data

    new, written = cfg.update_config_file(mutate, project=project, cwd=cwd)
    return (project_path if project else user_path), new, written, box.get("applied") or Applied()


def can_run(merged: Mapping[str, Any]) -> list[str]:
    """What a user can run now, in words."""
    lines = ["exec units (commands akm runs itself)"]
    llm = _get(merged, "defaults", "llmEngine")
    agent = _get(merged, "defaults", "agentEngine")
    if llm and isinstance(_get(merged, "engines", llm), dict):
        e = merged["engines"][llm]
        via = e.get("provider") or "an OpenAI-compatible server"
        lines.append(f"LLM units on {e.get('model')} via {_PROVIDER_NAMES.get(via, via)} (engine {llm})")
    if agent and isinstance(_get(merged, "engines", agent), dict):
        e = merged["engines"][agent]
        on = f" on engine {e['llmEngine']}" if e.get("llmEngine") else ""
        lines.append(f"agent units via {e.get('platform')}{on} (engine {agent})")
    judge = _get(merged, "workflow", "judgeEngine")
    if judge and judge != cfg.SESSION_JUDGE:
        lines.append(f"gates judged by engine {judge}")
    else:
        lines.append("gates judged by the calling agent")
    from akm.plan.engines import routing_summary

    ok_llm = llm if llm and isinstance(_get(merged, "engines", llm), dict) else None
    ok_agent = agent if agent and isinstance(_get(merged, "engines", agent), dict) else None
    lines += [f"where steps go: {line}" for line in routing_summary(ok_llm, ok_agent)]
    return lines


_PROVIDER_NAMES = {
    "ollama": "Ollama",
    "lmstudio": "LM Studio",
    "local": "a local OpenAI-compatible server",
    "openai": "OpenAI",
    "gemini": "Google Gemini",
    "groq": "Groq",
    "custom": "a custom endpoint",
}


# --------------------------------------------------------------------------- non-interactive setup


@dataclass
class Outcome:
    """What a setup run did (the api turns it into `SetupResult`)."""

    config_path: str
    written: bool
    dry_run: bool
    fields: list[str]
    actions: list[Action]
    defaults: dict[str, Any]
    judge_engine: str | None
    detection: Detection | None
    verifications: list[Verification]
    json_schema: JsonSchemaProbe | None
    warnings: list[str]
    can_run: list[str]
    message: str


def validate_intent(intent: SetupIntent, cwd: str | None, project: bool) -> None:
    """Refuse (ConfigError, nothing written) an intent whose result would not be a valid config."""
    _, data, other = layers(cwd, project)
    data = copy.deepcopy(data)
    apply_intent(data, other, intent, project=project)
    user, proj = (other, data) if project else (data, other)
    cfg.check_layers(user, proj, cwd=cwd, action="Refusing to save invalid config")


def run(
    *,
    yes: bool = False,
    blob: Any = None,
    probe: bool = False,
    project: bool = False,
    cwd: str | None = None,
    dry_run: bool = False,
    environ: Mapping[str, str] | None = None,
    on_warning: Warn | None = None,
    detection: Detection | None = None,
) -> Outcome:
    """`setup --yes`, `--config`/`--from` (blob), `--probe`, and the MCP tool. Never asks anything.

    Order matters for safety: preflight (an invalid existing config aborts,
    untouched), then the blob is checked (a literal key or a bad endpoint is
    refused before any probe or write), then detection and verification, then
    the one save.
    """
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        if on_warning is not None:
            on_warning(message)

    preflight(cwd)
    intent = SetupIntent(judge="auto" if (yes or dry_run) else "keep")
    if blob is not None:
        intent.blob = clean_blob(blob, warn)
        validate_intent(intent, cwd, project)
    rec = None
    if yes or dry_run:
        if detection is None:
            from akm.setup.detect import detect

            detection = detect(environ=environ, cwd=Path(cwd) if cwd else None)
        merged, _ = effective_after(intent, cwd, project)
        rec = recommend(detection, merged, environ=environ, warn=warn)
        intent.llm, intent.agent = rec.intent.llm, rec.intent.agent
    probe_result = None
    if probe:
        merged, _ = effective_after(intent, cwd, project)
        probe_result = probe_default_llm(merged, environ)
        if probe_result is None:
            warn("No default LLM engine to probe for json_schema support.")
        elif probe_result.supported is None:
            warn(f"Could not probe engine {probe_result.engine} for json_schema support: {probe_result.reason}")
        else:
            intent.json_schema = probe_result.supported
    if dry_run:
        target, _, _ = layers(cwd, project)
        merged, applied = effective_after(intent, cwd, project)
        written = False
        file_obj = None
    else:
        target, file_obj, written, applied = save(intent, cwd=cwd, project=project)
        _, data, other = layers(cwd, project)
        merged = cfg.deep_merge(*(((other or {}), data) if project else (data, (other or {}))))
    if blob is not None and not yes:
        fields = list(intent.blob or {})
    else:
        fields = list((file_obj if file_obj is not None else merged) or {})
    lines = can_run(merged)
    configured = bool(_get(merged, "defaults", "llmEngine") or _get(merged, "defaults", "agentEngine"))
    if (yes or dry_run) and not configured and not (merged.get("engines") or {}):
        message = (
            "Nothing to set up was found: no model server answered and no agent CLI is on PATH. "
            "You can still run exec units, and session units (done by the calling agent)."
        )
    elif dry_run:
        message = "Nothing was written (preview)."
    elif written:
        message = f"Wrote {target}."
    elif not Path(target).exists():
        message = f"The config akm reads already says this; {target} was not created."
    else:
        message = f"{target} already says this; nothing was written."
    return Outcome(
        config_path=str(target),
        written=written,
        dry_run=dry_run,
        fields=fields,
        actions=applied.actions,
        defaults=dict(_get(merged, "defaults") or {}),
        judge_engine=_get(merged, "workflow", "judgeEngine"),
        detection=detection,
        verifications=rec.verifications if rec else [],
        json_schema=probe_result,
        warnings=warnings,
        can_run=lines,
        message=message,
    )
