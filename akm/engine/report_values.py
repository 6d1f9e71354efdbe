"""What a report records: its result as the journal holds it (checked, redacted, bounded) and its failure reason.

Pure checks over the reported values and the unit's template; each refusal is a coded UsageError raised
before anything is written (RESULT_REQUIRED, RESULT_INVALID, RESULT_TOO_LARGE).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from akm.codes import Code
from akm.dispatch.answer import AnswerError, parse_command_json
from akm.dispatch.redact import redact_text, redact_value, sensitive_values_from
from akm.errors import UsageError
from akm.format.schema import validate_instance
from akm.plan.model import UnitNode

# Failure reasons a report may use verbatim (they take part in `retry.on`); anything else is `external:<slug>`.
FAILURE_TAXONOMY = frozenset(
    {
        "timeout",
        "spawn_failed",
        "non_zero_exit",
        "parse_error",
        "cooldown",
        "llm_rate_limit",
        "llm_content_filter",
        "llm_invalid_json",
        "content_policy_reject",
        "unsupported_type",
        "no_change",
        "aborted",
    }
)
# The largest result a report may record: what an agent engine's unit can return (its harness's kept stdout,
# `akm.dispatch.agents.MAX_STDOUT_BYTES`). Beyond it a report is refused with a code, before anything is
# parsed or written, instead of growing the journal without bound (or failing inside SQLite).
MAX_RESULT_BYTES = 16 * 1024 * 1024
# The most a unit's journal row holds (spec/engine.md: `result_json` ≤ 1 MiB, what an exec unit keeps): a
# report whose recorded result is larger is refused, not stored whole (a refusal writes nothing).
MAX_RECORDED_RESULT_BYTES = 1024 * 1024
# What a failed report keeps of its result text (the reason it gives, not an output).
FAILURE_TEXT_CHARS = 2000


def normalize_failure_reason(reason: str | None, sensitive: list[str]) -> str:
    """Taxonomy reasons verbatim (they drive `retry.on`); anything else `external:<slug>` (spec/session.md §2)."""
    if reason is None or not reason.strip():
        return "reported_failure"
    if redact_text(reason, sensitive) != reason:
        return "reported_failure"
    text = reason.strip()
    if text in FAILURE_TAXONOMY:
        return text
    slug = re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")[:48].strip("-")
    return f"external:{slug or 'unknown'}"


def recorded_result(unit_id: str, template: UnitNode, status: str, result: Any, sensitive: list[str]) -> str | None:
    """The unit row's result_json for this report (None: no result); raises when it cannot be recorded."""
    if isinstance(result, str) and len(result) > MAX_RESULT_BYTES:  # at least that many bytes: refuse unparsed
        raise too_large(unit_id, len(result))
    if status == "failed":
        return _failure_text(result, sensitive)
    if template.output_schema is not None:
        return _schema_result(unit_id, template.output_schema, result, sensitive)
    return _text_result(unit_id, result, sensitive)


def require_recordable_size(unit_id: str, result_json: str | None) -> None:
    """RESULT_TOO_LARGE when the JSON the row would hold passes MAX_RECORDED_RESULT_BYTES."""
    if result_json is None or len(result_json) <= MAX_RECORDED_RESULT_BYTES // 4:  # cheap: only big ones are measured
        return
    size = len(result_json.encode("utf-8", "surrogatepass"))
    if size > MAX_RECORDED_RESULT_BYTES:
        raise too_large(unit_id, size, recorded=True)


def _failure_text(result: Any, sensitive: list[str]) -> str | None:
    """A failed report's result: its text, redacted and clipped (None when there is none)."""
    if result is None:
        return None
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    text = redact_text(text, sensitive)
    return json.dumps(text[:FAILURE_TEXT_CHARS], ensure_ascii=False) if text.strip() else None


def _schema_result(unit_id: str, schema: dict[str, Any], result: Any, sensitive: list[str]) -> str:
    """A completed result of a unit that declares an output schema: a JSON value that validates against it."""
    if result is None or (isinstance(result, str) and not result.strip()):
        raise UsageError(
            f"Unit {unit_id} declares an output schema: a completed report needs a JSON result.",
            code=Code.RESULT_REQUIRED,
            details={"outputSchema": schema},
        )
    value = _parsed(unit_id, schema, result, sensitive)
    _require_recordable(value, unit_id)
    errors = validate_instance(value, schema)
    if errors and isinstance(result, str) and value is not result and not validate_instance(result, schema):
        value, errors = result, []  # `"42"` for a string schema is the text 42, not the number
    if errors:
        raise UsageError(
            f"The result for unit {unit_id} failed validation against its declared output schema: "
            + redact_text("; ".join(errors), sensitive)
            + ". Nothing was recorded; correct it and report again.",
            code=Code.RESULT_INVALID,
            details={"errors": [redact_text(e, sensitive) for e in errors], "outputSchema": schema},
        )
    return json.dumps(redact_value(value, sensitive), ensure_ascii=False, separators=(",", ":"))


def _parsed(unit_id: str, schema: dict[str, Any], result: Any, sensitive: list[str]) -> Any:
    """A text result parsed as JSON. A schema that takes a string takes the text itself: over MCP `result:
    "Ada"` is already a JSON string, and nobody should have to quote it twice. Anything else must be JSON."""
    if not isinstance(result, str):
        return result
    try:
        return parse_command_json(result)
    except AnswerError as exc:
        if validate_instance(result, schema):
            raise UsageError(
                f"The result for unit {unit_id} is not JSON: {redact_text(str(exc), sensitive)}.",
                code=Code.RESULT_INVALID,
            ) from None
        return result


def _text_result(unit_id: str, result: Any, sensitive: list[str]) -> str | None:
    """A completed result of a unit with no output schema: its text (or JSON value), redacted."""
    if result is None:
        return None
    if isinstance(result, str):
        text = redact_text(result, sensitive)
        return json.dumps(text, ensure_ascii=False) if text else None
    _require_recordable(result, unit_id)
    return json.dumps(redact_value(result, sensitive), ensure_ascii=False, separators=(",", ":"))


def too_large(unit_id: str, size: int, *, recorded: bool = False) -> UsageError:
    """RESULT_TOO_LARGE: the report's text passes 16 MiB (refused unread), or the JSON the journal would hold
    passes the 1 MiB a unit's row holds."""
    if recorded:
        bound, limit = MAX_RECORDED_RESULT_BYTES, "the journal holds at most 1048576 bytes (1 MiB) of a unit's result"
    else:
        bound, limit = MAX_RESULT_BYTES, "a report's text may be at most 16777216 bytes (16 MiB)"
    return UsageError(
        f"The result for unit {unit_id} is too large: {size} bytes, and {limit}. Nothing was recorded; "
        "write a large output to a file and report its path instead.",
        code=Code.RESULT_TOO_LARGE,
        details={"bytes": size, "maxBytes": bound},
    )


def _require_recordable(value: Any, unit_id: str) -> None:
    """A structured result (MCP callers send JSON values, not text) is held to what a text answer
    is: finite numbers, at most MAX_ANSWER_DEPTH levels (what `status` can show)."""
    from akm.dispatch.answer import recordable_problem

    problem = recordable_problem(value)
    if problem is not None:
        raise UsageError(
            f"The result for unit {unit_id} cannot be recorded as JSON: {problem}. Nothing was recorded.",
            code=Code.RESULT_INVALID,
        )


def sensitive_values(template: UnitNode | None, project_root: Path) -> list[str]:
    """The template's own `env:` values and those of every env file the project can see (spec/engine.md)."""
    from akm.engine.env_bindings import EnvBindingError, project_sensitive_values, resolve_env_refs

    visible = project_sensitive_values(project_root)
    refs = (template.env if template is not None else None) or []
    if not refs:
        return visible
    try:
        return sensitive_values_from(resolve_env_refs(refs, project_root)) + visible
    except EnvBindingError:
        return visible
