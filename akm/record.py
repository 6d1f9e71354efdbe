"""`@dataclass` for akm's internal records, without the cost of `dataclasses` at start-up.

Why: `import dataclasses` pulls in `inspect` (and with it `ast`, `dis`, `tokenize`), about 10 ms,
and every decorated class then compiles five or six generated methods, about 0.45 ms each class.
A short `workflow run` defines some 45 of them: a fifth of its whole wall time, before any work.
Here a class costs a few microseconds; its `__init__` is generated (so construction is as fast as
a dataclass's) on the first instantiation, and classes a command never builds never pay for it.

Supported, with dataclasses' meaning: `@dataclass`, `@dataclass(frozen=True)`,
`@dataclass(kw_only=True)`, `field(default=..., default_factory=..., repr=...)`, inheritance from
another record, `__post_init__`, generated `__eq__`/`__repr__`/`__hash__` unless the class
defines its own. Anything else (`slots=`, `order=`, `init=False`, ...) is handed to the real
`dataclasses.dataclass`, so a new use never silently means something else.
"""

from __future__ import annotations

from typing import Any, Callable, dataclass_transform

__all__ = ["dataclass", "field", "FrozenInstanceError"]


class FrozenInstanceError(AttributeError):
    """Assigning to a field of a frozen record (as `dataclasses.FrozenInstanceError`)."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_FACTORY: Any = _Missing()  # an argument left out whose default comes from a factory


class _Field:
    __slots__ = ("name", "default", "default_factory", "repr", "kw_only")

    def __init__(self, default: Any, default_factory: Any, repr: bool) -> None:  # noqa: A002 - dataclasses' name
        self.name = ""
        self.default, self.default_factory, self.repr, self.kw_only = default, default_factory, repr, False


def field(*, default: Any = MISSING, default_factory: Any = MISSING, repr: bool = True, **other: Any) -> Any:  # noqa: A002
    if other:  # init=, compare=, metadata=, ...: the real thing knows what they mean
        import dataclasses

        return dataclasses.field(default=default, default_factory=default_factory, repr=repr, **other)
    return _Field(default, default_factory, repr)


def _is_classvar(hint: Any) -> bool:
    text = hint if isinstance(hint, str) else repr(hint)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _build(cls: type, frozen: bool, kw_only: bool) -> type:
    fields: dict[str, _Field] = {}
    for base in reversed(cls.__mro__[1:]):
        fields.update(getattr(base, "__record_fields__", {}))
    for name, hint in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(hint):
            continue
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, _Field):
            f = value
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = _Field(value, MISSING, True)
        f.name = name
        f.kw_only = kw_only
        fields.pop(name, None)
        fields[name] = f
    cls.__record_fields__ = fields  # type: ignore[attr-defined]
    names = tuple(fields)

    def lazy_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init = _make_init(cls, fields, frozen)
        cls.__init__ = init  # type: ignore[misc]
        init(self, *args, **kwargs)

    cls.__init__ = lazy_init  # type: ignore[misc]
    own = cls.__dict__
    if "__repr__" not in own:
        shown = tuple(n for n, f in fields.items() if f.repr)

        def __repr__(self: Any) -> str:
            return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"

        cls.__repr__ = __repr__  # type: ignore[method-assign,assignment]  # built at runtime, as dataclasses does
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    if "__eq__" not in own:

        def __eq__(self: Any, other: Any) -> Any:
            if other.__class__ is not self.__class__:
                return NotImplemented
            return all(getattr(self, n) == getattr(other, n) for n in names)

        cls.__eq__ = __eq__  # type: ignore[method-assign,assignment]  # built at runtime, as dataclasses does
    if not explicit_hash:
        if frozen:

            def __hash__(self: Any) -> int:
                return hash(tuple(getattr(self, n) for n in names))

            cls.__hash__ = __hash__  # type: ignore[method-assign,assignment]  # built at runtime, as dataclasses does
        else:
            cls.__hash__ = None  # type: ignore[assignment]  # mutable and compared by value: unhashable
    if frozen:

        def __setattr__(self: Any, name: str, value: Any) -> None:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")

        def __delattr__(self: Any, name: str) -> None:
            raise FrozenInstanceError(f"cannot delete field {name!r}")

        cls.__setattr__ = __setattr__  # type: ignore[method-assign,assignment]  # built at runtime, as dataclasses does
        cls.__delattr__ = __delattr__  # type: ignore[method-assign,assignment]  # built at runtime, as dataclasses does
    return cls


def _make_init(cls: type, fields: dict[str, _Field], frozen: bool) -> Callable[..., None]:
    """The class's `__init__`, as dataclasses would write it (compiled once, on first use)."""
    env: dict[str, Any] = {"_FACTORY": _FACTORY, "_set": object.__setattr__}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for name, f in fields.items():
        if f.default_factory is not MISSING:
            env[f"_f_{name}"] = f.default_factory
            param = f"{name}=_FACTORY"
            value = f"_f_{name}() if {name} is _FACTORY else {name}"
        elif f.default is not MISSING:
            env[f"_d_{name}"] = f.default
            param, value = f"{name}=_d_{name}", name
        else:
            param, value = name, name
        (keyword if f.kw_only else positional).append(param)
        body.append(f"_set(self, {name!r}, {value})" if frozen else f"self.{name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    params = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({params}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
    exec(source, env)  # noqa: S102 - our own field names, as dataclasses does
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


@dataclass_transform(field_specifiers=(field,))
def dataclass(cls: type | None = None, /, *, frozen: bool = False, kw_only: bool = False, **other: Any) -> Any:
    if other:
        import dataclasses

        return (
            dataclasses.dataclass(cls, frozen=frozen, kw_only=kw_only, **other)
            if cls is not None
            else dataclasses.dataclass(frozen=frozen, kw_only=kw_only, **other)
        )
    if cls is None:
        return lambda klass: _build(klass, frozen, kw_only)
    return _build(cls, frozen, kw_only)
