"""The dispatcher seam: every unit kind looks the same to the engine.

The engine turns a work unit into a `UnitRequest`, picks the dispatcher for the
unit's kind from a `DispatcherRegistry`, and gets a `DispatchResult` back. What
a dispatcher returns is the *raw* answer (text, tokens, session id, a failure
reason for transport problems); turning text into a structured artifact —
parsing, schema validation and the one corrective re-prompt — is the engine's
job (`akm.engine.structured`), identical for every kind. That is why
`dispatch()` takes `feedback`: the engine re-asks a model with the errors of
its previous answer.

Kinds:
* `exec`    — an argv command (akm.dispatch.exec).
* `llm`     — an OpenAI-compatible chat completion (akm.dispatch.llm).
* `agent`   — a harness CLI such as claude or codex (akm.dispatch.agents).
* `session` — no engine: the unit waits for the calling agent (D11). It has no
  dispatcher; the engine parks the run and the session protocol reports it.

A dispatcher must be safe to call from several worker threads at once, must
return (not raise) for anything a unit can cause, must honour `cancel` promptly
(kill the process group, abort the HTTP request) and must redact every string
it returns against `request.sensitive_values`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Protocol

from akm.dispatch.types import DispatchResult
from akm.record import dataclass, field

__all__ = ["DispatchResult", "Dispatcher", "DispatcherRegistry", "UnitRequest", "UNIT_KINDS"]

UNIT_KINDS = ("exec", "llm", "agent", "session")


@dataclass
class UnitRequest:
    """One attempt of one unit, fully resolved by the engine (nothing left to look up).

    `prompt` is the assembled unit prompt (empty for exec units). `engine` is the
    frozen engine snapshot from the plan (`plan.execution.engines[engine_name]`);
    credentials are NOT in it — a dispatcher resolves `${NAME}` references from
    the environment at dispatch time and adds the values to the redaction set.
    `cwd` is where the unit runs: the project root, or its isolation worktree.
    """

    run_id: str
    step_id: str
    unit_id: str  # content id (what evidence and AKM_UNIT_ID show)
    attempt_id: str  # journal id of this attempt (`~l`/`~r` suffixed)
    kind: str  # one of UNIT_KINDS
    cwd: str
    prompt: str = ""
    system_prompt: str | None = None
    output_schema: dict[str, Any] | None = None
    timeout_ms: int | None = None
    engine_name: str | None = None
    engine: dict[str, Any] | None = None
    model: str | None = None
    llm_options: dict[str, Any] | None = None  # the unit's frozen `invocation.llm` (LLM engines only)
    # exec only
    exec_spec: Any = None  # akm.plan.model.ExecSpec
    exec_context: dict[str, str] = field(default_factory=dict)
    env_bindings: dict[str, str] = field(default_factory=dict)
    sensitive_values: list[str] = field(default_factory=list)
    parent_env: Mapping[str, str] | None = None
    # exec and agent units: the run's trace context for the child (TRACEPARENT and the OTEL_* settings,
    # akm.telemetry.context), so a command or CLI that traces joins the run's trace; None when not tracing
    trace_env: Mapping[str, str] | None = None
    # agent units: called (from the dispatching thread) with what the CLI is doing as it goes —
    # `{"turns", "toolCalls", "tool"?, "retries", "retryStatus"?, "sessionId"?}` (akm.dispatch.agent_stream)
    on_activity: Callable[[dict[str, Any]], None] | None = None


class Dispatcher(Protocol):
    """Runs one attempt of a unit and returns its raw result (see module docstring)."""

    kind: str

    def dispatch(
        self, request: UnitRequest, cancel: threading.Event, feedback: str | None = None
    ) -> DispatchResult: ...


class DispatcherRegistry:
    """Dispatchers by unit kind. Engines and tests build one; a fake dispatcher serves engine tests."""

    def __init__(self, dispatchers: Mapping[str, Dispatcher] | None = None) -> None:
        self._by_kind: dict[str, Dispatcher] = dict(dispatchers or {})

    def register(self, dispatcher: Dispatcher) -> None:
        self._by_kind[dispatcher.kind] = dispatcher

    def get(self, kind: str) -> Dispatcher | None:
        return self._by_kind.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._by_kind)
