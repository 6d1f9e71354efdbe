"""PyYAML's scanner, parser and composer without the rest of PyYAML: a workflow's node tree at the cost of a read.

Why: `import yaml` runs `yaml/__init__.py`, which imports every part of PyYAML — the reader, the
constructors, the resolvers, the emitter, the C bindings — and those compile ~15 ms of regular expressions
at import (the reader's check for non-printable characters alone is ~6 ms), on every `workflow run` and lint.
Composing a valid frontmatter needs none of it: the scanner, parser and composer modules compile nothing
heavy, and the rest is a reader of a `str` (below, as PyYAML's reads one) and the YAML 1.2 core-schema
resolver (akm.format.yaml12's table).

How: when nothing has imported `yaml` yet, `yaml` is entered in `sys.modules` as the real package module,
its `__init__.py` not yet run (`_defer_package`); its submodules then import as usual, and the first lookup of
a name the package has not got yet (`yaml.safe_load`, `from yaml import SafeLoader`) runs `__init__.py` in
that same module, once, under a lock. So other code (the stock loader for error messages, the dumper of
`workflow upgrade`, a library) sees the whole package as before.

Only valid text is composed here: anything it refuses (a syntax error, a character PyYAML's reader refuses)
is composed again by the stock loader, whose messages and positions users know (akm.format.yaml12).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
from typing import Any

from akm.format.yaml_core import TAG_MAP, TAG_SEQ, TAG_STR


def _defer_package() -> None:
    """Make `yaml` importable without running its `__init__.py` until a name of it is needed."""
    if "yaml" in sys.modules:
        return
    spec = importlib.util.find_spec("yaml")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # let `import yaml` fail or work as it would
    module = importlib.util.module_from_spec(spec)
    lock = threading.RLock()
    state = {"running": False}

    def complete(name: str) -> Any:
        with lock:  # another thread waits here until the package is whole
            if "__getattr__" in module.__dict__:
                if state["running"]:
                    raise AttributeError(name)  # the package's own __init__, looking a name up as it runs
                state["running"] = True
                try:
                    spec.loader.exec_module(module)  # type: ignore[union-attr]
                finally:
                    state["running"] = False
                    module.__dict__.pop("__getattr__", None)
        try:
            return module.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'yaml' has no attribute {name!r}") from None

    setattr(module, "__getattr__", complete)  # noqa: B010  (PEP 562: the module's own lookup of missing names)
    sys.modules["yaml"] = module


_defer_package()

from yaml.composer import Composer  # noqa: E402  (after the package is deferred)
from yaml.error import Mark, YAMLError  # noqa: E402
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode  # noqa: E402
from yaml.parser import Parser  # noqa: E402
from yaml.scanner import Scanner  # noqa: E402

__all__ = ["MappingNode", "Node", "ScalarNode", "SequenceNode", "Unprintable", "YAMLError", "compose"]

# What PyYAML's reader refuses (the complement of the characters YAML allows), as a class that compiles in a
# fraction of a millisecond; ASCII text, nearly every frontmatter, is checked against its ASCII part only.
_ASCII_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_UNPRINTABLE = "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]"  # compiled when needed

ImplicitTable = dict[str, list[tuple[str, "re.Pattern[str]"]]]


class Unprintable(ValueError):
    """The text holds a character YAML does not allow (the stock reader words that error)."""


def unprintable(text: str) -> bool:
    """Whether PyYAML's reader would refuse a character of `text`."""
    if text.isascii():
        return _ASCII_UNPRINTABLE.search(text) is not None
    return re.search(_UNPRINTABLE, text) is not None  # `re` caches the compiled class


class _Reader:
    """A `str` read as PyYAML's reader reads one: the same characters, positions and marks."""

    def __init__(self, text: str) -> None:
        if unprintable(text):
            raise Unprintable("the text holds a character YAML does not allow")
        self.name = "<unicode string>"
        self.encoding = None  # the scanner reads it (a str has none)
        self.buffer = text + "\0"
        self.pointer = self.index = self.line = self.column = 0

    def peek(self, index: int = 0) -> str:
        return self.buffer[self.pointer + index]

    def prefix(self, length: int = 1) -> str:
        return self.buffer[self.pointer : self.pointer + length]

    def forward(self, length: int = 1) -> None:
        buffer = self.buffer
        for _ in range(length):
            ch = buffer[self.pointer]
            self.pointer += 1
            self.index += 1
            if ch in "\n\x85\u2028\u2029" or (ch == "\r" and buffer[self.pointer] != "\n"):
                self.line += 1
                self.column = 0
            elif ch != "\ufeff":
                self.column += 1

    def get_mark(self) -> Mark:
        return Mark(self.name, self.index, self.line, self.column, self.buffer, self.pointer)


class _Composer(_Reader, Scanner, Parser, Composer):
    """Reader, scanner, parser and composer, with the core-schema resolver (no path resolvers)."""

    def __init__(self, text: str, implicit: ImplicitTable) -> None:
        _Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        self._implicit = implicit

    def resolve(self, kind: type, value: Any, implicit: Any) -> str:
        if kind is ScalarNode:
            if implicit[0]:
                for tag, regexp in self._implicit.get(value[:1], ()):
                    if regexp.match(value):
                        return tag
            return TAG_STR
        return TAG_SEQ if kind is SequenceNode else TAG_MAP

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        pass

    def ascend_resolver(self) -> None:
        pass


def compose(text: str, implicit: ImplicitTable) -> Node | None:
    """The node tree of one YAML document (None for an empty one); raises on anything invalid."""
    composer = _Composer(text, implicit)
    try:
        return composer.get_single_node()
    finally:
        composer.dispose()
