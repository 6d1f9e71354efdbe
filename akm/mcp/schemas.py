"""The output schemas of the MCP tools: pydantic models derived from the api's plain view records.

The api's read paths return `akm.views` records so the CLI never imports pydantic; this front derives the
camelCase schema models from them once, recursively, at import (server start).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.alias_generators import to_camel

from akm import api, views


def _schema_model(cls: type, extra: dict[str, Any] | None = None) -> type[BaseModel]:
    """A pydantic model with the camelCase wire shape of an api view (for a tool's outputSchema).

    The api's read paths return plain records (`akm.views`) so that the CLI never imports pydantic;
    this front derives the schema models once, recursively, at server start.
    """
    cached = _SCHEMA_MODELS.get((cls, tuple(extra or ())))
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    fields_: dict[str, Any] = {}
    for name, default in views.fields_of(cls):
        if default is views.REQUIRED:
            default = ...
        elif isinstance(default, views._Factory):
            default = Field(default_factory=default.make)
        fields_[name] = (_schema_type(hints[name]), default)
    for name, (kind, default) in (extra or {}).items():
        fields_[name] = (kind, default)
    model = create_model(
        cls.__name__ + ("Result" if extra else ""),
        __doc__=cls.__doc__,
        __config__=ConfigDict(alias_generator=to_camel, populate_by_name=True),
        **fields_,
    )
    _SCHEMA_MODELS[(cls, tuple(extra or ()))] = model
    return model


def _schema_type(hint: Any) -> Any:
    if isinstance(hint, type) and issubclass(hint, views.View):
        return _schema_model(hint)
    args = typing.get_args(hint)
    if not args:
        return hint
    origin = typing.get_origin(hint)
    converted = tuple(_schema_type(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        return typing.Union[converted]
    if origin is typing.Literal:
        return hint
    return origin[converted] if len(converted) > 1 else origin[converted[0]]


_SCHEMA_MODELS: dict[Any, type[BaseModel]] = {}
# The run JSON + what to call next; with `plan: true` the preview instead (`run` is then the run it would
# continue, or null for a new run).
McpRunResult = _schema_model(
    views.RunResult,
    {
        "run": (_schema_model(views.RunView) | None, None),
        "plan": (_schema_model(views.RunPreview) | None, None),
        "next": (str | None, None),
    },
)
McpRewindResult = _schema_model(views.RewindResult, {"next": (str | None, None)})  # what it did + what to call next
McpReportResult = create_model("McpReportResult", __base__=api.ReportResult, next=(str | None, None))
RunViewModel = _schema_model(views.RunView)
McpWaitResult = _schema_model(views.WaitResult, {"next": (str | None, None)})  # what the wait saw + what next
McpStatusResult = _schema_model(views.RunView, {"next": (str | None, None)})  # + what moves a stopped run on
RunListModel = _schema_model(views.RunList)
EventPageModel = _schema_model(views.EventPage)
CatalogModel = _schema_model(views.Catalog)


def lint_model() -> Any:
    """The workflow_lint output schema, derived from the lint report records (plain `View`s, no pydantic)."""
    from akm.api import LintReport

    return _schema_model(LintReport)
