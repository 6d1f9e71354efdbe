"""`akm setup` at a terminal: what was found, a recommended config, adjust it, confirm, save.

This is the CLI's interactive front: it asks and prints, and leaves every
decision with consequences to `akm.api` (detection, verification, the one
save). It writes only after the last question, in one locked atomic save, so
Ctrl-C at any point leaves the config exactly as it was.

Flow:

1. look around (model servers, agent CLIs, harness configs, key variable names);
2. show what was found and the recommended config (what `setup --yes` would
   write: the first server that answers, the preferred agent CLI, the judge);
3. accept it, adjust it step by step, or cancel;
   adjust = LLM connection (a detected server and model, a preset provider,
   a custom endpoint with the NAME of its key variable, keep, none) →
   agent engine (a CLI on PATH, a harness on the LLM connection, keep, none)
   → judge (the LLM engine, the agent engine, the calling agent, keep);
4. the capability summary ("you can now run …"), confirm, save.
"""

from __future__ import annotations

from typing import Any

from akm.api import ENV_NAME_RE, PLATFORMS_WITH_LLM_ENGINE, EngineChoice, SetupIntent, normalize_chat_endpoint
from akm.cli.terminal import Cancelled, Option, Terminal

# (hint/name, label, base URL, suggested model, key variables in order of preference)
PRESETS: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("openai", "OpenAI", "https://api.openai.com/v1", "gpt-4o-mini", ("OPENAI_API_KEY",)),
    (
        "gemini",
        "Google Gemini",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        "gemini-2.5-flash",
        ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    ),
    ("groq", "Groq", "https://api.groq.com/openai/v1", "llama-3.3-70b-versatile", ("GROQ_API_KEY",)),
)

ENV_NAME_PROBLEM = "Use an environment variable NAME (like MY_API_KEY), not a key value."


def validate_env_name(value: str) -> str | None:
    return None if ENV_NAME_RE.match(value) else ENV_NAME_PROBLEM


def validate_endpoint(value: str) -> str | None:
    try:
        normalize_chat_endpoint(value)
    except ValueError as exc:
        return str(exc)
    return None


def run_wizard(*, project: bool = False, cwd: str | None = None, term: Terminal | None = None) -> int:
    """The interactive setup. Returns the exit status (0 saved or declined, 130 cancelled)."""
    t = term or Terminal()
    try:
        return _Wizard(t, project, cwd).run()
    except (Cancelled, KeyboardInterrupt):
        t.out.write("\x1b[?25h" if t.out.isatty() else "")
        t.write()
        t.warn("Cancelled: nothing was written.")
        return 130


class _Wizard:
    def __init__(self, t: Terminal, project: bool, cwd: str | None) -> None:
        self.t = t
        self.project = project
        self.cwd = cwd

    # ------------------------------------------------------------------ the flow

    def run(self) -> int:
        from akm import api

        t = self.t
        api.setup_preflight(cwd=self.cwd)
        paths_ = api.config_paths(cwd=self.cwd)
        self.target = paths_.project if self.project else paths_.user
        t.write(t.bold("akm setup") + t.dim(f" — find engines on this machine and save them to {self.target}"))
        t.write()
        t.status("Looking for model servers, agent CLIs and harness configs…")
        self.det = api.setup_detect(cwd=self.cwd)
        t.clear_line()
        t.ok(f"Looked around in {self.det.seconds:.1f} s")
        self.show_found()
        self.current = api.setup_current(cwd=self.cwd)
        notes: list[str] = []
        if self.det.answering and not self._default("llmEngine"):
            t.status("Checking which model server answers…")
        self.rec = api.setup_recommend(self.det, cwd=self.cwd, project=self.project, on_warning=notes.append)
        t.clear_line()
        for note in notes:
            t.warn(note)
        self.show_recommended()
        choice = t.select(
            "What now?",
            [
                Option("accept", "Accept the recommended config"),
                Option("adjust", "Adjust it step by step"),
                Option("cancel", "Cancel (write nothing)"),
            ],
        )
        if choice == "cancel":
            raise Cancelled()
        intent = self.rec.intent if choice == "accept" else self.adjust()
        return self.finish(intent)

    def finish(self, intent: SetupIntent) -> int:
        from akm import api

        t = self.t
        t.heading("With this config you can run")
        for line in api.setup_preview(intent, cwd=self.cwd, project=self.project):
            t.write(f"  {t.bullet} {line}")
        t.write()
        if not t.confirm(f"Save to {self.target}?", default=True):
            t.write("Nothing was written.")
            return 0
        res = api.setup_save(intent, cwd=self.cwd, project=self.project, probe=True, on_warning=t.warn)
        for a in res.engines:
            detail = f" — {a['detail']}" if a["detail"] else ""
            t.write(f"  {a['action']} {a['kind']} engine {t.bold(a['engine'])}{detail}")
        if res.json_schema and res.json_schema.get("supported") is not None:
            t.write(
                f"  json_schema output: {'supported' if res.json_schema['supported'] else 'not supported'}"
                f" by {res.json_schema['engine']}"
            )
        t.ok(f"Saved {res.config_path}" if res.written else f"{res.config_path} already says this; nothing to write")
        t.write(t.dim("Change it later with `akm config set …`, or run `akm setup` again."))
        return 0

    # ------------------------------------------------------------------ what was found

    def _default(self, key: str) -> str | None:
        return (self.current.get("defaults") or {}).get(key)

    def _engine(self, name: str | None) -> dict[str, Any]:
        return (self.current.get("engines") or {}).get(name or "", {}) or {}

    def show_found(self) -> None:
        t, det = self.t, self.det
        t.heading("Found")
        answering = det.answering
        if answering:
            for s in answering:
                models = ", ".join(s.chat_models[:6]) + (" …" if len(s.chat_models) > 6 else "")
                t.write(f"  model server   {s.label} at {s.base}: {models or 'no chat model listed'}")
        silent = [s for s in det.servers if not s.answered]
        if silent:
            t.write(t.dim(f"  no answer at   {', '.join(s.base for s in silent)}"))
        if det.ollama_cli_models:
            t.write(
                f"  ollama CLI     installed models: {', '.join(det.ollama_cli_models[:6])} "
                f"(its server is not answering)"
            )
        if det.agent_clis:
            t.write(
                "  agent CLIs     "
                + ", ".join(c.platform + (f" {c.version}" if c.version else "") for c in det.agent_clis)
            )
            untested = [c.platform for c in det.agent_clis if c.tested_version is None]
            if untested:
                t.write(t.dim(f"                 not tested by akm (driven by their docs): {', '.join(untested)}"))
        else:
            t.write(t.dim("  agent CLIs     none on PATH"))
        for h in det.harness_configs:
            bits = [
                f"model {h.model}" if h.model else "",
                f"base URL {h.base_url}" if h.base_url else "",
                f"key in ${h.api_key_env}" if h.api_key_env else "",
                h.note or "",
            ]
            name = {"claude-code": "Claude Code", "opencode": "OpenCode"}.get(h.harness, h.harness)
            t.write(
                f"  harness config {name}" + (f" ({h.file})" if h.file else "") + ": " + "; ".join(b for b in bits if b)
            )
        if det.env_vars:
            t.write(
                f"  variables set  {', '.join(e.name for e in det.env_vars)} "
                + t.dim("(names only; values are never read)")
            )

    def show_recommended(self) -> None:
        t, intent = self.t, self.rec.intent
        t.heading("Recommended")
        llm_default = self._default("llmEngine")
        if intent.llm is not None:
            t.write(f"  LLM engine     {intent.llm.label} " + t.green("(answered)"))
        elif llm_default:
            t.write(f"  LLM engine     keep {llm_default} ({self._engine(llm_default).get('model')})")
        else:
            t.write("  LLM engine     none found: LLM units will be done by the calling agent")
        agent_default = self._default("agentEngine")
        if intent.agent is not None:
            t.write(f"  agent engine   {intent.agent.label}")
        elif agent_default:
            t.write(f"  agent engine   keep {agent_default} ({self._engine(agent_default).get('platform')})")
        else:
            t.write("  agent engine   none found: agent units will be done by the calling agent")
        judge = (self.current.get("workflow") or {}).get("judgeEngine")
        if judge:
            t.write(f"  gate judge     keep {judge}")
        elif intent.llm is not None or llm_default:
            t.write("  gate judge     the LLM engine")
        elif intent.agent is not None or agent_default:
            t.write("  gate judge     the agent engine")
        else:
            t.write("  gate judge     the calling agent")
        t.write()

    # ------------------------------------------------------------------ adjusting

    def adjust(self) -> SetupIntent:
        intent = SetupIntent(judge="keep")
        clear: list[str] = []
        llm_choice, llm_none = self.step_llm()
        intent.llm = llm_choice
        if llm_none and self._default("llmEngine"):
            clear.append("llmEngine")
        agent_choice, agent_none = self.step_agent(llm_choice)
        intent.agent = agent_choice
        if agent_none and self._default("agentEngine"):
            clear.append("agentEngine")
        intent.clear_defaults = tuple(clear)
        intent.judge = self.step_judge(intent, llm_none, agent_none)
        return intent

    def step_llm(self) -> tuple[EngineChoice | None, bool]:
        """(the chosen LLM engine or None, whether the user chose "none")."""
        t = self.t
        t.heading("Step 1/3  LLM connection")
        t.write(t.dim("  LLM units and judges send one chat request per call to this endpoint."))
        env_names = {e.name for e in self.det.env_vars}
        options: list[Option] = []
        default = None
        for s in self.det.servers:
            if s.answered and s.chat_models:
                if s is self.rec.llm_server:
                    default = len(options)
                options.append(
                    Option(
                        ("server", s),
                        f"{s.label} at {s.base}",
                        f"{len(s.chat_models)} model{'s' if len(s.chat_models) != 1 else ''}"
                        + (" — recommended" if s is self.rec.llm_server else ""),
                    )
                )
            elif s.source.startswith("harness:"):
                options.append(Option(("server", s), f"{s.label} at {s.base}", f"not answering: {s.error}"))
        for preset in PRESETS:
            key_env = next((n for n in preset[4] if n in env_names), None)
            hint = f"key in ${key_env}" if key_env else f"needs ${preset[4][0]}"
            options.append(Option(("preset", preset), preset[1], hint))
        options.append(Option(("custom", None), "Custom OpenAI-compatible endpoint", "URL, model, key variable"))
        current = self._default("llmEngine")
        if current:
            if default is None:
                default = len(options)
            options.append(Option(("keep", None), f"Keep current: {current}", self._engine(current).get("model", "")))
        if default is None:
            default = len(options)
        options.append(Option(("none", None), "None", "LLM units will be done by the calling agent"))
        while True:
            kind, payload = t.select("Which LLM connection?", options, default)
            if kind == "keep":
                return None, False
            if kind == "none":
                return None, True
            choice = self.connection(kind, payload)
            if choice is not None:
                return choice, False

    def connection(self, kind: str, payload: Any) -> EngineChoice | None:
        """Ask for the details of one connection and verify it; None = go back to the list."""
        from akm import api

        t = self.t
        if kind == "server":
            s = payload
            endpoint, hint, key_env = s.endpoint, s.provider, s.api_key_env
            models = s.chat_models or s.models
            if len(models) > 1:
                idx = models.index(s.default_model) if s.default_model in models else 0
                model = t.select("Which model?", [Option(m, m) for m in models], idx)
            elif models:
                model = models[0]
            else:
                model = t.text("Model name", default=s.default_model, required=True)
            label = f"{s.label}: {model} at {endpoint}"
            short = f"{model} at {s.base}"
        elif kind == "preset":
            hint, name, base, model_default, key_names = payload
            env_names = {e.name for e in self.det.env_vars}
            key_env = t.text(
                "Environment variable holding the API key",
                default=next((n for n in key_names if n in env_names), key_names[0]),
                validate=validate_env_name,
                required=True,
                conceal_rejected=True,
            )
            model = t.text("Model", default=model_default, required=True)
            endpoint = normalize_chat_endpoint(base)
            label = short = f"{name}: {model}"
        else:
            hint = "custom"
            raw = t.text(
                "Endpoint URL", placeholder="http://127.0.0.1:8000/v1", validate=validate_endpoint, required=True
            )
            endpoint = normalize_chat_endpoint(raw)
            model = t.text("Model", required=True)
            key_env = (
                t.text(
                    "Environment variable holding the API key (optional)",
                    placeholder="MY_LLM_API_KEY",
                    validate=validate_env_name,
                    conceal_rejected=True,
                )
                or None
            )
            label = f"custom endpoint: {model} at {endpoint}"
            short = f"{model} at {raw}"
        t.status(f"Checking {endpoint} with model {model}…")
        v = api.setup_verify(endpoint, model, key_env)
        t.clear_line()
        engine: dict[str, Any] = {"kind": "llm", "provider": hint, "endpoint": v.endpoint or endpoint, "model": model}
        if key_env:
            engine["apiKey"] = "${" + key_env + "}"
        choice = EngineChoice(engine, hint, force_default=True, match_model=True, label=label, short=short)
        if v.ok:
            t.ok(f"{endpoint} answered")
            return choice
        t.warn(f"{endpoint} did not answer as expected: {v.reason}")
        what = t.select(
            "What now?",
            [
                Option("back", "Choose another connection (or enter it again)"),
                Option("anyway", "Use it anyway (fix the server or key later)"),
            ],
        )
        return choice if what == "anyway" else None

    def step_agent(self, llm_choice: EngineChoice | None) -> tuple[EngineChoice | None, bool]:
        t = self.t
        t.heading("Step 2/3  Agent engine")
        t.write(t.dim("  Agent units run a coding-agent CLI in the project (files, tools, shell)."))
        options: list[Option] = []
        for i, cli in enumerate(self.det.agent_clis):
            options.append(Option(("cli", cli), cli.platform, cli.path + (" — recommended" if i == 0 else "")))
        llm_label = (
            (llm_choice.short or llm_choice.label)
            if llm_choice
            else (f"engine {self._default('llmEngine')}" if self._default("llmEngine") else None)
        )
        if llm_label:
            for cli in self.det.agent_clis:
                if cli.platform in PLATFORMS_WITH_LLM_ENGINE:
                    options.append(
                        Option(
                            ("on-llm", cli),
                            f"{cli.platform} on the LLM connection",
                            f"runs {cli.platform} on {llm_label}",
                        )
                    )
        current = self._default("agentEngine")
        default = 0
        if current:
            if not self.det.agent_clis:
                default = len(options)
            options.append(
                Option(("keep", None), f"Keep current: {current}", self._engine(current).get("platform", ""))
            )
        if not options:
            t.write(
                "  No agent CLI found on PATH (opencode, claude, codex, copilot, pi, gemini, aider, q, "
                "openhands): agent units will be done by the calling agent."
            )
            return None, False
        options.append(Option(("none", None), "None", "agent units will be done by the calling agent"))
        kind, cli = t.select("Which agent engine?", options, default)
        if kind == "keep":
            return None, False
        if kind == "none":
            return None, True
        if kind == "on-llm":
            if llm_choice is not None:
                return EngineChoice(
                    {"kind": "agent", "platform": cli.platform},
                    f"{cli.platform}-llm",
                    force_default=True,
                    on_llm=True,
                    label=f"{cli.platform} on {llm_label}",
                ), False
            engine = {"kind": "agent", "platform": cli.platform, "llmEngine": self._default("llmEngine")}
            return EngineChoice(
                engine, f"{cli.platform}-llm", force_default=True, label=f"{cli.platform} on {llm_label}"
            ), False
        return EngineChoice(
            {"kind": "agent", "platform": cli.platform},
            cli.platform,
            force_default=True,
            label=f"{cli.platform} ({cli.path})",
        ), False

    def step_judge(self, intent: SetupIntent, llm_none: bool, agent_none: bool) -> str:
        t = self.t
        t.heading("Step 3/3  Gate judge")
        t.write(t.dim("  A gated step's work is checked against its rubric by this judge."))
        has_llm = intent.llm is not None or (self._default("llmEngine") and not llm_none)
        has_agent = intent.agent is not None or (self._default("agentEngine") and not agent_none)
        options: list[Option] = []
        if has_llm:
            options.append(Option("llm", "The LLM engine", "one chat request per verdict"))
        if has_agent:
            options.append(Option("agent", "The agent engine", "runs the agent CLI per verdict"))
        options.append(Option("session", "The calling agent", "the agent driving the run gives the verdict"))
        current = (self.current.get("workflow") or {}).get("judgeEngine")
        if current:
            options.append(Option("keep", f"Keep current: {current}"))
        return t.select("Who judges gates?", options, 0)
