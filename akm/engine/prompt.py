"""The text a model or agent is sent for one unit.

Not part of the input hash: rewording the preamble must never re-dispatch a
journaled unit. Exec units get a prompt too (it is ignored by the runner) so
that every unit of every kind goes through one code path.
"""

from __future__ import annotations

from typing import Any

from akm.canonical import compact_json

PREAMBLE = """You are doing ONE unit of work inside an akm workflow run.

- Run id: {run_id}
- Step: {step_id}
- Unit: {unit_id}
- Run params (JSON): {params}

Ground rules:
1. Do only this unit's work; sibling units may be running at the same time.
2. Secrets reach you only through the process environment; never print them.
3. Your final answer is recorded as this unit's result. When a JSON schema is
   requested below, answer with only a JSON value that matches it.

The instructions for this unit follow.
---
"""


def json_or_null(value: Any) -> str:
    try:
        return compact_json(value)
    except (TypeError, ValueError):
        return "null"


def build_unit_prompt(
    *,
    run_id: str,
    step_id: str,
    unit_id: str,
    params: dict[str, Any],
    instructions: str,
    item: Any = None,
    item_index: int | None = None,
    inputs: list[tuple[str, Any]] | None = None,
    gate_feedback: dict[str, Any] | None = None,
    schema: dict[str, Any] | None = None,
    params_json: str | None = None,
) -> str:
    """`params_json` may carry the params already serialised (a fan-out serialises them once)."""
    parts = [
        PREAMBLE.format(
            run_id=run_id,
            step_id=step_id,
            unit_id=unit_id,
            params=params_json if params_json is not None else json_or_null(params),
        ),
        "\n",
        instructions,
    ]
    if item_index is not None:
        parts.append(
            f"\n\n## Item (index {item_index})\nThis unit handles one item of a fan-out:\n{json_or_null(item)}"
        )
    if inputs:
        blocks = [f"### {ref}\n{json_or_null(value)}" for ref, value in inputs]
        parts.append("\n\n## Declared inputs\n" + "\n\n".join(blocks))
    if gate_feedback:
        text = (
            "\n\n## Completion-gate feedback (previous attempt rejected)\n"
            "Address this feedback in this attempt:\n" + str(gate_feedback.get("feedback", ""))
        )
        missing = [m for m in gate_feedback.get("missing", []) if isinstance(m, str) and m.strip()]
        if missing:
            text += "\nUnmet criteria:\n" + "\n".join(f"- {m}" for m in missing)
        parts.append(text)
    if schema is not None:
        parts.append(
            "\n\nRespond with only a JSON value matching this JSON Schema (no prose, no code fences):\n"
            + json_or_null(schema)
        )
    return "".join(parts)
