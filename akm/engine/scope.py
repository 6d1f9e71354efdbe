"""What references resolve against: run params and the outputs of completed steps."""

from __future__ import annotations

from typing import Any

from akm.format.refs import parse_reference, resolve_reference


def step_outputs_from_evidence(evidence_by_step: dict[str, Any]) -> dict[str, Any]:
    """`steps.<id>.output` scope: evidence.output when present, else the whole evidence."""
    out: dict[str, Any] = {}
    for step_id, ev in evidence_by_step.items():
        if ev is None:
            continue
        if isinstance(ev, dict) and "output" in ev:
            out[step_id] = ev["output"]
        else:
            out[step_id] = ev
    return out


def resolve(ref_text: str, params: dict[str, Any], outputs: dict[str, Any]) -> Any:
    """Resolve one reference; raises ReferenceSyntaxError / ReferenceResolutionError."""
    return resolve_reference(parse_reference(ref_text), params, outputs)
