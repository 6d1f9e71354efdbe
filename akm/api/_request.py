"""A call's arguments: a typed request model when one is given (pydantic validates it), else the plain
keywords checked by `_args`'s rules, so a read path never imports pydantic. `_models` is imported here only
when a model is in hand, which keeps `_models` -> `_args` the only edge between the two.
"""

from __future__ import annotations

from typing import Any, Callable

from akm.errors import UsageError


def _validated(model: str, given: Any, fields: dict[str, Any]) -> Any:
    """The request model `model` validated from `fields` (or `given` when it already is one)."""
    from akm.api import _models as api_models

    return api_models._validated(getattr(api_models, model), given, fields)


def _arguments(model: str, given: Any, fields: dict[str, Any], checks: dict[str, Callable[[Any], Any]]) -> Any:
    """A call's arguments: the typed request when one is given (pydantic validates it), else `fields`
    checked by the same plain rules the request model applies — so the read paths never import pydantic."""
    if hasattr(type(given), "model_fields"):
        return _validated(model, given, fields)
    out = {}
    for name, value in fields.items():
        check = checks.get(name)
        try:
            out[name] = check(value) if check is not None else value
        except (TypeError, ValueError) as exc:
            from akm.codes import Code

            raise UsageError(f"{exc}.", code=Code.INVALID_ARGUMENT, details={"argument": name}) from None
    from types import SimpleNamespace

    return SimpleNamespace(**out)
