"""The dispatchers this akm ships, by unit kind."""

from __future__ import annotations

from akm.dispatch.base import DispatcherRegistry


def default_registry() -> DispatcherRegistry:
    """exec units always; model and agent kinds register here as their dispatchers land."""
    from akm.dispatch.exec import ExecDispatcher

    return DispatcherRegistry({"exec": ExecDispatcher()})
