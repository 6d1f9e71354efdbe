"""Run params from CLI flags: `akm workflow run <target> --name value ...`.

Why flags and not a JSON blob: agents and people both type `--count 3` naturally, and each flag can be
checked against the declared param schema with a message that names it. The rules, in short:

* Tokens: the first positional token is the target (a file path, `workflows/<name>` ref or run id).
  Param flags must come after it. A second positional, a bare `--`, or a param flag before the target
  is a usage error. Run-control flags (`RUN_CONTROL_VALUE_FLAGS`, `RUN_CONTROL_BOOL_FLAGS`, plus
  `-h`/`-q` short forms) may appear anywhere and are *consumed*: a workflow param whose name is a
  run-control name (e.g. `timeout`, `format`, `help`) therefore can never be set from the CLI.
* `--name=value` gives the exact text (may be empty); `--name value` takes the next token unless it
  starts with `-` (a negative number such as `-3` is still a value); otherwise `--name` is a bare flag.
* Coercion follows the param's declared `type`: arrays by repeating the flag or one JSON `[...]` value,
  objects as JSON, numbers/integers the way JavaScript's `Number()` reads decimal text (`1e3`, `1.0`;
  hex, octal and binary literals such as `0x10` are refused),
  booleans `true`/`false`, strings kept byte-exact (`001` stays `"001"`). A bare flag is `true` for a
  boolean (or an untyped param) and an error naming the param for any other type.
* Omitted params that declare a schema `default:` get it; then the object is validated against the
  declared schemas; any problem is `INVALID_ARGUMENT`.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

from akm.errors import UsageError
from akm.format.schema import preview, validate_instance
from akm.record import dataclass, field
from akm.text import JS_WHITESPACE

RUN_CONTROL_VALUE_FLAGS: tuple[str, ...] = ("max-steps", "timeout", "format", "from")
RUN_CONTROL_BOOL_FLAGS: tuple[str, ...] = ("help", "quiet", "verbose", "new", "detach", "workers", "plan")
_SHORT_FLAGS = {"-h": "help", "-q": "quiet"}

INVALID_FLAG_VALUE = "INVALID_ARGUMENT"
UNKNOWN_FLAG = "UNKNOWN_FLAG"

_NEGATIVE_NUMBER = re.compile(r"^-\d")
_MAX_SAFE_INTEGER = 2**53 - 1
# What JavaScript's Number() accepts after trimming (besides hex/octal/binary and Infinity).
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")
_RADIX = re.compile(r"0([xX][0-9a-fA-F]+|[oO][0-7]+|[bB][01]+)\Z")

_AFTER_TARGET = "must come after the workflow path, ref or run id"


@dataclass
class RunArgs:
    """`workflow run` argv after the subcommand, split into target, run controls and raw param flags."""

    target: str | None
    controls: dict[str, str | bool] = field(default_factory=dict)
    params: list[tuple[str, str | bool]] = field(default_factory=list)


def _is_value_token(token: str) -> bool:
    return not token.startswith("-") or bool(_NEGATIVE_NUMBER.match(token))


def split_run_args(tokens: list[str]) -> RunArgs:
    """Split `workflow run` tokens; raise `UsageError` for misplaced or removed flags."""
    args = RunArgs(target=None)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok == "--":
            raise UsageError(
                f'"--" is not accepted: param flags {_AFTER_TARGET}, e.g. akm workflow run <target> --name value',
                code=INVALID_FLAG_VALUE,
            )
        if _is_value_token(tok):
            if args.target is not None:
                raise UsageError(
                    f'Unexpected extra argument "{tok}": pass exactly one target; param flags '
                    f"{_AFTER_TARGET} and each value follows its flag (--name value)",
                    code=INVALID_FLAG_VALUE,
                )
            args.target = tok
            continue
        if not tok.startswith("--"):
            if tok in _SHORT_FLAGS:
                args.controls[_SHORT_FLAGS[tok]] = True
                continue
            from akm.codes import Code

            raise UsageError(
                f'Unknown option "{tok}"; params are passed as --name value',
                code=Code.UNKNOWN_FLAG,
            )
        body = tok[2:]
        name, has_eq, inline = body.partition("=")
        if not name:
            raise UsageError(f'Malformed flag "{tok}": expected --name or --name=value', code=INVALID_FLAG_VALUE)
        if name == "params":
            raise UsageError(
                "--params was removed; pass each param as --name value",
                code=INVALID_FLAG_VALUE,
                hint="e.g. akm workflow run workflows/release --version 1.2.3 --dry_run",
            )
        if name in RUN_CONTROL_BOOL_FLAGS:
            if has_eq and inline not in ("true", "false"):
                raise UsageError(f"--{name} takes no value (or =true / =false)", code=INVALID_FLAG_VALUE)
            args.controls[name] = (inline == "true") if has_eq else True
            continue
        if name in RUN_CONTROL_VALUE_FLAGS:
            if has_eq:
                args.controls[name] = inline
            elif i < len(tokens) and _is_value_token(tokens[i]):
                args.controls[name] = tokens[i]
                i += 1
            else:
                raise UsageError(f"--{name} requires a value", code=INVALID_FLAG_VALUE)
            continue
        # A workflow param.
        if args.target is None:
            raise UsageError(
                f"Param flag --{name} {_AFTER_TARGET}: akm workflow run <target> --{name} ...",
                code=INVALID_FLAG_VALUE,
            )
        if has_eq:
            args.params.append((name, inline))
        elif i < len(tokens) and _is_value_token(tokens[i]):
            args.params.append((name, tokens[i]))
            i += 1
        else:
            args.params.append((name, True))
    return args


# --------------------------------------------------------------------------------------------
# Coercion
# --------------------------------------------------------------------------------------------


def js_number(text: str) -> int | float | None:
    """Read text the way JavaScript's `Number()` does; None for NaN, blank or non-finite.

    Integral results come back as `int` so JSON output shows `3`, not `3.0`.
    """
    s = text.strip(JS_WHITESPACE)
    if not s:
        return None
    m = _RADIX.match(s)
    if m:
        whole = int(s[2:], {"x": 16, "o": 8, "b": 2}[s[1].lower()])
        if whole <= _MAX_SAFE_INTEGER:
            return whole
        try:
            return float(whole)  # JS loses precision here too; only finite values count
        except OverflowError:
            return None
    if not _DECIMAL.match(s):
        return None
    value = float(s)
    if not math.isfinite(value):
        return None
    if value.is_integer() and abs(value) <= _MAX_SAFE_INTEGER:
        return int(value)
    return value


def _types_of(schema: Any) -> list[str]:
    declared = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    return []


def _no_constants(const: str) -> Any:
    raise ValueError(f"{const} is not JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"the number {literal} is out of range")
    return value


def _whole_literal(literal: str) -> int:
    if len(literal) > 4000:  # int() refuses > 4300 digits, with advice meant for programmers
        raise ValueError(f"a number of {len(literal)} digits is out of range")
    return int(literal)


def _loads(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, no number that reads as infinity (`1e999`) or has thousands of digits."""
    return json.loads(text, parse_constant=_no_constants, parse_float=_finite_float, parse_int=_whole_literal)


def _parse_json(flag: str, text: str) -> Any:
    try:
        return _loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--{flag} must contain valid JSON: {exc}", code=INVALID_FLAG_VALUE) from None


def _coerce_one(flag: str, raw: str | bool, schema: Any) -> Any:
    types = _types_of(schema)
    if not types:
        return raw
    if raw is True:
        if "boolean" in types:
            return True
        # A bare flag is a boolean switch. For a string param it used to mean the text "true",
        # which silently turned a forgotten value (`--branch --dry_run`) into a wrong one.
        raise UsageError(
            f"Param {flag} needs a value: --{flag} was given without one, and {flag} is declared as "
            f"{' or '.join(types)}, not boolean",
            code=INVALID_FLAG_VALUE,
            hint=f"pass --{flag} <value> or --{flag}=<value>",
        )
    text = str(raw)
    if "string" in types:
        return text
    if ("number" in types or "integer" in types) and _RADIX.match(text.strip(JS_WHITESPACE)):
        # JavaScript's Number() reads 0x10 as 16; a typo'd or pasted hex/octal/binary literal silently
        # becoming a different count is worse than asking for the decimal spelling.
        raise UsageError(
            f"--{flag} {text.strip()!r} is a hexadecimal, octal or binary literal; write the number in decimal "
            f"({js_number(text)!r})",
            code=INVALID_FLAG_VALUE,
        )
    for t in types:
        if t == "boolean" and text in ("true", "false"):
            return text == "true"
        if t == "number":
            n = js_number(text)
            if n is not None:
                return n
        if t == "integer":
            n = js_number(text)
            if n is not None and float(n).is_integer():
                if abs(n) > _MAX_SAFE_INTEGER:
                    raise UsageError(
                        f"--{flag} {text.strip()} is an integer outside the supported range "
                        f"±{_MAX_SAFE_INTEGER} (2^53 - 1, the largest integer JSON tools agree on)",
                        code=INVALID_FLAG_VALUE,
                    )
                return int(n)
        if t == "null" and text == "null":
            return None
        if t == "object":
            value = _parse_json(flag, text)
            if isinstance(value, dict):
                return value
        if t == "array":
            try:
                value = _loads(text)
            except (ValueError, RecursionError):
                continue
            if isinstance(value, list):
                return value
    raise UsageError(
        f"--{flag} must be {' or '.join(types)}; received {preview(text)}",
        code=INVALID_FLAG_VALUE,
    )


def coerce_params(pairs: list[tuple[str, str | bool]], param_schemas: dict[str, dict]) -> dict[str, Any]:
    """Turn raw `(name, value)` flag pairs into a validated params object.

    Names must exactly match a declared param (no `-`/`_` aliasing): `--include-processes` does not
    set `include_processes`. Params named like a run-control flag (`timeout`, `format`, `max-steps`,
    `help`, `quiet`, `verbose`, `new`) can never arrive here because `split_run_args` consumes those flags;
    authors should avoid such names. Raises `UsageError` with code `UNKNOWN_FLAG` for an undeclared
    name and `INVALID_ARGUMENT` for a value that does not fit its schema.
    """
    grouped: dict[str, list[str | bool]] = {}
    for name, raw in pairs:
        if name not in param_schemas:
            declared = ", ".join(f"--{n}" for n in param_schemas) or "(this workflow declares no params)"
            from akm.codes import Code

            raise UsageError(
                f"Unknown flag --{name}: param flags must exactly match a declared param name",
                code=Code.UNKNOWN_FLAG,
                hint=f"declared params: {declared}",
            )
        grouped.setdefault(name, []).append(raw)

    params: dict[str, Any] = {}
    for name, raws in grouped.items():
        schema = param_schemas[name]
        types = _types_of(schema)
        if "array" in types:
            if len(raws) == 1 and isinstance(raws[0], str) and raws[0].strip(JS_WHITESPACE).startswith("["):
                value = _parse_json(name, raws[0])
                if not isinstance(value, list):
                    raise UsageError(f"--{name} must be a JSON array", code=INVALID_FLAG_VALUE)
                params[name] = value
            else:
                items = schema.get("items")
                item_schema = items if isinstance(items, dict) else {}
                params[name] = [_coerce_one(name, raw, item_schema) for raw in raws]
            continue
        if len(raws) > 1:
            raise UsageError(
                f"--{name} was provided more than once but is not declared as an array",
                code=INVALID_FLAG_VALUE,
            )
        params[name] = _coerce_one(name, raws[0], schema)

    return check_params(params, param_schemas, code=INVALID_FLAG_VALUE)


def apply_defaults(params: dict[str, Any], param_schemas: dict[str, dict]) -> dict[str, Any]:
    """A copy of `params` with each omitted param that declares a schema `default:` set to it.

    Applied before validation, so the run's params snapshot — what `status`
    shows, what units receive and what their input hashes cover — holds the
    value the run actually used. Only top-level param defaults count.
    """
    out = dict(params)
    for name, schema in param_schemas.items():
        if name not in out and isinstance(schema, dict) and "default" in schema:
            out[name] = copy.deepcopy(schema["default"])
    return out


def check_params(params: Any, param_schemas: dict[str, dict], *, code: str = "INVALID_PARAMS") -> dict[str, Any]:
    """Fill in declared defaults, then validate a typed params object (API/MCP callers) against the schemas.

    Undeclared names are refused (nothing could read them, and they would still
    change every unit's input hash); declared params may be omitted. Returns
    the params snapshot of the run: the given values plus applied defaults.
    """
    if not isinstance(params, dict):
        raise UsageError("params must be an object mapping param names to values", code=code)
    from akm.canonical import CanonicalError, normalize
    from akm.text import require_utf8_value

    require_utf8_value(params, "params")
    unknown = [name for name in params if name not in param_schemas]
    if unknown:
        declared = ", ".join(param_schemas) or "(this workflow declares no params)"
        raise UsageError(
            f"Unknown param(s) {', '.join(repr(n) for n in unknown)}: names must exactly match a declared param",
            code=UNKNOWN_FLAG if code == INVALID_FLAG_VALUE else code,
            hint=f"declared params: {declared}",
        )
    for name, value in params.items():
        # What the journal, the plan hash and every unit's input hash must hold: canonical JSON
        # (finite numbers, at most MAX_DEPTH levels). Refused here, naming the param, rather
        # than as an internal error when the run is hashed or stored.
        try:
            normalize({name: value})  # as the params object holds it (one level counts)
        except CanonicalError as exc:
            raise UsageError(f"params.{name} cannot be recorded as JSON: {exc}", code=code) from None
    params = apply_defaults(params, param_schemas)
    if not params:
        # An empty object always satisfies {"type": "object", "properties": …} (no param is `required`):
        # a run without params needs no validator — and so does not import jsonschema (a cold first
        # start of a zipapp pays a quarter of a second for it).
        return params
    errors = validate_instance(params, {"type": "object", "properties": dict(param_schemas)}, root_label="params")
    if errors:
        raise UsageError("Invalid param value: " + "; ".join(errors), code=code, details={"errors": errors})
    return params
