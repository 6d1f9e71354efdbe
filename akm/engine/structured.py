"""One structured-output loop for every unit kind: dispatch, parse, validate, re-ask once.

Dispatchers return raw text. When the unit declares an output schema the
engine — not the dispatcher — turns that text into the artifact, so an exec
unit, an LLM unit and an agent unit are held to the same rules and journal the
same shapes:

* exec units get ONE attempt and a strict parse (a program can be fixed, a
  re-run of the same command would print the same thing);
* model and agent units get up to TWO attempts: on a parse or validation miss
  the second attempt carries corrective feedback naming the errors.

Tokens (and their parts, `usage`) are summed over every call of the attempt and
the last session id seen wins, so budgets count what was really spent; a call that
reported no tokens adds nothing, and an attempt none of whose calls did stays
unknown (None), never 0.
"""

from __future__ import annotations

import threading
from typing import Any

from akm.dispatch.base import Dispatcher, DispatchResult, UnitRequest
from akm.dispatch.types import add_usage

MODEL_ATTEMPTS = 2


def _feedback_for(errors: list[str], parse_failed: bool) -> str:
    if parse_failed:
        return (
            "Your previous answer could not be read as JSON: "
            + "; ".join(errors)
            + ". Respond again with only one JSON value that matches the schema — no prose, no code fences."
        )
    return (
        "Your previous answer did not match the required JSON Schema:\n"
        + "\n".join(f"- {e}" for e in errors)
        + "\nRespond again with only a corrected JSON value."
    )


def run_structured(dispatcher: Dispatcher, request: UnitRequest, cancel: threading.Event) -> DispatchResult:
    """Dispatch one unit attempt; with a schema, return a validated `result` or a coded failure."""
    schema = request.output_schema
    attempts = 1 if (schema is None or request.kind == "exec") else MODEL_ATTEMPTS
    tokens: int | None = None
    usage: dict[str, Any] | None = None
    session_id: str | None = None
    feedback: str | None = None
    final: DispatchResult | None = None
    for n in range(attempts):
        try:
            raw = dispatcher.dispatch(request, cancel, feedback)
        except Exception as exc:  # a dispatcher bug must still end as a journaled failure
            raw = DispatchResult(
                ok=False,
                failure_reason="dispatch_error",
                error=f"the {request.kind} dispatcher failed: {type(exc).__name__}: {exc}",
            )
        if raw.tokens is not None:
            tokens = (tokens or 0) + raw.tokens
        usage = add_usage(usage, raw.usage)
        if raw.session_id:
            session_id = raw.session_id
        final, feedback = _checked(raw, request, schema)
        if feedback is None or cancel.is_set() or n + 1 >= attempts:
            break
    assert final is not None
    final.tokens = tokens
    final.usage = usage
    final.session_id = session_id
    return final


def _checked(
    raw: DispatchResult, request: UnitRequest, schema: dict[str, Any] | None
) -> tuple[DispatchResult, str | None]:
    """The attempt's outcome from the dispatcher's answer, and the feedback for another attempt when the answer
    can be corrected (it did not parse, or missed the schema); None feedback: this outcome is final."""
    if not raw.ok:
        return raw, None
    if schema is None:
        return DispatchResult(ok=True, text=raw.text or None, truncated=raw.truncated), None
    text = raw.text or ""
    if raw.truncated:
        return DispatchResult(
            ok=False,
            failure_reason="exec_output_limit" if request.kind == "exec" else "output_truncated",
            truncated=True,
            error="the output was cut at the capture limit, so it cannot be the one JSON value the output "
            "schema needs; nothing was promoted. Write bulk output to a file and print a small JSON "
            "summary instead.",
        ), None
    from akm.dispatch.answer import AnswerError, extract_model_json, parse_command_json  # schema units only

    try:
        value: Any = parse_command_json(text) if request.kind == "exec" else extract_model_json(text)
    except AnswerError as exc:
        return (
            DispatchResult(ok=False, failure_reason="parse_error", error=str(exc), text=text or None),
            _feedback_for([str(exc)], parse_failed=True),
        )
    from akm.format.schema import validate_instance  # only units with a schema need it

    errors = validate_instance(value, schema)
    if not errors:
        return DispatchResult(ok=True, result=value, has_result=True, text=text.strip() or None), None
    return (
        DispatchResult(ok=False, failure_reason="validation_error", error="; ".join(errors), text=text or None),
        _feedback_for(errors, parse_failed=False),
    )
