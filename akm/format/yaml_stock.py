"""The stock PyYAML side of akm.format.yaml12: the whole of PyYAML, imported only when it is needed.

`Yaml12Loader` (`yaml.load(text, Loader=Yaml12Loader)`) and the pure-Python composer behind every YAML error
message, `Yaml12Resolver` (also `workflow upgrade`'s dumper's), and libyaml for large valid text. Importing this
module imports all of `yaml` (its regular expressions cost ~15 ms), so a valid workflow is read without it
(akm.format.yaml_light).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from akm.format.yaml_core import (
    _IMPLICIT,
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
    scalar_value,
    short_tag,
)
from akm.format.yaml_light import MappingNode, Node, ScalarNode


class Yaml12Resolver(yaml.resolver.Resolver):
    """Core-schema implicit typing only: null, bool, int, float; all else is a string."""

    yaml_implicit_resolvers: dict = {ch: list(pairs) for ch, pairs in _IMPLICIT.items()}


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


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def syntax_problem(exc: yaml.YAMLError, text: str) -> YamlProblem:
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


NO_LIBYAML: Any = object()  # PyYAML was built without libyaml
REFUSED: Any = object()  # libyaml refused the text (the stock composer words why)

try:
    from yaml.cyaml import CParser as _CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml (the zipapp: akm/format/yaml_light.py)
    _CParser = None

_CComposer: Any = None  # libyaml's parser with our 1.2 resolver, when PyYAML has libyaml
if _CParser is not None:

    class _LibyamlComposer(_CParser, Yaml12Resolver):  # type: ignore[misc, valid-type]
        """libyaml's parser with our 1.2 resolver: composes the same node tree ~5x faster."""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            Yaml12Resolver.__init__(self)

    _CComposer = _LibyamlComposer


def compose_libyaml(text: str) -> Any:
    """The node tree from libyaml when it accepts the text; `REFUSED` when it does not (or the stock reader
    would refuse a character), `NO_LIBYAML` without it."""
    if _CComposer is None:
        return NO_LIBYAML
    if yaml.reader.Reader.NON_PRINTABLE.search(text):
        return REFUSED
    composer = None
    try:
        composer = _CComposer(text)
        return composer.get_single_node()
    except (yaml.YAMLError, RecursionError, UnicodeError, ValueError):
        return REFUSED
    finally:
        if composer is not None:
            composer.dispose()
