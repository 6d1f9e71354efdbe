"""Read the workflow-wide frontmatter keys that are not steps: the asset envelope and the budget.

The envelope (`type`, `description`, `tags`, `status`, `xrefs`, provenance and
stamps) describes the file as an asset in a library; nothing in a run depends on
it, but a malformed envelope would be carried into the plan and shown to other
tools, so it is checked as strictly as the steps. `budget` is the run-lifetime
ceiling on tokens and units.
"""

from __future__ import annotations

import re
from typing import Any

from akm.format.field_reader import FieldReader, describe
from akm.format.grammar import BUDGET_KEYS, BUDGET_UNKNOWN, MAX_UNITS, STAMP_KEYS
from akm.format.model import Budget

_TEXT_KEYS = ("description", "when_to_use", "updated", "timestamp", "stale_after")
# Of the text keys, these become document fields; the rest stay in the envelope as written.
_DOCUMENT_TEXT_KEYS = ("description", "when_to_use", "updated")


def read_envelope(ctx: FieldReader, root: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """(envelope, document fields) from the asset keys; problems are reported on `ctx`."""
    envelope: dict[str, Any] = {}
    doc_fields: dict[str, Any] = {}
    if "type" in root and root["type"] != "workflow":
        ctx.error(
            "invalid_value",
            f'"type" must be "workflow" when present; got {describe(root["type"])}',
            ("type",),
            hint="remove the key or write `type: workflow`",
        )
    for key in _TEXT_KEYS:
        if key in root:
            value = root[key]
            if isinstance(value, str):
                if key in _DOCUMENT_TEXT_KEYS:
                    doc_fields[key] = value
                else:
                    envelope[key] = value
            else:
                hint = 'quote it to keep it as text, e.g. "5"' if value is not None else None
                ctx.error("invalid_type", f'"{key}" must be a string, not {describe(value)}', (key,), hint=hint)
    if "tags" in root:
        tags = ctx.string_list(root["tags"], ("tags",), '"tags"', limit=1024, unique=False)
        if tags is not None:
            doc_fields["tags"] = tags
    if "status" in root:
        status = ctx.choice(root["status"], ("status",), '"status"', ("draft", "stable", "deprecated"))
        if status:
            doc_fields["status"] = status
    if "provenance" in root and ctx.mapping(root["provenance"], ("provenance",), '"provenance"') is not None:
        envelope["provenance"] = root["provenance"]
    if "generated" in root and _read_stamp(ctx, root["generated"], ("generated",), '"generated"'):
        envelope["generated"] = root["generated"]
    if "verified" in root:
        value = root["verified"]
        if isinstance(value, list):
            ok = all(_read_stamp(ctx, v, ("verified", i), f'"verified[{i}]"') for i, v in enumerate(value))
        else:
            ok = _read_stamp(ctx, value, ("verified",), '"verified"')
        if ok:
            envelope["verified"] = value
    if "xrefs" in root and _read_xrefs(ctx, root["xrefs"]):
        envelope["xrefs"] = list(root["xrefs"])
    if "type" in root and root["type"] == "workflow":
        envelope["type"] = "workflow"
    return envelope, doc_fields


def read_budget(ctx: FieldReader, root: dict) -> Budget | None:
    node = ctx.section(root, "budget", BUDGET_KEYS)
    if node is None:
        return None
    out: dict[str, Any] = {}
    if "max_tokens" in node:
        out["max_tokens"] = ctx.integer(node["max_tokens"], ("budget", "max_tokens"), "budget.max_tokens", 1, 2**53 - 1)
    if "max_units" in node:
        out["max_units"] = ctx.integer(node["max_units"], ("budget", "max_units"), "budget.max_units", 1, MAX_UNITS)
    if "max_cost" in node:
        out["max_cost"] = _cost(ctx, node["max_cost"])
    if "unknown" in node:
        out["unknown"] = ctx.choice(node["unknown"], ("budget", "unknown"), "budget.unknown", BUDGET_UNKNOWN)
    out = {k: v for k, v in out.items() if v is not None}
    return Budget(**out) if out else None


MAX_COST_USD = 1e9  # far above any run; keeps sums exact enough and the number finite


def _cost(ctx: FieldReader, value: Any) -> float | None:
    """`budget.max_cost`: US dollars, a number above 0 (`2`, `0.5`)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if not ok:
        ctx.error(
            "invalid_type",
            f"budget.max_cost must be a number of US dollars, not {describe(value)}",
            ("budget", "max_cost"),
        )
        return None
    if not 0 < value <= MAX_COST_USD:
        ctx.error(
            "out_of_range",
            f"budget.max_cost must be above 0 and at most {MAX_COST_USD:g}; got {value}",
            ("budget", "max_cost"),
        )
        return None
    return float(value)


def _read_stamp(ctx: FieldReader, value: Any, ypath: tuple, what: str) -> bool:
    """A `{ by, at }` stamp (`generated`, each `verified` entry). True when it is well formed."""
    before = len(ctx.errors)
    node = ctx.strict_mapping(value, ypath, what, STAMP_KEYS, hint="write `{ by: <who>, at: <when> }`")
    if node is None:
        return False
    if "by" not in node:
        ctx.error("missing_key", f'{what} needs a "by" entry naming who or what made it', ypath)
    else:
        ctx.text(node["by"], ypath + ("by",), f"{what}.by")
    if "at" in node and not isinstance(node["at"], str):
        ctx.error("invalid_type", f"{what}.at must be a string, not {describe(node['at'])}", ypath + ("at",))
    return len(ctx.errors) == before


def _read_xrefs(ctx: FieldReader, value: Any) -> bool:
    """True when `xrefs` is a list of canonical asset refs (every bad entry is reported)."""
    if not isinstance(value, list):
        ctx.error("invalid_type", f'"xrefs" must be a list of asset refs, not {describe(value)}', ("xrefs",))
        return False
    ok = True
    for i, ref in enumerate(value):
        if not isinstance(ref, str):
            ctx.error("invalid_type", f'"xrefs[{i}]" must be a string, not {describe(ref)}', ("xrefs", i))
            ok = False
            continue
        problem = _xref_problem(ref)
        if problem:
            ctx.error(
                "invalid_xref",
                f'"xrefs[{i}]" ("{ref}") is invalid or non-canonical: {problem}',
                ("xrefs", i),
                hint="write [<bundle>//]<asset-id>[#<fragment>], e.g. skills/review",
            )
            ok = False
    return ok


def _xref_problem(ref: str) -> str | None:
    """Why `ref` is not a canonical `[<bundle>//]<asset-id>[#<fragment>]`, or None when it is."""
    import unicodedata

    if not ref or ref != ref.strip():
        return "it is empty or has surrounding whitespace"
    if "\x00" in ref:
        return "it contains a null byte"
    if unicodedata.normalize("NFC", ref) != ref:
        return "it is not in Unicode NFC form"
    bundle, sep, rest = ref.partition("//")
    if not sep:
        bundle, rest = "", ref
    elif not bundle or re.search(r"[:.#/\s]", bundle):
        return "the bundle name before // must be a plain slug"
    concept, hsep, fragment = rest.partition("#")
    problem = _asset_id_problem(concept)
    if problem is None and hsep and not fragment:
        return "the #fragment is empty"
    return problem


def _asset_id_problem(concept: str) -> str | None:
    """Why an asset id is not a plain relative path (no ':', no '..', no empty segments, no whitespace), or None."""
    if not concept or ":" in concept or re.match(r"[A-Za-z]:", concept) or concept.startswith("/"):
        return "the asset id must be a relative path without ':'"
    if ".." in concept.split("/") or "//" in concept or concept.endswith("/") or re.search(r"\s", concept):
        return "the asset id must not contain '..', empty segments or whitespace"
    return None
