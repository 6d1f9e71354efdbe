"""`akm.record.dataclass`: the run path's records, with dataclasses' meaning but no `dataclasses` import."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest

from akm.record import FrozenInstanceError, dataclass, field


@dataclass
class Base:
    a: int
    b: list[int] = field(default_factory=list)
    c: str = "x"
    LIMIT: ClassVar[int] = 3


@dataclass(frozen=True)
class Frozen:
    a: int
    b: str | None = None


@dataclass
class Child(Base):
    d: float = 1.5
    seen: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.seen.append("post")


@dataclass(kw_only=True)
class KwOnly:
    a: int
    b: int = 2


def test_construction_defaults_and_factories():
    one, two = Base(1), Base(2)
    assert (one.a, one.b, one.c) == (1, [], "x") and one.b is not two.b
    assert Base(1, [2], c="y") == Base(a=1, b=[2], c="y") != Base(1)
    assert Base.LIMIT == 3 and "LIMIT" not in repr(one)
    with pytest.raises(TypeError):
        Base()
    with pytest.raises(TypeError):
        Base(1, nope=2)


def test_repr_eq_hash_like_dataclasses():
    assert repr(Base(1)) == "Base(a=1, b=[], c='x')"
    assert Base.__hash__ is None  # mutable and compared by value: unhashable, as a dataclass
    assert hash(Frozen(1)) == hash(Frozen(1)) and {Frozen(1), Frozen(1)} == {Frozen(1)}
    assert Frozen(1) != Frozen(2) and Frozen(1) != (1, None)


def test_frozen_refuses_assignment():
    f = Frozen(1, "b")
    with pytest.raises(FrozenInstanceError):
        f.a = 2
    with pytest.raises(AttributeError):
        del f.b


def test_inheritance_post_init_and_repr_false():
    c = Child(1, d=2.0)
    assert (c.a, c.b, c.c, c.d, c.seen) == (1, [], "x", 2.0, ["post"])
    assert repr(c) == "Child(a=1, b=[], c='x', d=2.0)"
    assert Base(1) != Child(1)


def test_kw_only():
    assert KwOnly(a=1).b == 2
    with pytest.raises(TypeError):
        KwOnly(1)


def test_other_options_are_the_real_dataclasses():
    import dataclasses

    @dataclass(order=True)
    class Ordered:
        a: int

    assert dataclasses.is_dataclass(Ordered) and Ordered(1) < Ordered(2)


def test_importing_records_imports_no_dataclasses():
    code = (
        "import sys; from akm.record import dataclass, field\n"
        "@dataclass(frozen=True)\nclass A:\n    x: int = field(default_factory=int)\n"
        "assert A().x == 0 and 'dataclasses' not in sys.modules and 'inspect' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
