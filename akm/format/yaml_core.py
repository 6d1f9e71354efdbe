"""YAML 1.2 core-schema meaning for PyYAML's nodes: tags, implicit typing, scalar values, JS-style key text.

Shared by the light composer's reader of valid text (akm.format.yaml12, akm.format.yaml_light) and the stock
PyYAML loader (akm.format.yaml_stock); it imports nothing of PyYAML itself.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from akm.record import dataclass

if TYPE_CHECKING:
    from yaml.nodes import Node, ScalarNode

TAG_NULL = "tag:yaml.org,2002:null"
TAG_BOOL = "tag:yaml.org,2002:bool"
TAG_INT = "tag:yaml.org,2002:int"
TAG_FLOAT = "tag:yaml.org,2002:float"
TAG_STR = "tag:yaml.org,2002:str"
TAG_SEQ = "tag:yaml.org,2002:seq"
TAG_MAP = "tag:yaml.org,2002:map"

_NULL_RE = re.compile(r"(?:~|null|Null|NULL|)\Z")
_BOOL_RE = re.compile(r"(?:true|True|TRUE|false|False|FALSE)\Z")
_INT_DEC_RE = re.compile(r"[-+]?[0-9]+\Z")
_INT_OCT_RE = re.compile(r"0o[0-7]+\Z")
_INT_HEX_RE = re.compile(r"0x[0-9a-fA-F]+\Z")
_INT_RE = re.compile(r"(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)\Z")
_FLOAT_RE = re.compile(
    r"(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)


# The core schema's implicit typing (null, bool, int, float; all else is a string), by a scalar's first character,
# in the order PyYAML's `add_implicit_resolver` keeps: the light composer's table, and `Yaml12Resolver`'s.
IMPLICIT_RESOLVERS: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = (
    (TAG_NULL, _NULL_RE, ("~", "n", "N", "")),
    (TAG_BOOL, _BOOL_RE, tuple("tTfF")),
    (TAG_INT, _INT_RE, tuple("-+0123456789")),
    (TAG_FLOAT, _FLOAT_RE, tuple("-+0123456789.")),
)
_IMPLICIT: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
for _tag, _regexp, _first in IMPLICIT_RESOLVERS:
    for _ch in _first:
        _IMPLICIT.setdefault(_ch, []).append((_tag, _regexp))


class YamlValueError(ValueError):
    """A node whose content does not fit its tag, an unsupported tag, a bad key."""

    def __init__(self, message: str, node: Node | None) -> None:
        super().__init__(message)
        self.message = message
        self.node = node


def short_tag(tag: str) -> str:
    """`tag:yaml.org,2002:timestamp` -> `!!timestamp` (how authors write it)."""
    prefix = "tag:yaml.org,2002:"
    return "!!" + tag[len(prefix) :] if tag.startswith(prefix) else tag


def scalar_value(node: ScalarNode) -> Any:
    """Convert one resolved scalar node to a Python value with 1.2 core meaning."""
    tag, text = node.tag, node.value
    if tag == TAG_STR:
        return text
    if tag == TAG_NULL:
        if _NULL_RE.match(text):
            return None
        raise YamlValueError(f"cannot read {text!r} as !!null", node)
    if tag == TAG_BOOL:
        if _BOOL_RE.match(text):
            return text.lower() == "true"
        raise YamlValueError(f"cannot read {text!r} as !!bool (YAML 1.2 knows only true/false)", node)
    if tag == TAG_INT:
        return _int_value(node)
    if tag == TAG_FLOAT:
        return _float_value(node)
    raise YamlValueError(f"unsupported YAML tag {short_tag(tag)}", node)


def _int_value(node: ScalarNode) -> int:
    """An `!!int` scalar: decimal, `0o` octal or `0x` hexadecimal."""
    text = node.value
    if _INT_DEC_RE.match(text):
        return int(text, 10)
    if _INT_OCT_RE.match(text):
        return int(text[2:], 8)
    if _INT_HEX_RE.match(text):
        return int(text[2:], 16)
    raise YamlValueError(f"cannot read {text!r} as !!int", node)


def _float_value(node: ScalarNode) -> float:
    """A `!!float` scalar: the infinities, NaN, a decimal float, or an integer read as a float."""
    text = node.value
    lowered = text.lower()
    if lowered in (".inf", "+.inf"):
        return math.inf
    if lowered == "-.inf":
        return -math.inf
    if lowered == ".nan":
        return math.nan
    if _FLOAT_RE.match(text) or _INT_RE.match(text):
        return float(int(text, 0)) if text.startswith(("0o", "0x")) else float(text)
    raise YamlValueError(f"cannot read {text!r} as !!float", node)


def js_string(value: Any) -> str:
    """`String(v)` as JavaScript writes it: how YAML keys and route matches become text.

    Booleans are `true`/`false`, null is `null`, integral floats print without a
    fraction (`1.0` -> `1`) and other numbers use the ECMAScript Number::toString
    rules (`1e21` -> `1e+21`, `0.000001` stays decimal).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return js_number(value)
    return str(value)


def js_number(v: float) -> str:
    """ECMAScript Number::toString for a float (shortest round-trip digits)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    if v == 0:
        return "0"
    sign = "-" if v < 0 else ""
    from decimal import Decimal  # only a float that becomes text needs it (~1 ms of every start otherwise)

    _, digit_tuple, exponent = Decimal(repr(abs(v))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    stripped = len("".join(map(str, digit_tuple))) - len(digits)
    k = len(digits)
    n = int(exponent) + stripped + k  # value = 0.digits * 10**n
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mant = digits if k == 1 else digits[0] + "." + digits[1:]
        out = f"{mant}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + out


def _key_text(key: Any, node: Node) -> str:
    """Mapping keys are strings in a workflow (as in the JS original): scalars are stringified."""
    if isinstance(key, str):
        return key
    if key is None:
        return ""
    if isinstance(key, (bool, int, float)):
        return js_string(key)
    raise YamlValueError("mapping keys must be plain scalars, not lists or mappings", node)


# --- anchored loading ---------------------------------------------------------------------


@dataclass
class YamlProblem:
    """One YAML-level failure. `line`/`column` are 1-based within the YAML text."""

    code: str  # yaml_syntax | duplicate_key | yaml_alias_expansion | yaml_unsupported_tag
    message: str
    line: int
    column: int | None = None
    first_line: int | None = None  # duplicate_key: where the key was first written
