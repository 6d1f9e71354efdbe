"""Agent units: run a harness CLI (claude, codex, opencode, …) once per attempt.

The profile of each harness (argv, prompt channel, output format) lives in
`akm.dispatch.harnesses`; this module runs it like an exec unit is run:

* its own process group, stdin from `/dev/null` (or the prompt, for harnesses
  that read a long prompt from stdin), killed as a group on cancel or timeout
  (SIGTERM, SIGKILL after a grace), and swept when the main process exits but
  a descendant still holds the pipes (D9); the guardian token rides along (D18);
* an environment built from nothing: the exec allowlist, the harness's own
  variables (its API key, its config dir), the engine's `envPassthrough`, then
  the unit's `env:` bindings — nothing else of akm's environment leaks;
* the working directory is the request's `cwd` (the project root, or the
  unit's isolation worktree);
* everything returned is scrubbed of the unit's secrets, of every passthrough
  value that is not known to be harmless, and of the LLM key an agent on an
  `llmEngine` was given.

Agents usually print their final answer last, so output is kept as a bounded
TAIL (the last `MAX_STDOUT_BYTES`), not a head.

While the CLI runs its lines are watched (`akm.dispatch.agent_stream`): a refused
key stops it at once (`agent_auth`), a rate limit or server error it keeps
retrying stops it after `HARNESS_RETRIES` retries, and what it does (turns, tool
calls, retries) is reported to `request.on_activity` as live progress. A failure
the CLI reports with the model API's HTTP status is coded by that status, not by
the CLI's exit code: 401/403 `agent_auth`, 429 `llm_rate_limit`, else `agent_error`.

Process supervision (group, timeout/cancel, drain grace, guardian token, capture
caps, redaction at the cut) is `akm.dispatch.process.run_process`, the same code
exec units run through.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from typing import Any, Mapping

from akm.dispatch import harnesses as hz
from akm.dispatch.agent_stream import Activity, StreamWatch, reason_for_status, refused_key_message
from akm.dispatch.base import UnitRequest
from akm.dispatch.exec import EXEC_ENV_ALLOWLIST, _supplement_path
from akm.dispatch.llm import LlmCallError, resolve_api_key
from akm.dispatch.process import ProcessResult, run_process
from akm.dispatch.redact import clip, redact_text, sensitive_values_from
from akm.dispatch.types import DIAGNOSTIC_CLIP, DispatchResult

MAX_STDOUT_BYTES = 16 * 1024 * 1024
MAX_STDERR_BYTES = 1024 * 1024
POLL_S = 0.05
STDERR_TAIL = 1500


# --------------------------------------------------------------------------- environment


def agent_env(
    profile: hz.Profile, engine: Mapping[str, Any], request: UnitRequest, parent: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """(child environment, the passthrough names that came from akm's environment)."""
    names = [
        *EXEC_ENV_ALLOWLIST,
        *hz.COMMON_PASSTHROUGH,
        *profile.env_passthrough,
        *(engine.get("envPassthrough") or []),
    ]
    env: dict[str, str] = {}
    passed: list[str] = []
    for name in dict.fromkeys(names):
        if name in parent:
            env[name] = parent[name]
            passed.append(name)
    if "PATH" in env:
        env["PATH"] = _supplement_path(env["PATH"], parent.get("HOME") or os.path.expanduser("~"))
    env.update(request.env_bindings)
    env.update({"AKM_RUN_ID": request.run_id, "AKM_STEP_ID": request.step_id, "AKM_UNIT_ID": request.unit_id})
    if request.trace_env:
        env.update(request.trace_env)  # TRACEPARENT (and OTEL_*): a CLI that traces joins the run's trace
    return env, passed


# A passthrough value that is a switch or a small count (`OPENCODE_DISABLE_MODELS_FETCH=true`,
# `CLAUDE_CODE_MAX_RETRIES=3`) is no secret; scrubbing it would turn every "true" an agent answers into
# [REDACTED] — a JSON answer `{"ok": true}` included.
_SWITCH_VALUE = re.compile(r"(?i)(true|false|yes|no|on|off|\d{1,5})")


def unsafe_values(env: Mapping[str, str], names: list[str]) -> list[str]:
    """Values of passthrough variables that may be secrets (anything not on the harmless list and not a
    switch, and the credential parts of a harmless one that carries URL credentials)."""
    secret = {
        n: env[n]
        for n in names
        if n in env and n not in hz.SAFE_ENV_NAMES and not _SWITCH_VALUE.fullmatch(env[n].strip())
    }
    values = sensitive_values_from(secret)
    for n in names:
        v = env.get(n, "")
        if n in hz.SAFE_ENV_NAMES and "://" in v and "@" in v:
            values += sensitive_values_from({n: v})
    return values


# --------------------------------------------------------------------------- the dispatcher


class AgentDispatcher:
    """Dispatcher for `agent` units (see the module docstring).

    A corrective follow-up (`feedback`) is appended to the prompt after a blank
    line: harness CLIs are one-shot, so the follow-up is a fresh call that
    carries the original task and what was wrong with the previous answer.
    An engine snapshot with `concurrency` caps how many of its processes run at once.
    """

    kind = "agent"

    def __init__(self, *, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ
        self._gates: dict[tuple[str, int], threading.BoundedSemaphore] = {}
        self._gates_lock = threading.Lock()

    def _gate(self, name: str, width: int | None) -> threading.BoundedSemaphore | None:
        if not width:
            return None
        with self._gates_lock:
            return self._gates.setdefault((name, width), threading.BoundedSemaphore(width))

    def dispatch(self, request: UnitRequest, cancel: threading.Event, feedback: str | None = None) -> DispatchResult:
        engine = request.engine or {}
        platform = str(engine.get("platform") or "")
        label = _label(request, engine)
        secrets = list(request.sensitive_values)
        profile = hz.PROFILES.get(platform)
        if engine.get("kind") != "agent" or profile is None:
            return _failure(
                "dispatch_error",
                f"{label}: the plan has no agent engine snapshot with a known platform (got {platform or 'none'!r})",
                secrets,
            )
        if cancel.is_set():
            return _failure("aborted", f"{label} was not started: the run was interrupted", secrets)
        parent = self._parent_env(request)
        try:
            llm, llm_key = _llm_of(engine, parent)
        except LlmCallError as exc:
            return _failure("dispatch_error", f"{label}: {exc.message}", secrets)
        if llm_key:
            secrets.append(llm_key)
        tmpdir = tempfile.mkdtemp(prefix="akm-agent-") if request.output_schema is not None else None
        try:
            call = _call(engine, profile, request, feedback, tmpdir, llm, llm_key)
            try:
                built = hz.build(platform, call)
            except hz.HarnessError as exc:
                return _failure("dispatch_error", f"{label}: {exc}", secrets)
            env = _harness_env(built, profile, engine, request, parent, secrets)
            missing = _locate(built, env, platform)
            if missing is not None:
                return _failure("spawn_failed", f"{label}: {missing}", secrets)
            watch = StreamWatch(platform, retries=hz.HARNESS_RETRIES, on_activity=_relay(request))
            proc = self._run_gated(engine, platform, built, env, request, cancel, secrets, watch)
            if proc is None:
                return _failure("aborted", f"{label} was not started: the run was interrupted", secrets)
            return self._result(label, platform, request, proc, secrets, watch)
        except Exception as exc:  # a bug must not escape a dispatcher (base.py contract)
            return _failure("dispatch_error", f"{label} failed inside akm: {type(exc).__name__}: {exc}", secrets)
        finally:
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)

    def _parent_env(self, request: UnitRequest) -> Mapping[str, str]:
        """The environment the agent's is drawn from: the request's, else this dispatcher's, else akm's."""
        if request.parent_env is not None:
            return request.parent_env
        return self._environ if self._environ is not None else os.environ

    def _run_gated(
        self,
        engine: Mapping[str, Any],
        platform: str,
        built: hz.Built,
        env: dict[str, str],
        request: UnitRequest,
        cancel: threading.Event,
        secrets: list[str],
        watch: StreamWatch,
    ) -> ProcessResult | None:
        """Run the harness once the engine's concurrency gate lets it; None when the run was interrupted while
        it waited for the gate (nothing was started)."""
        gate = self._gate(str(engine.get("name") or platform), engine.get("concurrency"))
        if gate is not None:
            while not gate.acquire(timeout=POLL_S):
                if cancel.is_set():
                    return None
        try:
            return run_process(
                built.argv,
                cwd=request.cwd,
                env=env,
                stdin_text=built.stdin,
                timeout_ms=request.timeout_ms,
                cancel=cancel,
                capture_limit=MAX_STDOUT_BYTES,
                stderr_limit=MAX_STDERR_BYTES,
                stdout_keep="tail",
                sensitive_values=secrets,
                on_line=watch.line if watch.watches else None,
            )
        finally:
            if gate is not None:
                gate.release()

    def _result(
        self,
        label: str,
        platform: str,
        request: UnitRequest,
        proc: ProcessResult,
        secrets: list[str],
        watch: StreamWatch,
    ) -> DispatchResult:
        if proc.spawn_error is not None:
            return _failure("spawn_failed", f"{label} could not start {platform}: {proc.spawn_error}", secrets)
        got = hz.extract(platform, proc.stdout, proc.stderr)
        session = got.session_id or watch.activity.session_id
        session = redact_text(session, secrets) if session else None
        text = redact_text(got.text, secrets) or None
        said = redact_text(got.error, secrets) if got.error else None
        # The CLI's own error says why; its stderr tail only adds to it what is not banner or stack frames.
        stderr = redact_text(hz.quiet_stderr(platform, proc.stderr), secrets).strip()
        if said and got.parsed and stderr and platform == "gemini":
            stderr = ""  # gemini's stderr then holds the same error again, after a stack trace
        tail = (
            f". stderr (last {STDERR_TAIL} chars):\n…{stderr[-STDERR_TAIL:]}"
            if len(stderr) > STDERR_TAIL
            else (f". stderr:\n{stderr}" if stderr else "")
        )
        extra: dict[str, Any] = {"text": text, "session_id": session, "tokens": got.tokens, "usage": got.usage}
        if proc.cancelled:
            return _failure(
                "aborted",
                f"{label} was cancelled while running; its process group was terminated{tail}",
                secrets,
                **extra,
            )
        stop = watch.stop
        if proc.stopped is not None and stop is not None:
            return _failure(stop.reason, f"{label}: {stop.message}; its process group was terminated", secrets, **extra)
        if proc.timed_out:
            seen = _activity_words(watch.activity)
            return _failure(
                "timeout",
                f"{label} timed out after {request.timeout_ms} ms{seen}; its process group was terminated{tail}",
                secrets,
                **extra,
            )
        if said is not None and got.no_credentials:
            return _failure(
                "agent_auth",
                f"{label}: {platform} has no usable credentials, so it asked no model: {said}",
                secrets,
                **extra,
            )
        if said is not None and got.api_status is not None:
            # the CLI told us which HTTP status its model API answered: that, not its exit code, is the failure
            reason = reason_for_status(got.api_status)
            words = (
                refused_key_message(platform, got.api_status, said)
                if reason == "agent_auth"
                else f"{platform} failed: {said}"
            )
            return _failure(reason, f"{label}: {words}", secrets, **extra)
        if proc.signal is not None or proc.exit_code != 0:
            what = f"was killed by signal {proc.signal}" if proc.signal is not None else f"exited {proc.exit_code}"
            detail = f": {said}" if said else ""
            return _failure("non_zero_exit", f"{label}: {platform} {what}{detail}{tail}", secrets, **extra)
        if proc.capture_error is not None:
            return _failure(
                "spawn_failed",
                f"{label}: output capture did not complete ({proc.capture_error}): a "
                "background process kept stdout/stderr open after the harness exited; its process group "
                f"was killed{tail}",
                secrets,
                session_id=session,
                tokens=got.tokens,
                usage=got.usage,
            )
        if said is not None:
            return _failure(
                "agent_error", f"{label}: {platform} exited 0 but reported a failure: {said}{tail}", secrets, **extra
            )
        if proc.stdout_truncated and not got.parsed:
            return DispatchResult(
                ok=False,
                failure_reason="agent_output_limit",
                truncated=True,
                session_id=session,
                tokens=got.tokens,
                usage=got.usage,
                text=text,
                error=clip(
                    f"{label}: {platform} printed more than {MAX_STDOUT_BYTES} bytes and its "
                    "output is not in the harness's structured format, so the answer is "
                    "incomplete; nothing was promoted",
                    DIAGNOSTIC_CLIP,
                ),
            )
        return DispatchResult(ok=True, text=text, tokens=got.tokens, usage=got.usage, session_id=session)


def _label(request: UnitRequest, engine: Mapping[str, Any]) -> str:
    """How messages name the attempt: `agent unit <attempt> on engine '<name>'`."""
    return f"agent unit {request.attempt_id} on engine {request.engine_name or engine.get('name', '?')!r}"


def _llm_of(engine: Mapping[str, Any], parent: Mapping[str, str]) -> tuple[dict[str, Any] | None, str | None]:
    """The model API an agent engine routes its CLI to (`llm:`), and that API's key read from `parent`
    (LlmCallError when it names a variable that is not set)."""
    llm = engine.get("llm") if isinstance(engine.get("llm"), dict) else None
    return llm, (resolve_api_key(llm, parent) if llm is not None else None)


def _call(
    engine: Mapping[str, Any],
    profile: hz.Profile,
    request: UnitRequest,
    feedback: str | None,
    tmpdir: str | None,
    llm: dict[str, Any] | None,
    llm_key: str | None,
) -> hz.Call:
    """What the harness is asked: the engine's binary and arguments (else the platform's), the prompt (with
    the feedback of a previous attempt after it), the model, the output schema (written to a file in `tmpdir`
    for the CLIs that read it from one)."""
    prompt = f"{request.prompt}\n\n{feedback}" if feedback else request.prompt
    return hz.Call(
        bin=str(engine.get("bin") or profile.bin),
        args=list(engine["args"]) if isinstance(engine.get("args"), list) else list(profile.base_args),
        prompt=prompt,
        system_prompt=request.system_prompt,
        model=request.model,
        schema=request.output_schema,
        schema_path=os.path.join(tmpdir, "output-schema.json") if tmpdir else None,
        llm=llm,
        llm_api_key=llm_key,
    )


def _harness_env(
    built: hz.Built,
    profile: hz.Profile,
    engine: Mapping[str, Any],
    request: UnitRequest,
    parent: Mapping[str, str],
    secrets: list[str],
) -> dict[str, str]:
    """Write the schema file the harness reads, and give it its environment: the agent's, then what the
    harness sets and defaults. The values that must not be printed join `secrets`."""
    if built.schema_file is not None:
        with open(built.schema_file[0], "w", encoding="utf-8") as fh:
            fh.write(built.schema_file[1])
    env, passed = agent_env(profile, engine, request, parent)
    env.update(built.env)
    for name, value in built.env_defaults.items():
        env.setdefault(name, value)
    secrets.extend(unsafe_values(env, passed))
    secrets.extend(
        sensitive_values_from(
            {k: v for k, v in built.env.items() if k not in hz.SAFE_ENV_NAMES and k != "OPENCODE_CONFIG_CONTENT"}
        )
    )
    return env


def _locate(built: hz.Built, env: Mapping[str, str], platform: str) -> str | None:
    """Put the harness's full path in its argv (a bare name is looked up on the agent's PATH); why it cannot
    be started when it is not there, else None."""
    exe = built.argv[0]
    if os.sep not in exe and not (os.altsep and os.altsep in exe):
        found = shutil.which(exe, path=env.get("PATH", os.defpath))
        if found is None:
            return f"{exe!r} ({platform}) is not on PATH ({env.get('PATH', '')}); nothing was started"
        built.argv[0] = found
    return None


def _activity_words(a: Activity) -> str:
    """What the CLI was seen doing, for a timeout's message ("" when it said nothing)."""
    parts = []
    if a.turns:
        parts.append(f"{a.turns} turn(s)")
    if a.tool_calls:
        parts.append(f"{a.tool_calls} tool call(s), the last {a.tool}")
    if a.retries:
        parts.append(f"{a.retries} failed model call(s)" + (f" (HTTP {a.retry_status})" if a.retry_status else ""))
    return f" (it had done {', '.join(parts)})" if parts else " (its output showed no progress)"


def _relay(request: UnitRequest) -> Any:
    """The watch's activity as the request's progress callback wants it (None: nobody listens)."""
    listener = request.on_activity
    if listener is None:
        return None

    def relay(activity: Activity) -> None:
        try:
            listener(activity.to_json())
        except Exception:
            pass  # progress is best effort: a listener's bug must not fail the unit

    return relay


def _failure(
    reason: str,
    error: str,
    secrets: list[str],
    *,
    text: str | None = None,
    session_id: str | None = None,
    tokens: int | None = None,
    usage: dict[str, Any] | None = None,
) -> DispatchResult:
    return DispatchResult(
        ok=False,
        failure_reason=reason,
        error=clip(redact_text(error, secrets), DIAGNOSTIC_CLIP),
        text=text,
        session_id=session_id,
        tokens=tokens,
        usage=usage,
    )
