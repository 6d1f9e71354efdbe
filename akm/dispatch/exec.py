"""Run one exec (command) unit: argv, no shell, bounded capture, group kill.

Why this shape (spec/engine.md, spec/decisions.md D9):

* The argv goes straight to execve — no shell — so nothing authored or produced
  by a previous step can be interpreted as shell syntax.
* The environment is built from nothing (allowlist, then `env:` bindings, then
  the engine's `AKM_*` context), so credentials in akm's own environment do not
  leak into arbitrary commands, and a binding can never spoof the context.
* `exec.cwd` must stay inside the unit's base directory (checked on real paths),
  and the context must fit the platform's environment limits; either problem
  fails the unit before anything starts.
* Supervision — own process group, timeout and cancel with group kill, bounded
  capture that spills to disk, the post-exit drain grace (D9), the guardian
  token, redaction at the capture cut — is `akm.dispatch.process`, shared with
  agent CLIs. This module maps its `ProcessResult` onto a unit outcome: a leader
  that exited 0 while a descendant kept the pipes open fails `spawn_failed` and
  its partial stdout is never promoted; stdout over `STDOUT_CAPTURE_BYTES` is an
  artifact marked `truncated` (the engine decides what a step makes of it).

Everything returned is redacted against the request's sensitive values and the
diagnostic is clipped, so callers can journal the result as-is.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import sys
import threading
from typing import Any, Mapping

from akm.canonical import canonical_json
from akm.dispatch.process import ProcessResult, run_process
from akm.dispatch.redact import clip, redact_text, redact_value
from akm.dispatch.types import DIAGNOSTIC_CLIP, DispatchResult
from akm.record import dataclass, field
from akm.text import JS_WHITESPACE

DEFAULT_EXEC_TIMEOUT_MS = 600_000
# The stdout a unit may produce as its artifact (and what its journal row may hold): the
# first 1 MiB is kept, the rest is drained and counted. stderr keeps its last 64 KiB (the
# diagnostic shows the last 1500 characters of it).
STDOUT_CAPTURE_BYTES = 1024 * 1024
STDERR_CAPTURE_BYTES = 64 * 1024

STDERR_DIAGNOSTIC_CLIP = DIAGNOSTIC_CLIP - 500


# Copied from akm's environment when present (never set to ""). Credentials,
# cloud/CI and proxy variables are deliberately absent: use `env:` or pass_env.
EXEC_ENV_ALLOWLIST: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TZ",
    "TMPDIR",
    "SystemRoot",
    "SystemDrive",
    "WINDIR",
    "COMSPEC",
    "PATHEXT",
    "USERPROFILE",
    "HOMEDRIVE",
    "HOMEPATH",
    "APPDATA",
    "LOCALAPPDATA",
    "TEMP",
    "TMP",
    "ProgramData",
    "ProgramFiles",
    "AKM_EVENT_SOURCE",
)

# Well-known user bin dirs prepended to an allowlisted PATH that looks like a
# scheduler's minimal PATH (no entry under $HOME).
_POSIX_USER_BIN_DIRS = (
    "~/.bun/bin",
    "~/.cargo/bin",
    "~/.local/bin",
    "/opt/homebrew/bin",
    "/opt/homebrew/sbin",
    "/usr/local/bin",
)

# (per-variable bytes, total bytes, where the number comes from)
_CONTEXT_LIMITS_POSIX = (98_304, 131_072, "POSIX/Linux: one execve string is capped at 128 KiB (MAX_ARG_STRLEN)")
_CONTEXT_LIMITS_WIN32 = (32_767, 64_000, "Windows: an environment variable value is capped at 32,767 characters")

_TRAILING_NEWLINES = re.compile(r"(?:\r?\n)+\Z")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass
class ExecRequest:
    """One attempt of an exec unit, fully resolved by the engine."""

    command: list[str]
    base_dir: str
    cwd: str | None = None
    pass_env: list[str] | None = None
    inherit_env: bool = False
    env_bindings: dict[str, str] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)
    timeout_ms: int | None = DEFAULT_EXEC_TIMEOUT_MS
    sensitive_values: list[str] = field(default_factory=list)
    # The environment to draw from (default: os.environ). A fan-out passes one plain-dict
    # snapshot for all its units (never changed once passed): os.environ encodes and decodes
    # on every lookup, and the part of the environment built from a snapshot is reused.
    parent_env: Mapping[str, str] | None = None


# --------------------------------------------------------------------------- context


def build_exec_context(
    *,
    run_id: str,
    step_id: str,
    unit_id: str,
    params: Any,
    item: Any = MISSING,
    item_index: int | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The `AKM_*` variables a command sees (spec/engine.md "Exec units").

    `unit_id` must be the BASE content id (no `~r`/`~l` suffix) so every retry
    and gate loop sees the same value. `item`/`item_index` are given for map
    units only; `inputs` only when the step declares inputs.
    """
    ctx: dict[str, str] = {
        "AKM_RUN_ID": str(run_id),
        "AKM_STEP_ID": str(step_id),
        "AKM_UNIT_ID": str(unit_id),
        "AKM_PARAMS": canonical_json(params if params is not None else {}),
    }
    if item is not MISSING:
        if item_index is None:
            raise ValueError("build_exec_context: a map unit needs item_index with item")
        ctx.update(item_context(item, item_index))
    if inputs is not None:
        ctx["AKM_INPUTS"] = canonical_json(dict(inputs))
    return ctx


def item_context(item: Any, item_index: int) -> dict[str, str]:
    """The per-item part of a map unit's context (the rest is shared by the step's units)."""
    return {"AKM_ITEM": canonical_json(item), "AKM_ITEM_INDEX": str(int(item_index))}


def check_exec_context(context: Mapping[str, str], platform: str | None = None) -> str | None:
    """Return an error message when the context is too large to pass, else None.

    Measured in UTF-8 bytes over the context only: each variable first (map
    order), then the total of name + "=" + value. Limits are the running
    platform's; there is no spill-to-file fallback — bulk data belongs in a
    file whose path a step passes along.
    """
    per_var, total_limit, source = (
        _CONTEXT_LIMITS_WIN32 if (platform or sys.platform) == "win32" else _CONTEXT_LIMITS_POSIX
    )
    # A character is at most 4 UTF-8 bytes: a context this short is within every limit
    # without encoding it (the common case, checked once per unit).
    if 4 * sum(len(name) + len(value) + 1 for name, value in context.items()) <= min(per_var, total_limit):
        return None
    advice = "Pass a reference (a file path or an id) to bulk data instead of the data itself."
    total = 0
    for name, value in context.items():
        size = len(value.encode("utf-8"))
        if size > per_var:
            return (
                f"exec context variable {name} is {size} bytes, over the {per_var}-byte per-variable limit "
                f"({source}); nothing was started. {advice}"
            )
        total += size + len(name.encode("utf-8")) + 1
    if total > total_limit:
        names = ", ".join(context)
        return (
            f"exec context variables ({names}) total {total} bytes, over the {total_limit}-byte limit "
            f"({source}); nothing was started. {advice}"
        )
    return None


# --------------------------------------------------------------------------- environment


@functools.lru_cache(maxsize=16)
def _supplement_path(path: str, home: str | None) -> str:
    """Prepend existing user bin dirs when PATH has no entry under $HOME.

    Cached: a fan-out would otherwise stat the same directories for every unit.
    """
    if os.name == "nt" or not home:
        return path
    entries = [p for p in path.split(os.pathsep) if p]
    home_prefix = home.rstrip("/") + "/"
    if any(p == home or p.startswith(home_prefix) for p in entries):
        return path
    extra: list[str] = []
    for d in _POSIX_USER_BIN_DIRS:
        full = home + d[1:] if d.startswith("~") else d
        if full not in entries and full not in extra and os.path.isdir(full):
            extra.append(full)
    if not extra:
        return path
    return os.pathsep.join(extra + ([path] if path else []))


CONTEXT_NAMES = frozenset(
    {"AKM_RUN_ID", "AKM_STEP_ID", "AKM_UNIT_ID", "AKM_PARAMS", "AKM_ITEM", "AKM_ITEM_INDEX", "AKM_INPUTS", "AKM_GUARD"}
)


def build_exec_env(req: ExecRequest, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """Child environment: base (allowlist or whole parent), then bindings, then context."""
    env = dict(_base_env(req, os.environ if parent is None else parent))
    env.update(req.env_bindings)
    env.update(req.context)
    return env


# The last base environment built from a snapshot (`ExecRequest.parent_env`): every unit of a
# fan-out shares it. Never for `os.environ` itself, which may change between two units.
_last_base: tuple[Mapping[str, str], tuple[str, ...], bool, dict[str, str]] | None = None


def _base_env(req: ExecRequest, parent: Mapping[str, str]) -> dict[str, str]:
    global _last_base
    pass_env = tuple(req.pass_env or ())
    last = _last_base
    if last is not None and last[0] is parent and last[1] == pass_env and last[2] == req.inherit_env:
        return last[3]
    if req.inherit_env:
        # A nested akm (started from an outer run's unit) has the outer unit's context in
        # its own environment: none of it may leak into this unit's context.
        env = {k: v for k, v in parent.items() if k not in CONTEXT_NAMES}
    else:
        env = {}
        for name in EXEC_ENV_ALLOWLIST + pass_env:
            if name in parent:
                env[name] = parent[name]
        if "PATH" in env:
            env["PATH"] = _supplement_path(env["PATH"], parent.get("HOME") or os.path.expanduser("~"))
    if parent is not os.environ:
        _last_base = (parent, pass_env, req.inherit_env, env)
    return env


@functools.lru_cache(maxsize=256)
def _resolve_dirs(base_dir: str, cwd: str | None) -> tuple[str, str, str, str, bool]:
    """(base, target, realpath(base), realpath(target), target inside base). Cached: every
    unit of a fan-out shares them, and symlink resolution costs a syscall per path component."""
    base = os.path.abspath(base_dir)
    target = os.path.normpath(os.path.join(base, cwd)) if cwd else base
    real_base, real_target = os.path.realpath(base), os.path.realpath(target)
    try:
        contained = os.path.commonpath([real_base, real_target]) == real_base
    except ValueError:  # different drives on Windows
        contained = False
    return base, target, real_base, real_target, contained


def _strip_trailing_newlines(text: str) -> str:
    return _TRAILING_NEWLINES.sub("", text)


def _stderr_tail(stderr: str) -> str:
    s = stderr.strip(JS_WHITESPACE)
    if not s:
        return ""
    if len(s) <= STDERR_DIAGNOSTIC_CLIP:
        return ". stderr:\n" + s
    return f". stderr (last {STDERR_DIAGNOSTIC_CLIP} chars):\n…" + s[-STDERR_DIAGNOSTIC_CLIP:]


def _describe(argv: list[str]) -> str:
    n = len(argv) - 1
    return f"{json.dumps(argv[0] if argv else '', ensure_ascii=False)} ({n} argument{'' if n == 1 else 's'})"


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


# --------------------------------------------------------------------------- runner


def run_exec_unit(req: ExecRequest, cancel: threading.Event | None = None) -> DispatchResult:
    """Run one exec attempt and map it onto a (redacted) DispatchResult."""
    result = _run(req, cancel)
    return _redact_result(result, req.sensitive_values)


def _redact_result(res: DispatchResult, values: list[str]) -> DispatchResult:
    if res.text is not None:
        res.text = redact_text(res.text, values)
    if res.error is not None:
        res.error = clip(redact_text(res.error, values), DIAGNOSTIC_CLIP)
    if res.has_result:
        res.result = redact_value(res.result, values)
    if res.session_id is not None:
        res.session_id = redact_text(res.session_id, values)
    if res.failure_reason is not None and redact_text(res.failure_reason, values) != res.failure_reason:
        res.failure_reason = "reported_failure"
    return res


def _fail(reason: str, error: str, text: str | None = None, truncated: bool = False) -> DispatchResult:
    return DispatchResult(ok=False, failure_reason=reason, error=error, text=text or None, truncated=truncated)


def _label(req: ExecRequest) -> str:
    unit = req.context.get("AKM_UNIT_ID")
    return f"exec unit {json.dumps(unit, ensure_ascii=False)}" if unit else "exec unit"


def _run(req: ExecRequest, cancel: threading.Event | None) -> DispatchResult:
    argv = list(req.command)
    if not argv:
        return _fail("spawn_failed", f"{_label(req)} has an empty command")

    # 1. working directory: containment on realpaths (existence is checked when the spawn fails)
    try:
        _, target, real_base, real_target, contained = _resolve_dirs(req.base_dir, req.cwd)
    except (ValueError, OSError) as exc:  # e.g. an embedded NUL byte
        return _fail(
            "spawn_failed", f"{_label(req)} could not start {_describe(argv)}: invalid working directory ({exc})"
        )
    if not contained:
        return _fail(
            "exec_cwd_escape",
            f"{_label(req)}: exec.cwd {json.dumps(req.cwd, ensure_ascii=False)} resolves to {real_target}, "
            f"which is outside the unit's base directory {real_base}; nothing was started",
        )

    # 2. context size
    too_large = check_exec_context(req.context)
    if too_large:
        return _missing_dir(req, argv, target, real_target) or _fail(
            "exec_context_too_large", f"{_label(req)}: {too_large}"
        )

    # 3. spawn and supervise (akm.dispatch.process)
    if cancel is not None and cancel.is_set():
        return _missing_dir(req, argv, target, real_target) or _fail(
            "aborted",
            f"{_label(req)} {_describe(argv)} was not dispatched because the workflow invocation was interrupted",
        )
    proc = run_process(
        argv,
        cwd=real_target,
        env=build_exec_env(req, req.parent_env),
        timeout_ms=req.timeout_ms,
        cancel=cancel,
        capture_limit=STDOUT_CAPTURE_BYTES,
        stderr_limit=STDERR_CAPTURE_BYTES,
        sensitive_values=req.sensitive_values,
    )
    if proc.spawn_error is not None:
        missing = _missing_dir(req, argv, target, real_target)
        if missing is not None:
            return missing
    return _outcome(proc, req, argv)


def _missing_dir(req: ExecRequest, argv: list[str], target: str, real_target: str) -> DispatchResult | None:
    """The failure for a working directory that is not there, else None.

    Asked only when something else failed: a fan-out's units share their directory,
    and the spawn itself fails on a missing one — a stat per unit buys nothing.
    """
    if os.path.isdir(real_target):
        return None
    return _fail(
        "spawn_failed",
        f"{_label(req)} could not start {_describe(argv)}: working directory {target} is missing or not a directory",
    )


def _outcome(proc: ProcessResult, req: ExecRequest, argv: list[str]) -> DispatchResult:
    """Map a supervised process onto the unit outcome, first match wins."""
    if (
        proc.exit_code == 0
        and not proc.capture_error
        and not proc.cancelled
        and not proc.timed_out
        and proc.signal is None
        and proc.spawn_error is None
    ):
        return DispatchResult(
            ok=True, text=_strip_trailing_newlines(proc.stdout) or None, truncated=proc.stdout_truncated
        )
    label, desc = _label(req), _describe(argv)
    if proc.spawn_error is not None:
        return _fail("spawn_failed", f"{label} could not start {desc}: {proc.spawn_error}")
    tail = _stderr_tail(proc.stderr)
    stdout_text = _strip_trailing_newlines(proc.stdout)
    truncated = proc.stdout_truncated
    if proc.cancelled:
        return _fail(
            "aborted",
            f"{label} {desc} was cancelled while running; the process group was terminated{tail}",
            stdout_text,
            truncated,
        )
    if proc.timed_out:
        return _fail(
            "timeout",
            f"{label} {desc} timed out after {req.timeout_ms} ms; the process group was terminated{tail}",
            stdout_text,
            truncated,
        )
    if proc.signal is not None:
        return _fail(
            "non_zero_exit",
            f"{label} {desc} was killed by signal {_signal_name(proc.signal)} ({proc.signal}){tail}",
            stdout_text,
            truncated,
        )
    if proc.exit_code != 0:
        return _fail("non_zero_exit", f"{label} {desc} exited {proc.exit_code}{tail}", stdout_text, truncated)
    if proc.capture_error:
        return _fail(
            "spawn_failed",
            f"{label} {desc} exited 0 but output capture did not complete ({proc.capture_error}). "
            "A background process probably kept stdout/stderr open after the command exited; its process "
            "group was killed and the partial output was discarded. Wait for child processes before exiting, "
            f"or redirect their output to a file or /dev/null{tail}",
        )
    return DispatchResult(ok=True, text=stdout_text or None, truncated=truncated)


class ExecDispatcher:
    """The `exec` kind of the dispatcher seam: a UnitRequest becomes one supervised command.

    Returns the raw stdout text; a step's output schema is applied by the engine
    (akm.engine.structured), the same way for every unit kind.
    """

    kind = "exec"

    def dispatch(self, request: Any, cancel: threading.Event, feedback: str | None = None) -> DispatchResult:
        spec = request.exec_spec
        req = ExecRequest(
            command=list(spec.command),
            base_dir=request.cwd,
            cwd=spec.cwd,
            pass_env=spec.pass_env,
            inherit_env=bool(spec.inherit_env),
            env_bindings=request.env_bindings,
            context=dict(request.exec_context, **request.trace_env) if request.trace_env else request.exec_context,
            timeout_ms=request.timeout_ms,
            sensitive_values=request.sensitive_values,
            parent_env=request.parent_env,
        )
        return run_exec_unit(req, cancel)
