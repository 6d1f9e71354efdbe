"""The dispatchers this akm ships, by unit kind."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from akm.dispatch.base import DispatcherRegistry
from akm.dispatch.types import DispatchResult


class _Lazy:
    """A dispatcher whose module is imported on its first dispatch.

    An exec-only run never loads the LLM client or the harness profiles; the
    one instance created is then shared by every step of the drive, so the
    per-engine semaphores it holds (D6) span the whole run.
    """

    def __init__(self, kind: str, module: str, name: str) -> None:
        self.kind = kind
        self._module, self._name = module, name
        self._instance: Any = None
        self._lock = threading.Lock()

    def instance(self) -> Any:
        if self._instance is None:
            with self._lock:
                if self._instance is None:
                    self._instance = getattr(importlib.import_module(self._module), self._name)()
        return self._instance

    def dispatch(self, request: Any, cancel: threading.Event, feedback: str | None = None) -> DispatchResult:
        result: DispatchResult = self.instance().dispatch(request, cancel, feedback)
        return result


_SHARED: dict[str, Any] | None = None
_SHARED_LOCK = threading.Lock()


def _shared() -> dict[str, Any]:
    """One instance of each dispatcher per process: an MCP server driving two runs at once still holds
    one per-engine limit (D6), not one per run."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            from akm.dispatch.exec import ExecDispatcher

            _SHARED = {
                "exec": ExecDispatcher(),
                "llm": _Lazy("llm", "akm.dispatch.llm", "LlmDispatcher"),
                "agent": _Lazy("agent", "akm.dispatch.agents", "AgentDispatcher"),
            }
        return _SHARED


def default_registry() -> DispatcherRegistry:
    """exec, llm (OpenAI-compatible HTTP) and agent (harness CLIs). `session` has no dispatcher: it parks.

    A fresh registry (callers may register more kinds) over the process-wide dispatcher instances.
    """
    return DispatcherRegistry(dict(_shared()))
