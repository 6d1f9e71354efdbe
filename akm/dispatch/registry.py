"""The dispatchers this akm ships, by unit kind."""

from __future__ import annotations

from akm.dispatch.base import DispatcherRegistry


def default_registry() -> DispatcherRegistry:
    """exec, llm (OpenAI-compatible HTTP) and agent (harness CLIs). `session` has no dispatcher: it parks.

    One registry per drive: the LLM and agent dispatchers hold the per-engine
    semaphores (D6), so units of every step of the run share one limit per engine.
    Importing them costs nothing heavy (httpx is imported on the first request).
    """
    from akm.dispatch.agents import AgentDispatcher
    from akm.dispatch.exec import ExecDispatcher
    from akm.dispatch.llm import LlmDispatcher

    return DispatcherRegistry({"exec": ExecDispatcher(), "llm": LlmDispatcher(), "agent": AgentDispatcher()})
