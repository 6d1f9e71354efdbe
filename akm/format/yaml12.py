"""YAML with YAML 1.2 core-schema meaning, plus line anchors (spec/decisions.md D3).

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

from typing import Any

from akm.format.yaml_core import (
    _IMPLICIT,
    IMPLICIT_RESOLVERS,
    TAG_BOOL,
    TAG_FLOAT,
    TAG_INT,
    TAG_MAP,
    TAG_NULL,
    TAG_SEQ,
    TAG_STR,
    YamlProblem,
    YamlValueError,
    _key_text,
    js_number,
    js_string,
    scalar_value,
    short_tag,
)
from akm.format.yaml_light import MappingNode, Node, ScalarNode, SequenceNode, Unprintable, YAMLError
from akm.format.yaml_light import compose as _compose_light
from akm.record import dataclass, field

__all__ = [
    "IMPLICIT_RESOLVERS",
    "MAX_ALIAS_EXPANSION",
    "MAX_DEPTH",
    "TAG_BOOL",
    "TAG_FLOAT",
    "TAG_INT",
    "TAG_MAP",
    "TAG_NULL",
    "TAG_SEQ",
    "TAG_STR",
    "YamlDoc",
    "YamlProblem",
    "YamlValueError",
    "js_number",
    "js_string",
    "load_yaml",
    "scalar_value",
    "short_tag",
]

Path = tuple[Any, ...]

# Alias expansion budget: how many nodes aliases may add on top of the source.
MAX_ALIAS_EXPANSION = 10_000
# Deepest nesting we build. Real frontmatter is shallow; JSON schemas nest a bit.
MAX_DEPTH = 200


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

    def mark_of(self, path: Path, *, key: bool = False) -> tuple[int, int] | None:
        """(line, column) of `path` (its key's when `key`), walking up to the nearest anchored parent."""
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


_SLOW_PATH: Any = object()
# From this size on libyaml (when PyYAML has it) composes valid text: importing it costs more than the pure-Python
# composer spends on a smaller text, and much less on a larger one (~10 s for a 1 MiB frontmatter).
LIBYAML_FROM_CHARS = 16 * 1024
_LIGHT = True  # tests turn the light composer off to compare it with the stock one


def _compose_fast(text: str) -> Any:
    """The node tree of valid text without PyYAML's error wording, else `_SLOW_PATH`.

    Why several parsers: the stock pure-Python loader's error messages and positions are the ones users and
    tests know, so it composes whatever the others refuse. Valid text is composed by libyaml when it is large
    (akm.format.yaml_stock), else by the same pure-Python scanner, parser and composer without the rest of
    PyYAML's import (akm.format.yaml_light); text that one refuses is offered to libyaml too, which accepts a
    little more (spec/workflow-format.md), before the stock loader words the error.
    """
    if _LIGHT and len(text) < LIBYAML_FROM_CHARS:
        try:
            return _compose_light(text, _IMPLICIT)
        except (YAMLError, Unprintable, RecursionError, UnicodeError, ValueError, IndexError):
            pass
    from akm.format import yaml_stock

    node = yaml_stock.compose_libyaml(text)
    return _SLOW_PATH if node is yaml_stock.NO_LIBYAML or node is yaml_stock.REFUSED else node


def load_yaml(text: str) -> YamlDoc:
    """Load one YAML document with 1.2 core meaning. Never raises for bad input.

    On failure `problems` holds one entry (PyYAML stops at the first syntax error)
    and `value` is None.
    """
    doc = YamlDoc()
    node = _compose_fast(text)
    if node is _SLOW_PATH:
        from akm.format import yaml_stock

        loader = None
        try:
            loader = yaml_stock.Yaml12Loader(text)
            node = loader.get_single_node()
        except YAMLError as exc:
            doc.problems.append(yaml_stock.syntax_problem(exc, text))
            return doc
        except RecursionError:
            doc.problems.append(YamlProblem("yaml_syntax", "YAML nesting is too deep to read", 1, None))
            return doc
        finally:
            if loader is not None:
                loader.dispose()
    if node is None:
        return doc
    col: int | None
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


def __getattr__(name: str) -> Any:
    """`Yaml12Loader` and `Yaml12Resolver` (the stock-API classes) load with the whole of PyYAML, on first use."""
    if name in ("Yaml12Loader", "Yaml12Resolver"):
        from akm.format import yaml_stock

        return getattr(yaml_stock, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
