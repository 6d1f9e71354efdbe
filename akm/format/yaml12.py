"""YAML with YAML 1.2 core-schema meaning, plus line anchors (DECISIONS D3).

PyYAML implements YAML 1.1: `on`/`yes`/`no` become booleans, `2026-01-01` a date,
`017` octal, `1_000` an int, and `<<` merges mappings. Workflow authors write
`retry: { on: [timeout] }` and `updated: 2026-01-01` and expect strings, so we
replace the implicit resolvers with the 1.2 core schema and build values
ourselves from PyYAML's node tree. Building from nodes (instead of calling the
stock constructor) is what gives us:

* a line/column for every value and every mapping key (diagnostics need them),
* duplicate keys as errors (PyYAML silently keeps the last one),
* bounded alias expansion (a "billion laughs" frontmatter must not hang lint).

`Yaml12Loader` can also be used directly with `yaml.load` when no line anchors
are needed (e.g. coercing a JSON/YAML value given on the command line).
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from akm.record import dataclass, field

Path = tuple[Any, ...]

# Alias expansion budget: how many nodes aliases may add on top of the source.
MAX_ALIAS_EXPANSION = 10_000
# Deepest nesting we build. Real frontmatter is shallow; JSON schemas nest a bit.
MAX_DEPTH = 200

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


class Yaml12Resolver(yaml.resolver.Resolver):
    """Core-schema implicit typing only: null, bool, int, float; all else is a string."""

    yaml_implicit_resolvers: dict = {}


Yaml12Resolver.add_implicit_resolver(TAG_NULL, _NULL_RE, ["~", "n", "N", ""])
Yaml12Resolver.add_implicit_resolver(TAG_BOOL, _BOOL_RE, list("tTfF"))
Yaml12Resolver.add_implicit_resolver(TAG_INT, _INT_RE, list("-+0123456789"))
Yaml12Resolver.add_implicit_resolver(TAG_FLOAT, _FLOAT_RE, list("-+0123456789."))


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
        if _INT_DEC_RE.match(text):
            return int(text, 10)
        if _INT_OCT_RE.match(text):
            return int(text[2:], 8)
        if _INT_HEX_RE.match(text):
            return int(text[2:], 16)
        raise YamlValueError(f"cannot read {text!r} as !!int", node)
    if tag == TAG_FLOAT:
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
    raise YamlValueError(f"unsupported YAML tag {short_tag(tag)}", node)


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


# --- the stock-API loader ----------------------------------------------------------------


class Yaml12Loader(yaml.SafeLoader, Yaml12Resolver):
    """`yaml.load(text, Loader=Yaml12Loader)`: 1.2 core values, duplicate keys rejected.

    No line anchors; use `load_yaml` for those.
    """

    yaml_implicit_resolvers = Yaml12Resolver.yaml_implicit_resolvers
    yaml_constructors: dict = {}

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        if not isinstance(node, MappingNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"expected a mapping node, but found {node.id}", node.start_mark
            )
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            try:
                key = _key_text(self.construct_object(key_node, deep=True), key_node)
            except YamlValueError as exc:
                raise yaml.constructor.ConstructorError(None, None, exc.message, key_node.start_mark) from None
            if key in out:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            out[key] = self.construct_object(value_node, deep=deep)
        return out


def _construct_scalar(loader: Yaml12Loader, node: Node) -> Any:
    if not isinstance(node, ScalarNode):
        raise yaml.constructor.ConstructorError(
            None, None, f"expected a scalar node, but found {node.id}", node.start_mark
        )
    try:
        return scalar_value(node)
    except YamlValueError as exc:
        raise yaml.constructor.ConstructorError(None, None, exc.message, node.start_mark) from None


def _construct_seq(loader: Yaml12Loader, node: Node):
    data: list[Any] = []
    yield data
    data.extend(loader.construct_sequence(node))


def _construct_map(loader: Yaml12Loader, node: Node):
    data: dict[str, Any] = {}
    yield data
    data.update(loader.construct_mapping(node))


def _construct_unknown(loader: Yaml12Loader, node: Node) -> Any:
    raise yaml.constructor.ConstructorError(None, None, f"unsupported YAML tag {short_tag(node.tag)}", node.start_mark)


for _tag in (TAG_NULL, TAG_BOOL, TAG_INT, TAG_FLOAT, TAG_STR):
    Yaml12Loader.add_constructor(_tag, _construct_scalar)
Yaml12Loader.add_constructor(TAG_SEQ, _construct_seq)
Yaml12Loader.add_constructor(TAG_MAP, _construct_map)
Yaml12Loader.add_constructor(None, _construct_unknown)


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


@dataclass
class YamlDoc:
    """The loaded value plus where each part of it came from.

    `value_marks[path]` is the (line, column) where the value at `path` starts;
    `key_marks[path]` is where the mapping key that introduces `path` starts.
    `value_end_lines[path]` is the last line holding part of the value at `path`.
    Paths are tuples of str keys and int list indexes; `()` is the root.
    Lines and columns are 1-based within the YAML text.
    """

    value: Any = None
    value_marks: dict[Path, tuple[int, int]] = field(default_factory=dict)
    value_end_lines: dict[Path, int] = field(default_factory=dict)
    key_marks: dict[Path, tuple[int, int]] = field(default_factory=dict)
    problems: list[YamlProblem] = field(default_factory=list)

    def line_of(self, path: Path, *, key: bool = False) -> int | None:
        """Line of `path` (its key line when `key`), walking up to the nearest anchored parent."""
        mark = self.mark_of(path, key=key)
        return mark[0] if mark else None

    def mark_of(self, path: Path, *, key: bool = False) -> tuple[int, int] | None:
        p = tuple(path)
        if key and p in self.key_marks:
            return self.key_marks[p]
        while True:
            if p in self.value_marks:
                return self.value_marks[p]
            if p in self.key_marks:
                return self.key_marks[p]
            if not p:
                return None
            p = p[:-1]


def _mark(node: Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    """Turns a composed node tree into plain values, recording marks and bounding aliases."""

    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.seen: set[int] = set()  # ids of nodes already built once (second visit = alias)
        self.expanded = 0
        self.active: set[int] = set()  # nodes on the current build stack (cycle check)

    def build(self, node: Node, path: Path, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise YamlValueError(f"nesting is deeper than {MAX_DEPTH} levels", node)
        nid = id(node)
        if nid in self.active:
            raise _AliasProblem("an alias refers to a node that contains it (recursive alias)", node)
        if nid in self.seen:
            self.expanded += _count_nodes(node, MAX_ALIAS_EXPANSION + 1)
            if self.expanded > MAX_ALIAS_EXPANSION:
                raise _AliasProblem(f"aliases expand to more than {MAX_ALIAS_EXPANSION} nodes", node)
        self.seen.add(nid)
        if path not in self.doc.value_marks:
            self.doc.value_marks[path] = _mark(node)
            self.doc.value_end_lines[path] = _end_line(node)
        if isinstance(node, ScalarNode):
            return scalar_value(node)
        self.active.add(nid)
        try:
            if isinstance(node, SequenceNode):
                if node.tag != TAG_SEQ:
                    raise YamlValueError(f"unsupported YAML tag {short_tag(node.tag)}", node)
                return [self.build(child, path + (i,), depth + 1) for i, child in enumerate(node.value)]
            if isinstance(node, MappingNode):
                if node.tag != TAG_MAP:
                    raise YamlValueError(f"unsupported YAML tag {short_tag(node.tag)}", node)
                out: dict[str, Any] = {}
                for key_node, value_node in node.value:
                    if not isinstance(key_node, ScalarNode):
                        raise YamlValueError("mapping keys must be plain scalars, not lists or mappings", key_node)
                    key = _key_text(scalar_value(key_node), key_node)
                    if key in out:
                        raise _DuplicateKey(key, key_node, self.doc.key_marks.get(path + (key,)))
                    self.doc.key_marks[path + (key,)] = _mark(key_node)
                    out[key] = self.build(value_node, path + (key,), depth + 1)
                return out
        finally:
            self.active.discard(nid)
        raise YamlValueError("unknown YAML node", node)  # pragma: no cover


class _AliasProblem(YamlValueError):
    pass


class _DuplicateKey(YamlValueError):
    def __init__(self, key: str, node: Node, first: tuple[int, int] | None) -> None:
        super().__init__(f"duplicate key {key!r}", node)
        self.key = key
        self.first = first


def _end_line(node: Node) -> int:
    """1-based last line of a node's own text.

    Block collections report their end at the start of whatever follows them,
    so their last line is taken from their last child instead; scalars and flow
    collections (`{...}`, `[...]`) end exactly where their text ends.
    """
    start = node.start_mark.line + 1
    seen = 0
    while isinstance(node, (SequenceNode, MappingNode)) and not node.flow_style and node.value and seen < 10_000:
        last = node.value[-1]
        node = last[1] if isinstance(node, MappingNode) else last
        seen += 1
    end = node.end_mark
    return max(start, end.line if end.column == 0 else end.line + 1)


def _count_nodes(node: Node, limit: int) -> int:
    """Size of a subtree (shared nodes counted per use), stopping once `limit` is passed."""
    count = 0
    stack = [node]
    while stack and count <= limit:
        n = stack.pop()
        count += 1
        if isinstance(n, SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, MappingNode):
            for k, v in n.value:
                stack.append(k)
                stack.append(v)
    return count


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _syntax_problem(exc: yaml.YAMLError, text: str) -> YamlProblem:
    """PyYAML's exception -> one problem at the position of the actual fault."""
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, max(0, exc.position)) + 1
        return YamlProblem(
            "yaml_syntax",
            f"character U+{exc.character:04X} is not allowed in YAML"
            if isinstance(exc.character, int)
            else "the text is not valid for YAML",
            line,
        )
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [_first_line(p) for p in (exc.context, exc.problem) if p]
        message = "; ".join(parts) or "invalid YAML"
    else:
        message = _first_line(str(exc)) or "invalid YAML"
    message = re.sub(r"\s*at line \d+,? column \d+\s*$", "", message)
    if mark is not None:
        return YamlProblem("yaml_syntax", message, mark.line + 1, mark.column + 1)
    return YamlProblem("yaml_syntax", message, 1)


_SLOW_PATH: Any = object()

try:
    from yaml.cyaml import CParser as _CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _CParser = None

if _CParser is not None:

    class _CComposer(_CParser, Yaml12Resolver):  # type: ignore[misc, valid-type]
        """libyaml's parser with our 1.2 resolver: composes the same node tree ~5x faster."""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            Yaml12Resolver.__init__(self)

else:  # pragma: no cover - PyYAML built without libyaml
    _CComposer = None


def _compose_fast(text: str) -> Any:
    """The node tree from libyaml when it accepts the text, else `_SLOW_PATH`.

    Why two parsers: the pure-Python composer costs ~10 s on a 1 MiB frontmatter
    (lint must stay fast on big files), but its error messages and positions are
    the ones users and tests know. So libyaml composes valid documents, and
    anything it refuses (or text with characters the Python reader refuses,
    which libyaml would reject differently) goes through the pure-Python path,
    which reports exactly as before.
    """
    if _CComposer is None:
        return _SLOW_PATH
    if yaml.reader.Reader.NON_PRINTABLE.search(text):
        return _SLOW_PATH
    composer = None
    try:
        composer = _CComposer(text)
        return composer.get_single_node()
    except (yaml.YAMLError, RecursionError, UnicodeError, ValueError):
        return _SLOW_PATH
    finally:
        if composer is not None:
            composer.dispose()


def load_yaml(text: str) -> YamlDoc:
    """Load one YAML document with 1.2 core meaning. Never raises for bad input.

    On failure `problems` holds one entry (PyYAML stops at the first syntax error)
    and `value` is None.
    """
    doc = YamlDoc()
    node = _compose_fast(text)
    if node is _SLOW_PATH:
        loader = None
        try:
            loader = Yaml12Loader(text)
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            doc.problems.append(_syntax_problem(exc, text))
            return doc
        except RecursionError:
            doc.problems.append(YamlProblem("yaml_syntax", "YAML nesting is too deep to read", 1, None))
            return doc
        finally:
            if loader is not None:
                loader.dispose()
    if node is None:
        return doc
    try:
        doc.value = _Builder(doc).build(node, (), 0)
    except _DuplicateKey as exc:
        line, col = _mark(exc.node)
        first = exc.first[0] if exc.first else None
        where = f" (first defined on line {first})" if first else ""
        doc.problems.append(
            YamlProblem("duplicate_key", f'duplicate key "{exc.key}"{where}', line, col, first_line=first)
        )
        doc.value = None
    except _AliasProblem as exc:
        line, col = _mark(exc.node) if exc.node is not None else (1, None)
        doc.problems.append(YamlProblem("yaml_alias_expansion", f"alias expansion failed: {exc.message}", line, col))
        doc.value = None
    except YamlValueError as exc:
        line, col = _mark(exc.node) if exc.node is not None else (1, None)
        code = "yaml_unsupported_tag" if "unsupported YAML tag" in exc.message else "yaml_syntax"
        doc.problems.append(YamlProblem(code, exc.message, line, col))
        doc.value = None
    except RecursionError:
        doc.problems.append(YamlProblem("yaml_syntax", "YAML nesting is too deep to read", 1, None))
        doc.value = None
    return doc
