"""Parse and fully check one workflow file: text in, document or diagnostics out.

This is both the parser and the lint engine (DECISIONS D10: lint is complete).
Everything that would fail a run for a reason visible in the file is reported
here, including what the upstream tool only found while compiling or freezing:
references to later/unknown steps and undeclared params, duplicate list
entries, out-of-range bounds, unsupported JSON-Schema keywords, text lost after
a stray `# heading`.

`parse_workflow` never raises. All checks run and accumulate (an error in one
step never hides errors in another); only a container failure (size, missing
frontmatter, YAML syntax, legacy format) stops early. A `WorkflowDocument` is
returned only when there are no errors, so the plan compiler can trust it.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from akm.format.diagnostics import Diagnostic, sort_and_cap
from akm.format.markdown import Body, scan_body, split_frontmatter, split_lines
from akm.format.model import (
    RETRYABLE_REASONS,
    Budget,
    Defaults,
    ExecSpec,
    GateSpec,
    LlmOptions,
    MapSpec,
    RetrySpec,
    RouteBranch,
    RouteSpec,
    Step,
    TextBlock,
    UnitBag,
    WorkflowDocument,
)
from akm.format.yaml12 import YamlDoc, js_string, load_yaml

# ---- limits (spec/workflow-format.md, "Limits") ----
MAX_SOURCE_BYTES = 1_048_576
MAX_STEPS = 256
MAX_PARAMS = 128
MAX_ROUTE_BRANCHES = 256
MAX_INPUTS = 64
MAX_ENV_REFS = 1024
MAX_TEXT_BYTES = 256 * 1024
MAX_SCHEMA_BYTES = 256 * 1024
MAX_EXTRA_PARAMS_BYTES = 64 * 1024
MAX_JSON_DEPTH = 48
MAX_UNITS = 10_000
MAX_CONCURRENCY = 64
MAX_LOOPS = 100
MAX_RETRY = 100
MAX_TIMEOUT_MS = 2_147_483_647
MAX_EXEC_ARGV = 64
MAX_EXEC_ARG_BYTES = 4096
MAX_EXEC_CWD_CHARS = 1024
MAX_EXEC_PASS_ENV = 32

TOP_LEVEL_KEYS = (
    "type", "description", "tags", "when_to_use", "xrefs", "updated", "timestamp",
    "generated", "verified", "provenance", "status", "stale_after",
    "params", "defaults", "budget", "steps",
)
DEFAULTS_KEYS = ("engine", "model", "timeout", "on_error", "llm")
BUDGET_KEYS = ("max_tokens", "max_units")
STEP_KEYS = ("id", "unit", "map", "route", "inputs", "output", "gate")
UNIT_KEYS = ("exec", "engine", "model", "llm", "timeout", "retry", "on_error", "output", "env", "isolation")
LLM_KEYS = ("temperature", "max_tokens", "supports_json_schema", "extra_params", "context_length", "enable_thinking")
RETRY_KEYS = ("max", "on")
EXEC_KEYS = ("command", "cwd", "pass_env", "inherit_env")
MAP_KEYS = ("over", "concurrency", "reducer", "unit")
ROUTE_KEYS = ("input", "when", "default")
BRANCH_KEYS = ("match", "step")
GATE_KEYS = ("max_loops",)
STAMP_KEYS = ("by", "at")

STEP_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ENV_VAR_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ENGINE_NAME_RE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\Z")
DURATION_RE = re.compile(r"([0-9]+)(ms|s|m)?\Z")

PROTECTED_LLM_KEYS = frozenset(
    "model messages temperature maxtokens responseformat stream streamoptions enablethinking chattemplatekwargs".split()
)
CREDENTIAL_KEYS = frozenset("authorization headers apikey token password secret cookie setcookie".split())

DURATION_HINT = 'write milliseconds (250), a number with ms, s or m (1500ms, 90s, 10m), or "none" for no limit'


class ParseResult(BaseModel):
    """`document` is set only when `errors` is empty. Warnings never block."""

    document: WorkflowDocument | None = None
    errors: list[Diagnostic]
    warnings: list[Diagnostic]

    @property
    def ok(self) -> bool:
        return not self.errors


def utf8_len(text: str) -> int:
    """UTF-8 byte length that tolerates lone surrogates (API callers can pass any str)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _json_len(value: Any) -> int:
    return utf8_len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True))


def _describe(value: Any) -> str:
    """How a value reads in a message: its YAML kind, plus the value when short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {js_string(value)}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f'the string "{shown}"'
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    return type(value).__name__


def _as_int(value: Any) -> int | None:
    """An integer, accepting integral floats (`2.0`) as YAML/JSON authors expect."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _suggest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f'did you mean "{close[0]}"? ' if close else ""


def _json_value_problem(value: Any, depth: int = 0) -> tuple[str, str] | None:
    """(code, message) when a value cannot travel as canonical JSON in the plan."""
    if depth > MAX_JSON_DEPTH:
        return ("too_large", f"nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        return ("invalid_value", f"contains {js_string(value)}, which JSON cannot represent")
    if isinstance(value, dict):
        for v in value.values():
            found = _json_value_problem(v, depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for v in value:
            found = _json_value_problem(v, depth + 1)
            if found:
                return found
    return None


@dataclass
class _RefUse:
    """A reference found in the frontmatter, kept for the cross-step checks."""

    step_index: int
    position: str  # "inputs[0]", "map.over", "route.input"
    ref: Any  # akm.format.refs.Reference
    ypath: tuple


@dataclass
class _StepDraft:
    """What we learned about one step entry while reading it."""

    index: int
    ypath: tuple
    line: int
    end_line: int
    id: str | None  # None when missing/invalid
    label: str
    kind: str = "unit"
    unit: UnitBag | None = None
    map: MapSpec | None = None
    route: RouteSpec | None = None
    route_lines: list[tuple[str, tuple]] = field(default_factory=list)  # (target, ypath)
    inputs: list[str] = field(default_factory=list)
    output: dict | None = None
    has_output: bool = False
    gate: GateSpec | None = None
    has_gate: bool = False


class _Ctx:
    """Collects diagnostics and turns YAML paths into file lines."""

    def __init__(self, path: str, ydoc: YamlDoc | None = None, close_line: int = 1) -> None:
        self.path = path
        self.ydoc = ydoc
        self.close_line = close_line
        self.errors: list[Diagnostic] = []
        self.warnings: list[Diagnostic] = []

    def mark(self, ypath: tuple, key: bool = False) -> tuple[int, int | None]:
        if self.ydoc is None:
            return (1, None)
        m = self.ydoc.mark_of(ypath, key=key)
        if m is None:
            return (2, None)
        # YAML text line 1 is file line 2 (after the opening fence).
        return (min(m[0] + 1, max(self.close_line - 1, 2)), m[1])

    def line(self, ypath: tuple, key: bool = False) -> int:
        return self.mark(ypath, key)[0]

    def end_line(self, ypath: tuple, start: int) -> int:
        """Last file line of the value at `ypath` (never before `start`, never past the frontmatter)."""
        end = self.ydoc.value_end_lines.get(ypath) if self.ydoc else None
        if end is None:
            return start
        return max(start, min(end + 1, max(self.close_line - 1, 2)))

    def error(
        self,
        code: str,
        message: str,
        ypath: tuple = (),
        *,
        key: bool = False,
        hint: str | None = None,
        line: int | None = None,
    ) -> None:
        if line is None:
            line, column = self.mark(ypath, key)
        else:
            column = None
        self.errors.append(Diagnostic(code=code, message=message, line=line, column=column, hint=hint))

    def warn(self, code: str, message: str, line: int, hint: str | None = None) -> None:
        self.warnings.append(Diagnostic(code=code, message=message, line=line, hint=hint))

    # --- small typed readers; each reports and returns None on a bad value ---

    def check_keys(self, node: dict, ypath: tuple, allowed: tuple[str, ...], where: str) -> None:
        for k in node:
            if k not in allowed:
                self.error(
                    "unknown_key",
                    f'Unknown key "{k}" in {where}',
                    ypath + (k,),
                    key=True,
                    hint=f"{_suggest(k, allowed)}allowed keys: {', '.join(allowed)}",
                )

    def mapping(self, value: Any, ypath: tuple, what: str, hint: str | None = None) -> dict | None:
        if isinstance(value, dict):
            return value
        self.error("invalid_type", f"{what} must be a mapping, not {_describe(value)}", ypath, hint=hint)
        return None

    def text(self, value: Any, ypath: tuple, what: str) -> str | None:
        """A non-empty string, trimmed."""
        if not isinstance(value, str):
            self.error("invalid_type", f"{what} must be a string, not {_describe(value)}", ypath)
            return None
        if not value.strip():
            self.error("invalid_value", f"{what} must not be empty", ypath)
            return None
        return value.strip()

    def integer(self, value: Any, ypath: tuple, what: str, lo: int, hi: int | None) -> int | None:
        n = _as_int(value)
        bounds = f"from {lo} through {hi}" if hi is not None else f"at least {lo}"
        if n is None:
            self.error("invalid_type", f"{what} must be a whole number {bounds}, not {_describe(value)}", ypath)
            return None
        if n < lo or (hi is not None and n > hi):
            self.error("out_of_range", f"{what} must be {bounds}; got {n}", ypath)
            return None
        return n

    def boolean(self, value: Any, ypath: tuple, what: str) -> bool | None:
        if isinstance(value, bool):
            return value
        self.error(
            "invalid_type",
            f"{what} must be true or false, not {_describe(value)}",
            ypath,
            hint="YAML 1.2: only true/false are booleans (yes/no/on/off are strings)",
        )
        return None

    def choice(self, value: Any, ypath: tuple, what: str, choices: tuple[str, ...]) -> str | None:
        if isinstance(value, str) and value in choices:
            return value
        self.error(
            "invalid_value",
            f"{what} must be one of {', '.join(choices)}; got {_describe(value)}",
            ypath,
        )
        return None

    def string_list(
        self, value: Any, ypath: tuple, what: str, *, limit: int, unique: bool
    ) -> list[str] | None:
        """A non-empty list of non-empty (trimmed) strings."""
        if not isinstance(value, list):
            self.error("invalid_type", f"{what} must be a list of strings, not {_describe(value)}", ypath)
            return None
        if not value:
            self.error("invalid_value", f"{what} must not be an empty list", ypath, hint="remove the key instead")
            return None
        ok = True
        if len(value) > limit:
            self.error("too_many_entries", f"{what} has {len(value)} entries; at most {limit} are allowed", ypath)
            ok = False
        out: list[str] = []
        seen: set[str] = set()
        for i, item in enumerate(value):
            text = self.text(item, ypath + (i,), f"{what}[{i}]")
            if text is None:
                ok = False
                continue
            if unique and text in seen:
                self.error("duplicate_entry", f'{what} lists "{text}" more than once', ypath + (i,),
                           hint="remove the repeated entry")
                ok = False
                continue
            seen.add(text)
            out.append(text)
        return out if ok else None


# ---------------------------------------------------------------------------------------------


def parse_workflow(text: str, path: str) -> ParseResult:
    """Parse and check one workflow file. Never raises: every problem is a diagnostic."""
    try:
        return _parse(text, path)
    except Exception as exc:  # a bug in akm, not in the file; still never crash lint
        return ParseResult(
            errors=[
                Diagnostic(
                    code="internal_error",
                    message=f"the workflow parser failed unexpectedly: {type(exc).__name__}: {exc}",
                    line=1,
                    hint="this is a bug in akm; please report it with the file",
                )
            ],
            warnings=[],
        )


def _stop(ctx: _Ctx) -> ParseResult:
    return ParseResult(errors=sort_and_cap(ctx.errors), warnings=ctx.warnings)


def _parse(text: str, path: str) -> ParseResult:
    if not isinstance(text, str):
        raise TypeError("workflow text must be a str")
    ctx = _Ctx(path)
    size = utf8_len(text)
    if size > MAX_SOURCE_BYTES:
        ctx.error(
            "file_too_large",
            f"the file is {size} bytes; a workflow may be at most 1 MiB ({MAX_SOURCE_BYTES} bytes)",
            line=1,
            hint="move long reference material into separate files the steps read",
        )
        return _stop(ctx)

    from akm.format.upgrade import detect_legacy

    legacy = detect_legacy(text)
    if legacy is not None:
        reason = re.sub(r"\s*at line \d+", "", legacy.reason or "") or "legacy markers in the body"
        ctx.error(
            "legacy_format",
            f"this file uses the retired workflow format ({reason}); it cannot be run as is",
            line=max(1, legacy.line),
            hint=f"convert it with `akm workflow upgrade {shlex.quote(path)} --write`",
        )
        return _stop(ctx)

    lines = split_lines(text)
    fm = split_frontmatter(lines)
    if fm is None:
        hint = "start the file with a line `---`, the YAML (with a `steps:` list), then a line `---`"
        if text.startswith("\ufeff"):
            hint = "the file starts with a byte-order mark (U+FEFF); save it as UTF-8 without BOM"
        ctx.error(
            "missing_frontmatter",
            "the file must start with a YAML frontmatter block (`---` ... `---`) declaring a non-empty `steps` list",
            line=1,
            hint=hint,
        )
        return _stop(ctx)

    ydoc = load_yaml(fm.yaml_text)
    ctx = _Ctx(path, ydoc, fm.close_line)
    if ydoc.problems:
        for p in ydoc.problems:
            # YAML text line 1 is file line 2.
            line = min(p.line + 1, fm.close_line)
            if p.code == "duplicate_key":
                message = p.message.split(" (first")[0] + (
                    f" (first defined on line {p.first_line + 1})" if p.first_line else "")
                hint = "each key may appear once per mapping; merge the entries or rename one"
            elif p.code == "yaml_unsupported_tag":
                message = p.message
                hint = "remove the tag; plain values are typed by YAML 1.2 core rules"
            elif p.code == "yaml_alias_expansion":
                message = f"YAML {p.message}"
                hint = "write the values out instead of using anchors and aliases"
            else:
                message = f"invalid YAML: {p.message}"
                hint = ("check indentation (spaces, not tabs) and quoting near this line; quote values "
                        "that contain ': ' or start with a special character")
            ctx.errors.append(Diagnostic(code=p.code, message=message, line=line, column=p.column, hint=hint))
        return _stop(ctx)

    root = ydoc.value if ydoc.value is not None else {}
    if not isinstance(root, dict):
        ctx.error("frontmatter_not_mapping",
                  f"the frontmatter must be a YAML mapping of keys, not {_describe(root)}", line=2,
                  hint="write `key: value` lines, including a `steps:` list")
        return _stop(ctx)

    return _Parser(ctx, root, lines, fm.body_start_line, path).run()


class _Parser:
    def __init__(self, ctx: _Ctx, root: dict, lines: list[str], body_start: int, path: str) -> None:
        self.ctx = ctx
        self.root = root
        self.lines = lines
        self.body_start = body_start
        self.path = path
        self.refs: list[_RefUse] = []
        self.params: dict[str, dict] = {}
        self.params_declared = "params" in root
        self.envelope: dict[str, Any] = {}
        self.doc_fields: dict[str, Any] = {}
        self.invalid_ids: set[str] = set()  # ids written but refused (so their ## heading gets a better hint)

    # -------------------------------------------------------------------------------- driver
    def run(self) -> ParseResult:
        ctx = self.ctx
        ctx.check_keys(self.root, (), TOP_LEVEL_KEYS, "the frontmatter")
        self.read_envelope()
        self.read_params()
        defaults = self.read_defaults()
        budget = self.read_budget()
        drafts = self.read_steps()
        self.check_routes(drafts)
        body = scan_body(self.lines, self.body_start)
        blocks = self.bind_body(drafts, body)
        self.check_references(drafts)
        self.warn_untyped(drafts)

        errors = sort_and_cap(ctx.errors)
        if errors:
            return ParseResult(errors=errors, warnings=ctx.warnings)
        steps = []
        for d in drafts:
            instr, rubric, section_line = blocks.get(d.index, (None, None, None))
            gate = d.gate if d.has_gate else (GateSpec() if rubric is not None else None)
            steps.append(
                Step(
                    id=d.id or "", sequence_index=d.index, line=d.line, end_line=d.end_line,
                    kind=d.kind,  # type: ignore[arg-type]
                    unit=d.unit, map=d.map, route=d.route, inputs=d.inputs,
                    output=d.output, gate=gate, instructions=instr, gate_rubric=rubric,
                    section_line=section_line,
                )
            )
        preamble = None
        if body.preamble is not None:
            preamble = TextBlock(text=body.preamble.text, start_line=body.preamble.start_line,
                                 end_line=body.preamble.end_line)
        first_h2 = next((h.line for h in body.headings if h.level == 2), None)
        title = next(
            (h.text for h in body.headings if h.level == 1 and (first_h2 is None or h.line < first_h2)),
            None,
        )
        document = WorkflowDocument(
            path=self.path,
            title=title or None,
            envelope=self.envelope,
            params=self.params,
            params_declared=self.params_declared,
            defaults=defaults,
            budget=budget,
            steps=steps,
            preamble=preamble,
            line_count=len(self.lines),
            **self.doc_fields,
        )
        return ParseResult(document=document, errors=[], warnings=ctx.warnings)

    # -------------------------------------------------------------------------------- envelope
    def read_envelope(self) -> None:
        ctx, root = self.ctx, self.root
        if "type" in root and root["type"] != "workflow":
            ctx.error("invalid_value", f'"type" must be "workflow" when present; got {_describe(root["type"])}',
                      ("type",), hint="remove the key or write `type: workflow`")
        for key in ("description", "when_to_use", "updated", "timestamp", "stale_after"):
            if key in root:
                value = root[key]
                if isinstance(value, str):
                    if key in ("description", "when_to_use", "updated"):
                        self.doc_fields[key] = value
                    else:
                        self.envelope[key] = value
                else:
                    hint = 'quote it to keep it as text, e.g. "5"' if value is not None else None
                    ctx.error("invalid_type", f'"{key}" must be a string, not {_describe(value)}', (key,), hint=hint)
        if "tags" in root:
            tags = ctx.string_list(root["tags"], ("tags",), '"tags"', limit=1024, unique=False)
            if tags is not None:
                self.doc_fields["tags"] = tags
        if "status" in root:
            status = ctx.choice(root["status"], ("status",), '"status"', ("draft", "stable", "deprecated"))
            if status:
                self.doc_fields["status"] = status
        if "provenance" in root and ctx.mapping(root["provenance"], ("provenance",), '"provenance"') is not None:
            self.envelope["provenance"] = root["provenance"]
        if "generated" in root and self.read_stamp(root["generated"], ("generated",), '"generated"'):
            self.envelope["generated"] = root["generated"]
        if "verified" in root:
            value = root["verified"]
            if isinstance(value, list):
                ok = all(self.read_stamp(v, ("verified", i), f'"verified[{i}]"') for i, v in enumerate(value))
            else:
                ok = self.read_stamp(value, ("verified",), '"verified"')
            if ok:
                self.envelope["verified"] = value
        if "xrefs" in root:
            self.read_xrefs(root["xrefs"])
        if "type" in root and root["type"] == "workflow":
            self.envelope["type"] = "workflow"

    def read_stamp(self, value: Any, ypath: tuple, what: str) -> bool:
        ctx = self.ctx
        node = ctx.mapping(value, ypath, what, hint="write `{ by: <who>, at: <when> }`")
        if node is None:
            return False
        before = len(ctx.errors)
        ctx.check_keys(node, ypath, STAMP_KEYS, what)
        if "by" not in node:
            ctx.error("missing_key", f'{what} needs a "by" entry naming who or what made it', ypath)
        else:
            ctx.text(node["by"], ypath + ("by",), f'{what}.by')
        if "at" in node and not isinstance(node["at"], str):
            ctx.error("invalid_type", f'{what}.at must be a string, not {_describe(node["at"])}', ypath + ("at",))
        return len(ctx.errors) == before

    def read_xrefs(self, value: Any) -> None:
        ctx = self.ctx
        if not isinstance(value, list):
            ctx.error("invalid_type", f'"xrefs" must be a list of asset refs, not {_describe(value)}', ("xrefs",))
            return
        ok = True
        for i, ref in enumerate(value):
            if not isinstance(ref, str):
                ctx.error("invalid_type", f'"xrefs[{i}]" must be a string, not {_describe(ref)}', ("xrefs", i))
                ok = False
                continue
            problem = _xref_problem(ref)
            if problem:
                ctx.error("invalid_xref", f'"xrefs[{i}]" ("{ref}") is invalid or non-canonical: {problem}',
                          ("xrefs", i), hint="write [<bundle>//]<asset-id>[#<fragment>], e.g. skills/review")
                ok = False
        if ok:
            self.envelope["xrefs"] = list(value)

    # -------------------------------------------------------------------------------- params
    def read_params(self) -> None:
        ctx = self.ctx
        if "params" not in self.root:
            return
        node = ctx.mapping(self.root["params"], ("params",), '"params"',
                           hint="write one `name: { type: ..., description: ... }` entry per param")
        if node is None:
            return
        if len(node) > MAX_PARAMS:
            ctx.error("too_many_entries", f'"params" declares {len(node)} params; at most {MAX_PARAMS} are allowed',
                      ("params",), key=True)
        for name, schema in node.items():
            yp = ("params", name)
            if not PARAM_NAME_RE.match(name):
                ctx.error("invalid_param_name",
                          f'Param name "{name}" is invalid: use letters, digits and _ (not starting with a digit)',
                          yp, key=True,
                          hint=f'rename it, e.g. "{_fix_name(name)}"' if _fix_name(name) else None)
                continue
            if not isinstance(schema, dict):
                ctx.error("invalid_type", f'Param "{name}" must be a JSON-Schema mapping, not {_describe(schema)}',
                          yp, hint="e.g. `{ type: string, description: ... }`")
                continue
            if self.check_schema(schema, yp, f'Param "{name}" schema'):
                self.params[name] = schema

    # -------------------------------------------------------------------------------- defaults, budget
    def read_defaults(self) -> Defaults | None:
        ctx = self.ctx
        if "defaults" not in self.root:
            return None
        node = ctx.mapping(self.root["defaults"], ("defaults",), '"defaults"')
        if node is None:
            return None
        yp = ("defaults",)
        ctx.check_keys(node, yp, DEFAULTS_KEYS, '"defaults"')
        out: dict[str, Any] = {}
        if "engine" in node:
            out["engine"] = self.engine_name(node["engine"], yp + ("engine",), "defaults.engine")
        if "model" in node:
            out["model"] = ctx.text(node["model"], yp + ("model",), "defaults.model")
        if "timeout" in node:
            ok, ms = self.duration(node["timeout"], yp + ("timeout",), "defaults.timeout")
            if ok:
                out["timeout_set"], out["timeout_ms"] = True, ms
        if "on_error" in node:
            out["on_error"] = ctx.choice(node["on_error"], yp + ("on_error",), "defaults.on_error", ("fail", "continue"))
        if "llm" in node:
            out["llm"] = self.llm(node["llm"], yp + ("llm",), "defaults.llm")
        out = {k: v for k, v in out.items() if v is not None}
        return Defaults(**out) if out else None

    def read_budget(self) -> Budget | None:
        ctx = self.ctx
        if "budget" not in self.root:
            return None
        node = ctx.mapping(self.root["budget"], ("budget",), '"budget"')
        if node is None:
            return None
        ctx.check_keys(node, ("budget",), BUDGET_KEYS, '"budget"')
        out: dict[str, Any] = {}
        if "max_tokens" in node:
            out["max_tokens"] = ctx.integer(node["max_tokens"], ("budget", "max_tokens"), "budget.max_tokens", 1, 2**53 - 1)
        if "max_units" in node:
            out["max_units"] = ctx.integer(node["max_units"], ("budget", "max_units"), "budget.max_units", 1, MAX_UNITS)
        out = {k: v for k, v in out.items() if v is not None}
        return Budget(**out) if out else None

    # -------------------------------------------------------------------------------- steps
    def read_steps(self) -> list[_StepDraft]:
        ctx = self.ctx
        steps = self.root.get("steps")
        if not isinstance(steps, list) or not steps:
            present = "steps" in self.root
            ctx.error(
                "steps_required",
                '"steps" is required and must be a list with at least one step'
                + (f"; got {_describe(steps)}" if present else ""),
                ("steps",) if present else (),
                line=None if present else 1,
                hint="add `steps:` with entries like `- id: build`, each with a `## build` section in the body",
            )
            return []
        if len(steps) > MAX_STEPS:
            ctx.error("too_many_entries", f'"steps" has {len(steps)} entries; at most {MAX_STEPS} are allowed',
                      ("steps",), key=True, hint="split the workflow into several files")
        drafts: list[_StepDraft] = []
        first_index: dict[str, int] = {}
        for i, raw in enumerate(steps):
            yp = ("steps", i)
            draft = self.read_step(i, raw, yp)
            if draft is None:
                continue
            if draft.id is not None:
                if draft.id in first_index:
                    first = drafts[first_index[draft.id]]
                    ctx.error("duplicate_step_id",
                              f'Duplicate step id "{draft.id}" (first declared on line {first.line})',
                              yp + ("id",), hint="step ids must be unique; rename one of them")
                    draft.id = None
                else:
                    first_index[draft.id] = len(drafts)
            drafts.append(draft)
        return drafts

    def read_step(self, i: int, raw: Any, yp: tuple) -> _StepDraft | None:
        ctx = self.ctx
        if not isinstance(raw, dict):
            ctx.error("invalid_type", f"Step #{i + 1} must be a mapping with an `id`, not {_describe(raw)}", yp,
                      hint="write `- id: <step-id>`")
            return None
        line = ctx.line(yp)
        step_id: str | None = None
        if "id" not in raw:
            ctx.error("invalid_step_id", f"Step #{i + 1} has no `id`", yp,
                      hint="add `id: <name>` (letters, digits, _ and -, not starting with a digit)")
        else:
            value = raw["id"]
            if not isinstance(value, str) or not value.strip():
                ctx.error("invalid_step_id", f"Step #{i + 1} has an invalid id: it must be a non-empty string, "
                          f"not {_describe(value)}", yp + ("id",))
            elif not STEP_ID_RE.match(value.strip()):
                self.invalid_ids.add(value.strip())
                ctx.error("invalid_step_id",
                          f'Step #{i + 1} has an invalid id "{value}": use letters, digits, _ and - only, '
                          "starting with a letter or _",
                          yp + ("id",),
                          hint=f'e.g. "{_fix_step_id(value)}"' if _fix_step_id(value) else None)
            else:
                step_id = value.strip()
        label = f'Step "{step_id}"' if step_id else f"Step #{i + 1}"
        draft = _StepDraft(index=i, ypath=yp, line=line, end_line=ctx.end_line(yp, line), id=step_id, label=label)
        ctx.check_keys(raw, yp, STEP_KEYS, label)

        has_map, has_route = "map" in raw, "route" in raw
        if has_map and has_route:
            ctx.error("conflicting_step_kind", f'{label} declares both "map" and "route"; a step has at most one of "map" or "route"',
                      yp + ("route",), key=True, hint="split it into a map step followed by a route step")
        if has_route and not has_map:
            draft.kind = "route"
            for k in ("unit", "inputs"):
                if k in raw:
                    ctx.error("conflicting_step_kind",
                              f'{label} is a route step and cannot declare "{k}"' +
                              (" (a route dispatches no unit)" if k == "unit" else
                               " (a route reads only its route.input)"),
                              yp + (k,), key=True, hint=f'remove "{k}" or move the work into a separate step')
            draft.route = self.read_route(raw["route"], yp + ("route",), draft)
        elif has_map:
            draft.kind = "map"
            if "unit" in raw:
                ctx.error("conflicting_step_kind",
                          f'{label} is a map step; its per-item unit belongs at "map.unit", not at the step level',
                          yp + ("unit",), key=True, hint="move the `unit:` block under `map:`")
            draft.map = self.read_map(raw["map"], yp + ("map",), draft)
        else:
            draft.kind = "unit"
            if "unit" in raw:
                draft.unit = self.unit_bag(raw["unit"], yp + ("unit",), label, "unit")

        if "inputs" in raw and draft.kind != "route":
            self.read_inputs(raw["inputs"], yp + ("inputs",), draft)
        if "output" in raw:
            draft.has_output = True
            node = ctx.mapping(raw["output"], yp + ("output",), f"{label}: output",
                               hint="give a JSON-Schema mapping, e.g. `{ type: object, required: [x] }`")
            if node is not None and self.check_schema(node, yp + ("output",), f"{label}: output"):
                draft.output = node
        if "gate" in raw:
            draft.has_gate = True
            draft.gate = self.read_gate(raw["gate"], yp + ("gate",), label)
        return draft

    def read_gate(self, value: Any, yp: tuple, label: str) -> GateSpec | None:
        ctx = self.ctx
        node = ctx.mapping(value, yp, f"{label}: gate", hint="write `gate: { max_loops: 3 }`; the rubric goes under `### gate` in the body")
        if node is None:
            return None
        for k in node:
            if k not in GATE_KEYS:
                ctx.error("unknown_key", f'Unknown key "{k}" in {label}: gate', yp + (k,), key=True,
                          hint='"gate" takes only max_loops; write the criteria under a `### gate` heading in the step\'s body section')
        loops = None
        if "max_loops" in node:
            loops = ctx.integer(node["max_loops"], yp + ("max_loops",), f"{label}: gate.max_loops", 1, MAX_LOOPS)
        return GateSpec(max_loops=loops)

    def read_inputs(self, value: Any, yp: tuple, draft: _StepDraft) -> None:
        ctx = self.ctx
        if not isinstance(value, list):
            ctx.error("invalid_type", f'{draft.label}: inputs must be a list of references, not {_describe(value)}', yp,
                      hint="e.g. `inputs: [steps.build.output]`")
            return
        if not value:
            ctx.error("invalid_value", f'{draft.label}: inputs must not be an empty list', yp, hint="remove the key instead")
            return
        if len(value) > MAX_INPUTS:
            ctx.error("too_many_entries", f'{draft.label}: inputs has {len(value)} entries; at most {MAX_INPUTS} are allowed', yp)
        seen: set[str] = set()
        for i, item in enumerate(value):
            ref = self.reference(item, yp + (i,), f"{draft.label}: inputs[{i}]")
            if ref is None:
                continue
            if ref.text in seen:
                ctx.error("duplicate_entry", f'{draft.label}: inputs lists "{ref.text}" more than once', yp + (i,),
                          hint="remove the repeated entry")
                continue
            seen.add(ref.text)
            draft.inputs.append(ref.text)
            self.refs.append(_RefUse(draft.index, f"inputs[{i}]", ref, yp + (i,)))

    def reference(self, value: Any, yp: tuple, what: str) -> Any:
        from akm.format.refs import ReferenceSyntaxError, parse_reference

        ctx = self.ctx
        if not isinstance(value, str):
            ctx.error("invalid_type", f"{what} must be a reference string, not {_describe(value)}", yp,
                      hint="write params.<name> or steps.<id>.output")
            return None
        try:
            return parse_reference(value)
        except ReferenceSyntaxError as exc:
            ctx.error("invalid_reference", f"{what}: {exc.message}", yp,
                      hint="a reference is params.<name> or steps.<id>.output followed by .key or [index] parts")
            return None

    # -------------------------------------------------------------------------------- map / route
    def read_map(self, value: Any, yp: tuple, draft: _StepDraft) -> MapSpec | None:
        ctx = self.ctx
        label = draft.label
        node = ctx.mapping(value, yp, f"{label}: map", hint="write `map: { over: params.items, unit: {...} }`")
        if node is None:
            return None
        ctx.check_keys(node, yp, MAP_KEYS, f"{label}: map")
        over = None
        if "over" not in node:
            ctx.error("missing_key", f'{label}: map needs "over": the array to fan out over', yp,
                      hint="e.g. `over: params.files` or `over: steps.plan.output.items`")
        else:
            ref = self.reference(node["over"], yp + ("over",), f"{label}: map.over")
            if ref is not None:
                over = ref.text
                self.refs.append(_RefUse(draft.index, "map.over", ref, yp + ("over",)))
        out: dict[str, Any] = {}
        if "concurrency" in node:
            out["concurrency"] = ctx.integer(node["concurrency"], yp + ("concurrency",), f"{label}: map.concurrency", 1, MAX_CONCURRENCY)
        if "reducer" in node:
            out["reducer"] = ctx.choice(node["reducer"], yp + ("reducer",), f"{label}: map.reducer", ("collect", "vote"))
        if "unit" in node:
            out["unit"] = self.unit_bag(node["unit"], yp + ("unit",), label, "map.unit")
        if over is None:
            return None
        return MapSpec(over=over, **{k: v for k, v in out.items() if v is not None})

    def read_route(self, value: Any, yp: tuple, draft: _StepDraft) -> RouteSpec | None:
        ctx = self.ctx
        label = draft.label
        node = ctx.mapping(value, yp, f"{label}: route",
                           hint="write `route: { input: <ref>, when: [{ match: x, step: y }], default: z }`")
        if node is None:
            return None
        ctx.check_keys(node, yp, ROUTE_KEYS, f"{label}: route")
        input_text = None
        if "input" not in node:
            ctx.error("missing_key", f'{label}: route needs "input": the value to route on', yp,
                      hint="e.g. `input: steps.classify.output.kind`")
        else:
            ref = self.reference(node["input"], yp + ("input",), f"{label}: route.input")
            if ref is not None:
                input_text = ref.text
                self.refs.append(_RefUse(draft.index, "route.input", ref, yp + ("input",)))
        branches: list[RouteBranch] = []
        if "when" not in node:
            ctx.error("missing_key", f'{label}: route needs "when": a list of {{ match, step }} branches', yp)
        elif not isinstance(node["when"], list):
            ctx.error("invalid_type", f'{label}: route.when must be a list of {{ match, step }} branches, not {_describe(node["when"])}',
                      yp + ("when",))
        elif not node["when"]:
            ctx.error("invalid_value", f'{label}: route.when must list at least one branch', yp + ("when",))
        else:
            when = node["when"]
            if len(when) > MAX_ROUTE_BRANCHES:
                ctx.error("too_many_entries", f'{label}: route.when has {len(when)} branches; at most {MAX_ROUTE_BRANCHES} are allowed',
                          yp + ("when",))
            seen: dict[str, int] = {}
            for i, raw in enumerate(when):
                byp = yp + ("when", i)
                branch = self.read_branch(raw, byp, f"{label}: route.when[{i}]")
                if branch is None:
                    continue
                if branch.match in seen:
                    ctx.error("duplicate_route_match",
                              f'{label} has a duplicate "when" match "{branch.match}" (also branch {seen[branch.match] + 1}); this branch can never be chosen',
                              byp + ("match",), hint="each match value may appear once; remove or change one branch")
                    continue
                seen[branch.match] = i
                branches.append(branch)
                draft.route_lines.append((branch.step, byp + ("step",)))
        default = None
        if "default" in node:
            default = ctx.text(node["default"], yp + ("default",), f"{label}: route.default")
            if default is not None:
                draft.route_lines.append((default, yp + ("default",)))
        if input_text is None or not branches:
            return None
        return RouteSpec(input=input_text, when=branches, default=default)

    def read_branch(self, raw: Any, yp: tuple, what: str) -> RouteBranch | None:
        ctx = self.ctx
        node = ctx.mapping(raw, yp, what, hint="write `{ match: <value>, step: <step-id> }`")
        if node is None:
            return None
        before = len(ctx.errors)
        ctx.check_keys(node, yp, BRANCH_KEYS, what)
        match = None
        if "match" not in node:
            ctx.error("missing_key", f'{what} needs "match": the value that selects this branch', yp)
        else:
            value = node["match"]
            if isinstance(value, (str, bool, int, float)):
                match = js_string(value)
                if match == "":
                    ctx.error("empty_route_match", f'{what} matches the empty string, which a route input can never usefully be',
                              yp + ("match",), hint="use a non-empty match value, or `default:` for the fallback")
                    match = None
            else:
                ctx.error("invalid_type", f'{what}.match must be a string, number or boolean, not {_describe(value)}',
                          yp + ("match",))
        step = None
        if "step" not in node:
            ctx.error("missing_key", f'{what} needs "step": the step to run when it matches', yp)
        else:
            step = ctx.text(node["step"], yp + ("step",), f"{what}.step")
        if len(ctx.errors) != before or match is None or step is None:
            return None
        return RouteBranch(match=match, step=step)

    def check_routes(self, drafts: list[_StepDraft]) -> None:
        """Route targets must exist and come after the routing step (routes never loop)."""
        ctx = self.ctx
        index = {}
        for d in drafts:
            if d.id is not None and d.id not in index:
                index[d.id] = d.index
        for d in drafts:
            for target, yp in d.route_lines:
                if target not in index:
                    ctx.error("route_target_unknown", f'{d.label} routes to unknown step "{target}"', yp,
                              hint=f"{_suggest(target, list(index))}route targets must be step ids declared after this step")
                elif target == d.id:
                    ctx.error("route_target_self", f'{d.label} must not route to itself', yp,
                              hint="use a gate with max_loops to repeat a step")
                elif index[target] < d.index:
                    ctx.error("route_backward", f'{d.label} routes backward to "{target}", which is declared before it',
                              yp, hint="routes only go forward; repeat work with a gate (max_loops) instead of a loop")

    # -------------------------------------------------------------------------------- unit bag
    def unit_bag(self, value: Any, yp: tuple, label: str, prefix: str) -> UnitBag | None:
        """Read a `unit:` / `map.unit:` bag. Messages name fields as `<label>: <prefix>.<key>`."""
        ctx = self.ctx
        what = f"{label}: {prefix}"
        node = ctx.mapping(value, yp, what, hint="e.g. `unit: { timeout: 10m, retry: { max: 1, on: [timeout] } }`")
        if node is None:
            return None
        ctx.check_keys(node, yp, UNIT_KEYS, what)
        out: dict[str, Any] = {}
        if "exec" in node:
            out["exec"] = self.exec_spec(node["exec"], yp + ("exec",), what)
            for k in ("engine", "model", "llm"):
                if k in node:
                    ctx.error("exec_engine_conflict",
                              f'{label}: {prefix} declares both "exec" and "{k}"; an exec unit runs a command and names no engine',
                              yp + (k,), key=True, hint=f'remove "{k}" (or remove "exec" to dispatch to an engine)')
        if "engine" in node:
            out["engine"] = self.engine_name(node["engine"], yp + ("engine",), f"{what}.engine")
        if "model" in node:
            out["model"] = ctx.text(node["model"], yp + ("model",), f"{what}.model")
        if "llm" in node:
            out["llm"] = self.llm(node["llm"], yp + ("llm",), f"{what}.llm")
        if "timeout" in node:
            ok, ms = self.duration(node["timeout"], yp + ("timeout",), f"{what}.timeout")
            if ok:
                out["timeout_set"], out["timeout_ms"] = True, ms
        if "retry" in node:
            out["retry"] = self.retry(node["retry"], yp + ("retry",), what)
        if "on_error" in node:
            out["on_error"] = ctx.choice(node["on_error"], yp + ("on_error",), f"{what}.on_error", ("fail", "continue"))
        if "output" in node:
            schema = ctx.mapping(node["output"], yp + ("output",), f"{what}.output",
                                 hint="give a JSON-Schema mapping, e.g. `{ type: object }`")
            if schema is not None and self.check_schema(schema, yp + ("output",), f"{what}.output"):
                out["output"] = schema
        if "env" in node:
            out["env"] = ctx.string_list(node["env"], yp + ("env",), f"{what}.env", limit=MAX_ENV_REFS, unique=True)
        if "isolation" in node:
            out["isolation"] = ctx.choice(node["isolation"], yp + ("isolation",), f"{what}.isolation", ("none", "worktree"))
        keep = {k: v for k, v in out.items() if v is not None or k == "timeout_ms"}
        return UnitBag(**keep)

    def engine_name(self, value: Any, yp: tuple, what: str) -> str | None:
        name = self.ctx.text(value, yp, what)
        if name is None:
            return None
        if len(name) > 63 or not ENGINE_NAME_RE.match(name):
            self.ctx.error("invalid_value",
                           f'{what} "{name}" is not a valid engine name: lower-case letters and digits in '
                           "dash-separated words, at most 63 characters", yp)
            return None
        return name

    def duration(self, value: Any, yp: tuple, what: str) -> tuple[bool, int | None]:
        """(ok, milliseconds). `none` -> (True, None): explicitly unbounded."""
        ctx = self.ctx
        ms: int | None
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            ctx.error("invalid_duration", f"{what} must be a duration, not {_describe(value)}", yp, hint=DURATION_HINT)
            return (False, None)
        if isinstance(value, str):
            text = value.strip().lower()
            if text == "none":
                return (True, None)
            m = DURATION_RE.match(text)
            if not m:
                ctx.error("invalid_duration", f'{what} "{value}" is not a valid duration', yp, hint=DURATION_HINT)
                return (False, None)
            ms = int(m.group(1)) * {None: 1, "ms": 1, "s": 1000, "m": 60_000}[m.group(2)]
        else:
            n = _as_int(value)
            if n is None or n <= 0:
                ctx.error("invalid_duration", f"{what} must be a positive whole number of milliseconds; got {js_string(value)}",
                          yp, hint=DURATION_HINT)
                return (False, None)
            ms = n
        if ms <= 0:
            ctx.error("invalid_duration", f'{what} must be longer than zero; got "{value}"', yp, hint=DURATION_HINT)
            return (False, None)
        if ms > MAX_TIMEOUT_MS:
            ctx.error("out_of_range", f"{what} is {ms} ms; the longest allowed is {MAX_TIMEOUT_MS} ms (about 24.8 days)",
                      yp, hint='use "none" for no limit')
            return (False, None)
        return (True, ms)

    def retry(self, value: Any, yp: tuple, what: str) -> RetrySpec | None:
        ctx = self.ctx
        node = ctx.mapping(value, yp, f"{what}.retry", hint="write `retry: { max: 2, on: [timeout] }`")
        if node is None:
            return None
        before = len(ctx.errors)
        ctx.check_keys(node, yp, RETRY_KEYS, f"{what}.retry")
        max_n = None
        if "max" not in node:
            ctx.error("missing_key", f'{what}.retry.max is required: how many extra attempts to allow', yp,
                      hint="e.g. `retry: { max: 2, on: [timeout] }`")
        else:
            max_n = ctx.integer(node["max"], yp + ("max",), f"{what}.retry.max", 0, MAX_RETRY)
        reasons: list[str] = []
        if "on" not in node:
            ctx.error("missing_key", f'{what}.retry.on is required: the failure reasons that trigger a retry', yp,
                      hint=f"choose from: {', '.join(RETRYABLE_REASONS)}")
        elif not isinstance(node["on"], list):
            ctx.error("invalid_type", f'{what}.retry.on must be a list of failure reasons, not {_describe(node["on"])}',
                      yp + ("on",), hint=f"choose from: {', '.join(RETRYABLE_REASONS)}")
        elif not node["on"]:
            ctx.error("invalid_value", f'{what}.retry.on must list at least one failure reason', yp + ("on",),
                      hint=f"choose from: {', '.join(RETRYABLE_REASONS)}")
        else:
            for i, reason in enumerate(node["on"]):
                if not isinstance(reason, str) or reason not in RETRYABLE_REASONS:
                    shown = f'"{reason}"' if isinstance(reason, str) else _describe(reason)
                    ctx.error("invalid_retry_reason", f'{what}.retry.on[{i}] {shown} is not a retryable failure reason',
                              yp + ("on", i),
                              hint=f"{_suggest(reason, RETRYABLE_REASONS) if isinstance(reason, str) else ''}"
                                   f"valid reasons: {', '.join(RETRYABLE_REASONS)}")
                elif reason in reasons:
                    ctx.error("duplicate_entry", f'{what}.retry.on lists "{reason}" more than once', yp + ("on", i),
                              hint="remove the repeated entry")
                else:
                    reasons.append(reason)
        if len(ctx.errors) != before or max_n is None:
            return None
        return RetrySpec(max=max_n, on=reasons)

    def llm(self, value: Any, yp: tuple, what: str) -> LlmOptions | None:
        ctx = self.ctx
        node = ctx.mapping(value, yp, what)
        if node is None:
            return None
        ctx.check_keys(node, yp, LLM_KEYS, what)
        out: dict[str, Any] = {}
        if "temperature" in node:
            t = node["temperature"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                ctx.error("invalid_type", f'{what}.temperature must be a finite number, not {_describe(t)}', yp + ("temperature",))
            else:
                out["temperature"] = float(t) if isinstance(t, float) else t
        for k in ("max_tokens", "context_length"):
            if k in node:
                out[k] = ctx.integer(node[k], yp + (k,), f"{what}.{k}", 1, 2**53 - 1)
        for k in ("supports_json_schema", "enable_thinking"):
            if k in node:
                out[k] = ctx.boolean(node[k], yp + (k,), f"{what}.{k}")
        if "extra_params" in node:
            out["extra_params"] = self.extra_params(node["extra_params"], yp + ("extra_params",), what)
        out = {k: v for k, v in out.items() if v is not None}
        return LlmOptions(**out) if out else None

    def extra_params(self, value: Any, yp: tuple, what: str) -> dict | None:
        ctx = self.ctx
        node = ctx.mapping(value, yp, f"{what}.extra_params")
        if node is None:
            return None
        before = len(ctx.errors)
        problem = _json_value_problem(node)
        if problem:
            ctx.error(problem[0], f"{what}.extra_params {problem[1]}", yp)
            return None
        size = _json_len(node)
        if size > MAX_EXTRA_PARAMS_BYTES:
            ctx.error("too_large", f'{what}.extra_params is {size} bytes as JSON; at most {MAX_EXTRA_PARAMS_BYTES} are allowed', yp)
        for k in node:
            if _norm_key(k) in PROTECTED_LLM_KEYS:
                ctx.error("protected_llm_param",
                          f'{what}.extra_params.{k} is protected by AKM: akm sets it for every request',
                          yp + (k,), key=True,
                          hint="use the dedicated llm keys (temperature, max_tokens, enable_thinking) or the unit's model")

        def walk(v: Any, p: tuple) -> None:
            if isinstance(v, dict):
                for k, sub in v.items():
                    if _norm_key(k) in CREDENTIAL_KEYS:
                        ctx.error("credential_in_llm",
                                  f'{what}.extra_params key "{k}" cannot carry credentials in a workflow file',
                                  p + (k,), key=True,
                                  hint="configure the engine's API key in akm config as ${ENV_NAME}; workflow files are not secret")
                    walk(sub, p + (k,))
            elif isinstance(v, list):
                for i, sub in enumerate(v):
                    walk(sub, p + (i,))

        walk(node, yp)
        return node if len(ctx.errors) == before else None

    def exec_spec(self, value: Any, yp: tuple, what: str) -> ExecSpec | None:
        ctx = self.ctx
        if not isinstance(value, dict):
            ctx.error("invalid_type",
                      f'{what}.exec must be a mapping holding a "command" argv list, not {_describe(value)}', yp,
                      hint='e.g. `exec: { command: ["make", "test"] }`')
            return None
        ctx.check_keys(value, yp, EXEC_KEYS, f"{what}.exec")
        cmd = value.get("command")
        cyp = yp + ("command",)
        argv_hint = ('write an argv list such as ["make", "test"]; for shell features use '
                     '["bash", "-lc", "a | b"] explicitly')
        if "command" not in value or not isinstance(cmd, list) or not cmd:
            got = "it is missing" if "command" not in value else f"got {_describe(cmd)}"
            ctx.error("exec_invalid_command",
                      f'{what}.exec requires "command": a non-empty argv list, run directly and never through a shell; {got}',
                      cyp if "command" in value else yp, hint=argv_hint)
            return None
        if len(cmd) > MAX_EXEC_ARGV:
            ctx.error("too_many_entries", f'{what}.exec.command has {len(cmd)} entries; at most {MAX_EXEC_ARGV} entries are allowed', cyp)
            return None
        for i, arg in enumerate(cmd):
            if not isinstance(arg, str) or arg == "":
                ctx.error("exec_invalid_command",
                          f'{what}.exec.command[{i}] must be a non-empty string, not {_describe(arg)}', cyp + (i,),
                          hint='quote numbers and booleans, e.g. "1"' if not isinstance(arg, str) else None)
                return None
        for i, arg in enumerate(cmd):
            if utf8_len(arg) > MAX_EXEC_ARG_BYTES:
                ctx.error("too_large", f'{what}.exec.command[{i}] is {utf8_len(arg)} bytes; each entry may be at most {MAX_EXEC_ARG_BYTES} bytes',
                          cyp + (i,), hint="put long input in a file and pass its path")
                return None
        spec: dict[str, Any] = {"command": list(cmd)}
        ok = True
        if "cwd" in value:
            cwd = ctx.text(value["cwd"], yp + ("cwd",), f"{what}.exec.cwd")
            if cwd is None:
                ok = False
            elif len(cwd) > MAX_EXEC_CWD_CHARS:
                ctx.error("too_large", f'{what}.exec.cwd is {len(cwd)} characters; at most {MAX_EXEC_CWD_CHARS} are allowed', yp + ("cwd",))
                ok = False
            elif not _contained_relative(cwd):
                ctx.error("exec_cwd_not_relative",
                          f'{what}.exec.cwd "{cwd}" must be a RELATIVE path inside the unit\'s working directory '
                          "(no absolute paths, drive letters, ~ or ..)",
                          yp + ("cwd",), hint="e.g. `cwd: packages/core`")
                ok = False
            else:
                spec["cwd"] = cwd
        if "pass_env" in value:
            pe = value["pass_env"]
            pyp = yp + ("pass_env",)
            if not isinstance(pe, list) or not pe:
                ctx.error("invalid_type" if not isinstance(pe, list) else "invalid_value",
                          f'{what}.exec.pass_env must be a non-empty list of environment variable names; got {_describe(pe)}',
                          pyp, hint="it passes names only; values for the unit belong in `env:`")
                ok = False
            elif len(pe) > MAX_EXEC_PASS_ENV:
                ctx.error("too_many_entries", f'{what}.exec.pass_env has {len(pe)} names; at most {MAX_EXEC_PASS_ENV} are allowed',
                          pyp, hint="use `inherit_env: true` to pass the whole environment")
                ok = False
            else:
                names: list[str] = []
                for i, name in enumerate(pe):
                    if not isinstance(name, str) or not ENV_VAR_RE.match(name):
                        ctx.error("exec_invalid_env_name",
                                  f'{what}.exec.pass_env[{i}] must be an environment variable name, not {_describe(name)}',
                                  pyp + (i,), hint="letters, digits and _, not starting with a digit")
                        ok = False
                        break
                    if name in names:
                        ctx.error("duplicate_entry", f'{what}.exec.pass_env lists "{name}" more than once', pyp + (i,),
                                  hint="remove the repeated entry")
                        ok = False
                        break
                    names.append(name)
                spec["pass_env"] = names
        if "inherit_env" in value:
            flag = ctx.boolean(value["inherit_env"], yp + ("inherit_env",), f"{what}.exec.inherit_env")
            if flag is None:
                ok = False
            else:
                spec["inherit_env"] = flag
        return ExecSpec(**spec) if ok else None

    # -------------------------------------------------------------------------------- schemas
    def check_schema(self, schema: dict, yp: tuple, what: str) -> bool:
        """Size, JSON-ability and the supported JSON-Schema subset. True when usable."""
        from akm.format.schema import check_schema_definition

        ctx = self.ctx
        problem = _json_value_problem(schema)
        if problem:
            ctx.error(problem[0], f"{what} {problem[1]}", yp)
            return False
        size = _json_len(schema)
        if size > MAX_SCHEMA_BYTES:
            ctx.error("too_large", f"{what} is {size} bytes as JSON; at most {MAX_SCHEMA_BYTES} are allowed", yp)
            return False
        ok = True
        for p in check_schema_definition(schema):
            sub = _schema_path(p.path)
            node = _walk(schema, sub)
            keyword = p.keyword
            kpath = yp + sub + ((keyword,) if isinstance(node, dict) and keyword in node else ())
            if p.kind == "unsupported":
                ctx.error("schema_unsupported_keyword", f"{what}: {p.message}", kpath, key=True,
                          hint=_SCHEMA_HINTS.get(keyword))
            else:
                ctx.error("schema_malformed", f"{what} is not a valid JSON Schema: {p.message}", kpath, key=True)
            ok = False
        return ok

    # -------------------------------------------------------------------------------- body
    def bind_body(self, drafts: list[_StepDraft], body: Body) -> dict[int, tuple]:
        """Match `## id` sections to steps; return {step index: (instructions, rubric, H2 line)}."""
        ctx = self.ctx
        by_id = {d.id: d for d in drafts if d.id is not None}
        bound: dict[str, Any] = {}
        result: dict[int, tuple] = {}
        for section in body.sections:
            head = section.heading
            if head.text not in by_id:
                if head.text in self.invalid_ids:
                    hint = f'"{head.text}" is not a valid step id (see the error at its step); fix the id and this heading together'
                else:
                    hint = f"{_suggest(head.text, list(by_id))}use ### or deeper for sub-headings inside a step"
                ctx.error("unexpected_heading",
                          f'Unexpected level-2 heading "## {head.text}": a ## heading must exactly match a declared step id',
                          line=head.line, hint=hint)
                continue
            if head.text in bound:
                ctx.error("duplicate_section",
                          f'Step "{head.text}" has more than one "## {head.text}" section (the first is on line {bound[head.text].heading.line})',
                          line=head.line, hint="merge the two sections")
                continue
            bound[head.text] = section
            for extra in section.extra_gate_lines:
                ctx.error("duplicate_gate", f'Step "{head.text}" has more than one "### gate" rubric; only one is allowed per step',
                          line=extra, hint="merge the criteria under the first ### gate heading")
            d = by_id[head.text]
            instr = _block(section.instructions)
            rubric = _block(section.rubric)
            for block, name in ((instr, "instructions"), (rubric, "gate rubric")):
                if block is not None and utf8_len(block.text) > MAX_TEXT_BYTES:
                    ctx.error("too_large", f'Step "{d.id}" {name} are {utf8_len(block.text)} bytes; at most {MAX_TEXT_BYTES} are allowed',
                              line=block.start_line, hint="move reference material into files the step reads")
            result[d.index] = (instr, rubric, head.line)
            if d.kind != "route" and instr is None:
                only_gate = " (it holds only a ### gate rubric)" if section.gate_line is not None else ""
                ctx.error("empty_section", f'Step "{d.id}" section "## {d.id}" is empty{only_gate}; a {d.kind} step needs instruction text',
                          line=head.line, hint="write what the step should do under the heading, before any ### gate")
        for d in drafts:
            if d.id is not None and d.kind != "route" and d.id not in bound:
                ctx.error("missing_section", f'Step "{d.id}" must have a "## {d.id}" body section with its instructions',
                          line=d.line, hint=f"add a `## {d.id}` heading to the body followed by what the step should do")
        for stray in body.stray_h1:
            ctx.error("text_after_h1",
                      f'Text after the level-1 heading "# {stray.text}" belongs to no step and would be ignored',
                      line=stray.line,
                      hint="make it a ## <step-id> section, demote the heading to ###, or move the text into the preamble")
        return result

    # -------------------------------------------------------------------------------- cross-step
    def check_references(self, drafts: list[_StepDraft]) -> None:
        ctx = self.ctx
        position_of: dict[str, int] = {}
        for d in drafts:
            if d.id is not None and d.id not in position_of:
                position_of[d.id] = d.index
        by_index = {d.index: d for d in drafts}
        for use in self.refs:
            d = by_index[use.step_index]
            ref = use.ref
            where = f"{d.label}: {use.position} ({ref.text})"
            if ref.root == "params":
                if use.position.startswith("inputs"):
                    ctx.error("param_as_input",
                              f"{where} names a param, not a step output; params are attached to every unit already",
                              use.ypath, hint="remove it from inputs")
                    continue
                if not self.params_declared:
                    ctx.error("unknown_param_reference",
                              f'{where} references param "{ref.name}", but the workflow declares no params',
                              use.ypath, hint=f"declare it: `params: {{ {ref.name}: {{ type: ... }} }}`")
                elif ref.name not in self.params and ref.name not in _raw_params(self.root):
                    ctx.error("unknown_param_reference",
                              f'{where} references a param not declared in "params:"',
                              use.ypath,
                              hint=f"{_suggest(ref.name, list(_raw_params(self.root)))}declare it under params: or fix the name")
                elif use.position == "map.over":
                    self.check_over_array(d, where, use, self.params.get(ref.name), [])
                continue
            if ref.name not in position_of:
                ctx.error("unknown_step_reference", f'{where} cannot be resolved: "{ref.name}" is not a step in this workflow',
                          use.ypath, hint=f"{_suggest(ref.name, list(position_of))}reference an earlier step's id")
            elif position_of[ref.name] >= d.index:
                what = "is this step itself" if ref.name == d.id else "comes after this step"
                ctx.error("forward_reference",
                          f'{where} cannot be resolved: step "{ref.name}" does not come before this step (it {what})',
                          use.ypath, hint="steps can only use outputs of steps declared earlier; reorder the steps")
            elif use.position == "map.over":
                target = by_index[position_of[ref.name]]
                self.check_over_array(d, where, use, target.output, list(ref.path))

    def check_over_array(self, d: _StepDraft, where: str, use: _RefUse, schema: Any, path: list) -> None:
        """`over` must resolve to an array; refuse when the declared schema rules that out."""
        for seg in path:
            if not isinstance(schema, dict):
                return
            if isinstance(seg, int):
                schema = schema.get("items")
            else:
                props = schema.get("properties")
                schema = props.get(seg) if isinstance(props, dict) else None
        if not isinstance(schema, dict) or "type" not in schema:
            return
        declared = schema["type"]
        types = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else None
        if types is None or "array" in types:
            return
        self.ctx.error("over_not_array",
                       f"{where} must resolve to an array, but its schema declares type {json.dumps(declared)}",
                       use.ypath, hint="fan out over a list (type: array), e.g. a param declared `{ type: array }`")

    def warn_untyped(self, drafts: list[_StepDraft]) -> None:
        for d in drafts:
            if d.id is not None and d.kind in ("unit", "map") and not d.has_output:
                self.ctx.warn("missing_output_schema",
                              f'Step "{d.id}" declares no "output:" schema, so its artifact is untyped',
                              d.line, hint="add `output: { type: ... }` so later steps and gates can rely on its shape")


# ---------------------------------------------------------------------------------------------


def _block(block: Any) -> TextBlock | None:
    if block is None:
        return None
    return TextBlock(text=block.text, start_line=block.start_line, end_line=block.end_line)


def _raw_params(root: dict) -> dict:
    p = root.get("params")
    return p if isinstance(p, dict) else {}


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


def _contained_relative(path: str) -> bool:
    if not path or path[0] in "/\\~" or re.match(r"[A-Za-z]:", path):
        return False
    return ".." not in re.split(r"[/\\]+", path)


def _fix_name(name: str) -> str:
    fixed = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if fixed and fixed[0].isdigit():
        fixed = "_" + fixed
    return fixed if fixed and PARAM_NAME_RE.match(fixed) and fixed != name else ""


def _fix_step_id(name: Any) -> str:
    if not isinstance(name, str):
        return ""
    fixed = re.sub(r"[^A-Za-z0-9_-]", "-", name.strip())
    if fixed and fixed[0].isdigit():
        fixed = "s" + fixed
    return fixed if fixed and STEP_ID_RE.match(fixed) and fixed != name else ""


def _xref_problem(ref: str) -> str | None:
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
    if not concept or ":" in concept or re.match(r"[A-Za-z]:", concept) or concept.startswith("/"):
        return "the asset id must be a relative path without ':'"
    if ".." in concept.split("/") or "//" in concept or concept.endswith("/") or re.search(r"\s", concept):
        return "the asset id must not contain '..', empty segments or whitespace"
    if hsep and not fragment:
        return "the #fragment is empty"
    return None


_SCHEMA_SEG = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def _schema_path(pointer: Any) -> tuple:
    """`$.properties.name` / `$.anyOf[1]` -> ('properties', 'name') / ('anyOf', 1)."""
    if isinstance(pointer, (list, tuple)):
        return tuple(pointer)
    if not isinstance(pointer, str) or not pointer.startswith("$"):
        return ()
    out: list[Any] = []
    for m in _SCHEMA_SEG.finditer(pointer[1:]):
        out.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
    return tuple(out)


def _walk(value: Any, path: tuple) -> Any:
    for seg in path:
        if isinstance(seg, int) and isinstance(value, list) and 0 <= seg < len(value):
            value = value[seg]
        elif isinstance(seg, str) and isinstance(value, dict) and seg in value:
            value = value[seg]
        else:
            return None
    return value


_SCHEMA_HINTS = {
    "const": "use a one-value enum, e.g. `enum: [x]`",
    "$ref": "inline the referenced schema",
    "$defs": "inline the definitions where they are used",
    "definitions": "inline the definitions where they are used",
    "pattern": "use enum or minLength/maxLength, or state the rule in the ### gate rubric",
    "format": "use enum, or state the rule in the ### gate rubric",
    "if": "express the alternatives with anyOf or oneOf",
    "then": "express the alternatives with anyOf or oneOf",
    "else": "express the alternatives with anyOf or oneOf",
    "patternProperties": "list the properties explicitly",
    "uniqueItems": "drop it, or state the rule in the ### gate rubric",
}
