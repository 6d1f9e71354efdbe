"""Freeze engines into a plan: which engine runs each unit, with which model and timeout.

Decided once, at run start, from the effective config (akm.config): a run never
re-reads config, so editing it cannot change a run in flight, and everything
that decides what a unit is asked to do is in the plan hash. Secrets are not:
a snapshot names the environment variables holding the key (`credential`), and
the dispatcher reads them at dispatch time.

Engine selection for a unit that is not an exec unit (spec/config.md §5):

1. the unit's `engine:`, else the workflow's `defaults.engine`;
2. else the config default that can run it: a unit that needs a workspace and
   tools — `env:` bindings, `isolation: worktree`, or instructions with a shell
   block to run (`tool_need`) — needs an agent (`defaults.agentEngine`), and
   without one it goes to the calling agent, never to a chat model that can
   run nothing; a unit with `llm:` options wants an LLM (`defaults.llmEngine`);
   any other unit takes `defaults.agentEngine`, then `defaults.llmEngine`;
3. nothing configured → a session unit (engine null) that the calling agent
   does (spec/decisions.md D11). With no engine configured at all, every such unit is
   a session unit even when it names an engine, so a shared workflow still runs.

The decision is frozen with the unit (`UnitNode.route`, one of `ROUTES`), so
`status` and a plan preview can say where each step goes and why
(`step_routes`).

A unit naming an engine the config lacks, or asking an engine for something it
cannot do (an LLM has no working directory and no environment), fails here —
at run creation — with a ConfigError, never mid-run.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from akm.config import SESSION_JUDGE, engine_env_key_name, env_ref_name
from akm.errors import ConfigError
from akm.plan.model import Invocation
from akm.record import dataclass

DEFAULT_LLM_TIMEOUT_MS = 600_000
# An agent unit without a timeout anywhere (unit, workflow defaults, engine) ends after this long: an agent
# CLI that hangs — its model API stalling, a tool waiting for input — must not hold a run forever. A
# workflow's `timeout: none` or an engine's `timeoutMs: null` still asks for no limit, explicitly.
DEFAULT_AGENT_TIMEOUT_MS = 1_800_000
LOOPBACK_LLM_CONCURRENCY = 1
REMOTE_LLM_CONCURRENCY = 4

# Built-in aliases for the claude and opencode columns (one level, no recursion).
BUILTIN_MODEL_ALIASES: dict[str, dict[str, str]] = {
    "opus": {"claude": "claude-opus-4-7", "opencode": "opencode/claude-opus-4-7"},
    "sonnet": {"claude": "claude-sonnet-4-6", "opencode": "opencode/claude-sonnet-4-6"},
    "haiku": {"claude": "claude-haiku-4-5-20251001", "opencode": "opencode/claude-haiku-4-5"},
}


def resolve_model(
    model: str,
    *,
    columns: list[str],
    engine_aliases: dict[str, str] | None,
    root_aliases: dict[str, dict[str, str]] | None,
    builtin_column: str | None = None,
) -> str:
    """An alias to the exact model id, else `model` unchanged.

    Looked up case-insensitively: the engine's own `modelAliases`, then the root
    `modelAliases[alias][column]` for each column in order, then `[alias]["*"]`,
    then the built-in table for `builtin_column`.
    """
    key = model.lower()
    for k, v in (engine_aliases or {}).items():
        if k.lower() == key:
            return v
    row = next((v for k, v in (root_aliases or {}).items() if k.lower() == key), None)
    if row:
        for col in [*columns, "*"]:
            if col in row:
                return row[col]
    if builtin_column:
        exact = BUILTIN_MODEL_ALIASES.get(key, {}).get(builtin_column)
        if exact:
            return exact
    return model


def is_loopback_endpoint(endpoint: str) -> bool:
    """localhost, 127.0.0.0/8, ::1, 0.0.0.0 — purely syntactic, no DNS."""
    try:
        host = (urlsplit(endpoint).hostname or "").strip("[]").lower()
    except ValueError:
        return True
    if not host or host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def credential_descriptor(name: str, engine: Any, default_llm: str | None) -> dict[str, Any]:
    """Which environment variables hold this LLM engine's key (names only, never values).

    An explicit `apiKey: ${NAME}` is required and never falls back. Otherwise the
    key is optional: `AKM_ENGINE_<NAME>_API_KEY`, then `AKM_LLM_API_KEY` for the
    default LLM engine only.
    """
    ref = env_ref_name(engine.api_key) if engine.api_key else None
    if ref:
        return {"names": [ref], "required": True}
    names = [engine_env_key_name(name)]
    if default_llm == name:
        names.append("AKM_LLM_API_KEY")
    return {"names": names, "required": False}


def llm_snapshot(name: str, engine: Any, cfg: Any) -> dict[str, Any]:
    """What a run keeps of an LLM engine: the connection, never the key."""
    model = resolve_model(engine.model, columns=[name, "llm"], engine_aliases=None, root_aliases=cfg.model_aliases)
    snap: dict[str, Any] = {
        "name": name,
        "kind": "llm",
        "endpoint": engine.endpoint,
        "model": model,
        "concurrency": engine.concurrency
        or (LOOPBACK_LLM_CONCURRENCY if is_loopback_endpoint(engine.endpoint) else REMOTE_LLM_CONCURRENCY),
        "credential": credential_descriptor(name, engine, cfg.defaults.llm_engine),
    }
    for key, value in (
        ("provider", engine.provider),
        ("temperature", engine.temperature),
        ("maxTokens", engine.max_tokens),
        ("supportsJsonSchema", engine.supports_json_schema),
        ("extraParams", engine.extra_params),
        ("contextLength", engine.context_length),
        ("enableThinking", engine.enable_thinking),
    ):
        if value is not None:
            snap[key] = value
    return snap


def agent_snapshot(name: str, engine: Any, cfg: Any) -> dict[str, Any]:
    """What a run keeps of an agent engine. The harness profile's own defaults (binary, base
    arguments, environment passthrough) are applied by the dispatcher; only what config says is frozen."""
    snap: dict[str, Any] = {"name": name, "kind": "agent", "platform": engine.platform}
    if engine.bin is not None:
        snap["bin"] = engine.bin
    if engine.args is not None:
        snap["args"] = list(engine.args)
    if engine.env_passthrough:
        snap["envPassthrough"] = list(engine.env_passthrough)
    if engine.concurrency is not None:
        snap["concurrency"] = engine.concurrency
    if engine.llm_engine is not None:
        llm = cfg.engines[engine.llm_engine]
        snap["llmEngine"] = engine.llm_engine
        snap["llm"] = llm_snapshot(engine.llm_engine, llm, cfg)
    return snap


# Why a unit runs where it does (`UnitNode.route`): the engine named, a default, or the calling agent.
ROUTES = {
    "named": "the engine the step (or the workflow's defaults.engine) names",
    "agent-default": "defaults.agentEngine",
    "llm-default": "defaults.llmEngine",
    "needs-tools": "the calling agent: the step needs a workspace and tools, and no agent engine is configured",
    "no-default": "the calling agent: no default engine is configured for it",
}
# Fenced code in these languages is something to run: a step that shows one needs a shell.
SHELL_LANGUAGES = frozenset(
    {"sh", "bash", "shell", "console", "zsh", "fish", "ksh", "powershell", "pwsh", "ps1", "cmd", "bat", "terminal"}
)
_FENCE = re.compile(r"^[ \t]{0,3}(?:```|~~~)[ \t]*([A-Za-z0-9_+.-]*)", re.MULTILINE)
_PROMPT_LINE = re.compile(r"^[ \t]*\$ \S", re.MULTILINE)


def tool_need(instructions: str, *, env: bool = False, worktree: bool = False) -> str | None:
    """Why a unit needs a workspace and tools (a process that can run things), in words; None when it
    does not. A chat model can only answer text: such a unit must not go to it by default."""
    if env:
        return "it binds environment variables (env:)"
    if worktree:
        return "it runs in an isolation worktree"
    for m in _FENCE.finditer(instructions):
        if m.group(1).lower() in SHELL_LANGUAGES:
            return f"its instructions have a {m.group(1)} block to run"
    if _PROMPT_LINE.search(instructions):
        return "its instructions have `$ command` lines to run"
    return None


@dataclass(frozen=True)
class StepRoute:
    """Where one step's units go and why (a plan preview, `status`)."""

    step_id: str
    kind: str  # exec | llm | agent | session | route (a route step runs no unit)
    engine: str | None  # the engine's name (None: exec, the calling agent, or a route)
    route: str | None  # a key of ROUTES (None: exec, or a plan frozen before routes were recorded)
    text: str  # all of it in words: "engine coder (agent, defaults.agentEngine)", "the calling agent: …"


def step_routes(plan: Any) -> list[StepRoute]:
    """Each step of a frozen plan: where its units go, and why — the decision `EngineFreezer` recorded."""
    out: list[StepRoute] = []
    engines = plan.execution.engines
    for step in plan.steps:
        unit = step.unit_template
        if unit is None:
            out.append(StepRoute(step.step_id, "route", None, None, "no unit: a route step chooses the next step"))
            continue
        if unit.exec is not None:
            out.append(StepRoute(step.step_id, "exec", None, None, "akm runs its command (exec)"))
            continue
        name = unit.invocation.engine if unit.invocation is not None else None
        route = unit.route
        if name is None:
            why = ROUTES.get(route or "", "the calling agent")
            need = tool_need(unit.instructions, env=bool(unit.env), worktree=unit.isolation == "worktree")
            if route == "needs-tools" and need:
                why += f" ({need})"
            elif route is None:
                why = "the calling agent: no engine is configured"
            out.append(StepRoute(step.step_id, "session", None, route, why))
            continue
        kind = str((engines.get(name) or {}).get("kind") or "engine")
        by = f", {ROUTES[route]}" if route in ROUTES and route != "named" else (", named" if route else "")
        out.append(StepRoute(step.step_id, kind, name, route, f"engine {name} ({kind}{by})"))
    return out


def routing_summary(llm_engine: str | None, agent_engine: str | None) -> list[str]:
    """Which steps go where under these defaults, in words (`akm setup`'s summary; spec/config.md §5)."""
    tools = "steps that need a workspace and tools (a shell block to run, env: bindings, an isolation worktree)"
    if agent_engine and llm_engine:
        return [
            f"{tools} and plain steps: agent engine {agent_engine}",
            f"steps with llm: options: LLM engine {llm_engine}",
        ]
    if agent_engine:
        return [
            f"every step (exec units aside): agent engine {agent_engine}"
            " (a step with llm: options is refused: it needs an LLM engine)"
        ]
    if llm_engine:
        return [
            f"plain steps (a prompt to answer) and steps with llm: options: LLM engine {llm_engine}",
            f"{tools}: the calling agent — no agent engine is configured, and a chat model can run nothing"
            " (name an engine in the step to send it elsewhere)",
        ]
    return ["every step (exec units aside): the calling agent — no engine is configured"]


class EngineFreezer:
    """Resolves engines for one plan and collects the snapshots it used (`execution.engines`)."""

    def __init__(self, loaded: Any = None) -> None:
        """`loaded` is an `akm.config.LoadedConfig`, or None when there is no config file at all."""
        self.loaded = loaded
        self.cfg: Any = loaded.config if loaded is not None else None  # a pydantic or plain-record config
        self.snapshots: dict[str, dict[str, Any]] = {}

    @property
    def any_engine(self) -> bool:
        return self.cfg is not None and bool(self.cfg.engines)

    # ------------------------------------------------------------ snapshots
    def snapshot(self, name: str) -> dict[str, Any]:
        if name not in self.snapshots:
            engine = self.cfg.engines[name]
            self.snapshots[name] = (llm_snapshot if engine.kind == "llm" else agent_snapshot)(name, engine, self.cfg)
        return self.snapshots[name]

    def prices(self) -> dict[str, dict[str, float]]:
        """The config prices of every engine this plan uses (`execution.prices`): USD per million tokens."""
        out: dict[str, dict[str, float]] = {}
        for name in sorted(self.snapshots):
            prices = getattr(self.cfg.engines[name], "prices", None)
            if prices is not None:
                out[name] = {k: v for k in ("input", "output", "cached") if (v := getattr(prices, k, None)) is not None}
        return out

    def _model_for(self, name: str, model: str | None) -> str | None:
        engine = self.cfg.engines[name]
        if engine.kind == "llm":
            if model is None:
                return self.snapshot(name)["model"]
            return resolve_model(model, columns=[name, "llm"], engine_aliases=None, root_aliases=self.cfg.model_aliases)
        chosen = model if model is not None else engine.model
        if chosen is None:
            return None
        return resolve_model(
            chosen,
            columns=[engine.platform, name],
            engine_aliases=engine.model_aliases,
            root_aliases=self.cfg.model_aliases,
            builtin_column=engine.platform,
        )

    def _timeout_for(self, name: str) -> int | None:
        engine = self.cfg.engines[name]
        if engine.declared("timeout_ms"):
            return engine.timeout_ms
        return DEFAULT_LLM_TIMEOUT_MS if engine.kind == "llm" else DEFAULT_AGENT_TIMEOUT_MS

    # ------------------------------------------------------------ selection
    def _unknown(self, where: str, name: str) -> ConfigError:
        known = ", ".join(sorted(self.cfg.engines)) or "none"
        files = " and ".join(str(p) for p in self.loaded.files) or str(self.loaded.user_path)
        from akm.codes import Code

        return ConfigError(
            f"{where} names engine {name!r}, which is not configured in {files} (engines: {known}).",
            code=Code.UNKNOWN_ENGINE,
            hint=f"Add an engine named {name!r} to the config, or change the step's engine.",
            details={"engine": name},
        )

    def _mismatch(self, where: str, message: str, name: str) -> ConfigError:
        from akm.codes import Code

        return ConfigError(
            f"{where}: {message}",
            code=Code.ENGINE_MISMATCH,
            details={"engine": name},
            hint="Name an engine of the right kind for this step, or change the step.",
        )

    def select(self, *, named: str | None, needs_agent: bool, wants_llm: bool) -> tuple[str | None, str | None]:
        """(the engine a unit runs on or None for a session unit, why: a key of ROUTES; None when no engine
        is configured at all). See the module docstring."""
        if not self.any_engine:
            return None, None
        if named is not None:
            return named, "named"
        d = self.cfg.defaults
        if needs_agent:
            return (d.agent_engine, "agent-default") if d.agent_engine else (None, "needs-tools")
        if wants_llm and d.llm_engine:
            return d.llm_engine, "llm-default"
        if d.agent_engine:
            return d.agent_engine, "agent-default"
        if d.llm_engine:
            return d.llm_engine, "llm-default"
        return None, "no-default"

    def unit_invocation(
        self,
        *,
        where: str,
        named: str | None,
        model: str | None,
        declared_timeout: bool,
        timeout_ms: int | None,
        llm: dict[str, Any] | None,
        unit_llm: bool,
        needs_env: bool,
        needs_cwd: bool,
        needs_tools: bool = False,
    ) -> tuple[Invocation, str | None]:
        """The frozen invocation of one (template) unit, and why it goes there (a key of ROUTES, None
        without any engine configured). `where` names it in errors (`file:line: step "x"`). `needs_tools`:
        its instructions have something to run (`tool_need`)."""
        # a unit's own `llm:` options ask for a model explicitly: a shell block in its text does not override them
        needs_agent = needs_env or needs_cwd or (needs_tools and not unit_llm)
        name, route = self.select(named=named, needs_agent=needs_agent, wants_llm=unit_llm)
        if name is None:
            kwargs: dict[str, Any] = {"timeout_ms": timeout_ms} if declared_timeout else {}
            return Invocation(engine=None, model=model, llm=llm, **kwargs), route
        engine = self.cfg.engines.get(name)
        if engine is None:
            raise self._unknown(where, name)
        if engine.kind == "llm":
            if needs_cwd:
                raise self._mismatch(
                    where,
                    f"isolation: worktree needs an agent engine; {name!r} is an LLM engine "
                    "and has no working directory",
                    name,
                )
            if needs_env:
                raise self._mismatch(
                    where,
                    f"env bindings need an agent or exec unit; {name!r} is an LLM engine "
                    "and runs no process to pass them to",
                    name,
                )
        elif unit_llm:
            raise self._mismatch(where, f"llm options apply to LLM engines; {name!r} is an agent engine", name)
        else:
            llm = None  # document-wide llm defaults do not apply to agents
        self.snapshot(name)
        invocation = Invocation(
            engine=name,
            model=self._model_for(name, model),
            timeout_ms=timeout_ms if declared_timeout else self._timeout_for(name),
            llm=llm,
        )
        return invocation, route

    def judge_invocation(self) -> Invocation | None:
        """The frozen judge of `### gate` rubrics, or None when the calling agent judges (D12)."""
        if not self.any_engine:
            return None
        name = self.cfg.workflow.judge_engine
        if not name or name == SESSION_JUDGE:
            return None
        if name not in self.cfg.engines:
            raise self._unknown("workflow.judgeEngine", name)
        self.snapshot(name)
        return Invocation(engine=name, model=self._model_for(name, None), timeout_ms=self._timeout_for(name))
