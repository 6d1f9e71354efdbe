"""The frozen plan: everything a run needs, nothing it must re-read.

A plan is compiled from a workflow document once, at run start, and stored with
the run as canonical JSON plus its SHA-256 (`plan_hash`). The engine executes
only the stored plan, so editing the workflow file or config never changes a
run in flight. The JSON shape (camelCase keys, `irVersion: 3`) is documented in
spec/workflow-format.md; decoding is strict (unknown keys are refused) so a
tampered plan is caught instead of half-understood.

Absent vs null matters in a few places (`timeoutMs: null` means "unbounded",
while a missing optional key means "not declared"). Records therefore drop None
values when dumped, except for the fields listed in `_keep_none` that were
explicitly set.

The records are plain classes (`PlanRecord`), not pydantic models: every
`workflow run` builds or decodes a plan, and importing pydantic would cost it
more than the whole rest of its start. Each field states its check; the same
checks run on keyword construction (the compiler) and on decoding (a stored
plan), so a record only exists with valid contents.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Literal

from akm.canonical import canonical_json, sha256_hex
from akm.format.grammar import MAX_TIMEOUT_MS

IR_VERSION = 3
UNIT_HASH_VERSION = 5  # a new run's unit input hash preimage (akm/plan/identity.py); older runs keep theirs

OnError = Literal["fail", "continue"]
Isolation = Literal["none", "worktree"]
Reducer = Literal["collect", "vote"]

Check = Callable[[Any, str], Any]


class PlanError(ValueError):
    """A plan record refused its contents (what was wrong, and where: `Plan.steps.0.root.kind`)."""


_REQUIRED: Any = object()


class _Field:
    """One declared field: its check, its default (a value, `_REQUIRED`, or a factory) and its JSON key."""

    __slots__ = ("check", "default", "factory", "alias")

    def __init__(self, check: Check, default: Any, factory: Callable[[], Any] | None, alias: str | None) -> None:
        self.check, self.default, self.factory, self.alias = check, default, factory, alias


def field(
    check: Check, default: Any = _REQUIRED, *, factory: Callable[[], Any] | None = None, alias: str | None = None
) -> Any:
    return _Field(check, default, factory, alias)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# ---------------------------------------------------------------- checks (value, where) -> value


def _fail(where: str, what: str, value: Any) -> PlanError:
    shown = repr(value)
    return PlanError(f"{where}: {what} (got {shown[:60] + '...' if len(shown) > 60 else shown})")


def STR(value: Any, where: str) -> Any:
    if type(value) is not str:
        raise _fail(where, "must be a string", value)
    return value


def INT(ge: int | None = None, le: int | None = None) -> Check:
    def check(value: Any, where: str) -> Any:
        if type(value) is not int:
            raise _fail(where, "must be an integer", value)
        if (ge is not None and value < ge) or (le is not None and value > le):
            raise _fail(
                where, f"must be in {ge if ge is not None else '-inf'}..{le if le is not None else 'inf'}", value
            )
        return value

    return check


def NUM(ge: float = 0.0) -> Check:
    """A finite JSON number at least `ge` (an integral one stays an int: canonical JSON writes `2.0` as `2`)."""

    def check(value: Any, where: str) -> Any:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or value != value
            or value
            in (
                float("inf"),
                float("-inf"),
            )
        ):
            raise _fail(where, "must be a finite number", value)
        if value < ge:
            raise _fail(where, f"must be at least {ge:g}", value)
        return value

    return check


def LIT(*allowed: Any) -> Check:
    def check(value: Any, where: str) -> Any:
        if not any(value == a and type(value) is type(a) for a in allowed):
            raise _fail(where, "must be one of " + ", ".join(repr(a) for a in allowed), value)
        return value

    return check


def OPT(inner: Check) -> Check:
    def check(value: Any, where: str) -> Any:
        return None if value is None else inner(value, where)

    return check


def LIST(item: Check, min_len: int = 0, max_len: int | None = None) -> Check:
    def check(value: Any, where: str) -> Any:
        if not isinstance(value, (list, tuple)):
            raise _fail(where, "must be a list", value)
        if len(value) < min_len or (max_len is not None and len(value) > max_len):
            raise _fail(where, f"must have {min_len}..{max_len if max_len is not None else 'any'} items", value)
        return [item(v, f"{where}.{i}") for i, v in enumerate(value)]

    return check


def DICT(value_check: Check | None = None) -> Check:
    """A JSON object with string keys; `value_check` for its values (None: any JSON value)."""

    def check(value: Any, where: str) -> Any:
        if not isinstance(value, dict) or any(type(k) is not str for k in value):
            raise _fail(where, "must be an object with string keys", value)
        if value_check is None:
            return value
        return {k: value_check(v, f"{where}.{k}") for k, v in value.items()}

    return check


def REC(cls: type[PlanRecord] | Callable[[], type[PlanRecord]]) -> Check:
    """A nested record: an instance, or its JSON object (decoded). `cls` may be a thunk (forward reference)."""

    def check(value: Any, where: str) -> Any:
        klass: type[PlanRecord] = cls if isinstance(cls, type) else cls()
        if isinstance(value, klass):
            return value
        if isinstance(value, dict):
            return klass._build(value.items(), where)
        raise _fail(where, f"must be a {klass.__name__} object", value)

    return check


def _is_true(value: Any, where: str) -> Any:
    if value is not True:
        raise _fail(where, "must be true", value)
    return value


# ---------------------------------------------------------------- the record base


class PlanRecord:
    """Base: keyword construction by field name or camelCase key, strict keys, immutable, None dropped on dump."""

    _keep_none: ClassVar[frozenset[str]] = frozenset()
    _spec: ClassVar[dict[str, _Field]] = {}
    _by_key: ClassVar[dict[str, str]] = {}  # JSON key or field name -> field name

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = dict(cls._spec)
        for name, value in list(vars(cls).items()):
            if isinstance(value, _Field):
                if value.alias is None:
                    value.alias = _camel(name)
                spec[name] = value
                delattr(cls, name)  # the instance holds the value
        cls._spec = spec
        cls._by_key = {**{f.alias: n for n, f in spec.items()}, **{n: n for n in spec}}  # type: ignore[misc]

    @classmethod
    def _build(cls, items: Any, where: str) -> Any:
        self = object.__new__(cls)
        values: dict[str, Any] = {}
        by_key, spec = cls._by_key, cls._spec
        for key, value in items:
            name = by_key.get(key) if type(key) is str else None
            if name is None:
                raise PlanError(f"{where}: unknown key {key!r}")
            if name in values:
                raise PlanError(f"{where}: {key!r} given twice")
            values[name] = spec[name].check(value, f"{where}.{spec[name].alias}")
        fields_set = frozenset(values)
        for name, f in spec.items():
            if name not in values:
                if f.factory is not None:
                    values[name] = f.factory()
                elif f.default is _REQUIRED:
                    raise PlanError(f"{where}.{f.alias}: is required")
                else:
                    values[name] = f.default
        d = self.__dict__
        d.update(values)
        d["_fields_set"] = fields_set
        return self

    def __init__(self, **values: Any) -> None:
        built = self._build(values.items(), type(self).__name__)
        self.__dict__.update(built.__dict__)

    @classmethod
    def model_validate(cls, data: Any) -> Any:
        """Decode a JSON object (camelCase keys), refusing unknown keys and bad values with `PlanError`."""
        if not isinstance(data, dict):
            raise _fail(cls.__name__, "must be an object", data)
        return cls._build(data.items(), cls.__name__)

    @property
    def model_fields_set(self) -> frozenset[str]:
        """The fields given explicitly (at construction or in the decoded JSON), defaults not included."""
        return self.__dict__["_fields_set"]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Any:
        """A copy with some fields replaced (the values are taken as given, like pydantic's `model_copy`)."""
        other = object.__new__(type(self))
        d = other.__dict__
        d.update(self.__dict__)
        if update:
            d.update(update)
            d["_fields_set"] = self.model_fields_set | frozenset(update)
        return other

    def model_dump(self, *, mode: str = "json", by_alias: bool = True) -> dict[str, Any]:
        """The JSON object (camelCase keys; `mode`/`by_alias` are accepted for the callers' old spelling)."""
        return self._dump()

    def _dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        d = self.__dict__
        keep = self._keep_none
        for name, f in self._spec.items():
            value = d[name]
            if value is None:
                if name in keep and name in d["_fields_set"]:
                    out[f.alias] = None  # type: ignore[index]
            elif isinstance(value, PlanRecord):
                out[f.alias] = value._dump()  # type: ignore[index]
            elif type(value) is list and value and isinstance(value[0], PlanRecord):
                out[f.alias] = [v._dump() for v in value]  # type: ignore[index]
            else:
                out[f.alias] = value  # type: ignore[index]
        return out

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._dump() == other._dump()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(canonical_json(self._dump()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={self.__dict__[name]!r}" for name in self._spec)
        return f"{type(self).__name__}({inner})"


# ---------------------------------------------------------------- the plan

_TIMEOUT = OPT(INT(1, MAX_TIMEOUT_MS))
_OPT_STR = OPT(STR)
_OPT_STRS = OPT(LIST(STR))
_OPT_OBJ = OPT(DICT())


class Source(PlanRecord):
    path: str = field(STR)
    start: int = field(INT())
    end: int = field(INT())


class Retry(PlanRecord):
    max: int = field(INT(0, 100))
    on: list[str] = field(LIST(STR, 1))


class ExecSpec(PlanRecord):
    """An argv command run without a shell (spec/workflow-format.md, exec units)."""

    _keep_none = frozenset({"timeout_ms"})
    command: list[str] = field(LIST(STR, 1, 64))
    cwd: str | None = field(_OPT_STR, None)
    pass_env: list[str] | None = field(_OPT_STRS, None)
    inherit_env: Literal[True] | None = field(OPT(_is_true), None)
    timeout_ms: int | None = field(_TIMEOUT, None)


class Invocation(PlanRecord):
    """How a non-exec unit is dispatched. `engine: null` = a session unit (D11).

    `timeoutMs` absent = not declared (the engine's default applies); `null` =
    declared `none` (unbounded).
    """

    _keep_none = frozenset({"engine", "model", "timeout_ms"})
    engine: str | None = field(_OPT_STR, None)
    model: str | None = field(_OPT_STR, None)
    timeout_ms: int | None = field(_TIMEOUT, None)
    llm: dict[str, Any] | None = field(_OPT_OBJ, None)


class UnitNode(PlanRecord):
    kind: Literal["unit"] = field(LIT("unit"), "unit")
    id: str = field(STR)
    instructions: str = field(STR)
    templating: Literal["verbatim"] = field(LIT("verbatim"), "verbatim")
    inputs: list[str] | None = field(_OPT_STRS, None)
    invocation: Invocation | None = field(OPT(REC(Invocation)), None)
    exec: ExecSpec | None = field(OPT(REC(ExecSpec)), None)
    output_schema: dict[str, Any] | None = field(_OPT_OBJ, None, alias="schema")
    retry: Retry | None = field(OPT(REC(Retry)), None)
    on_error: OnError = field(LIT("fail", "continue"), "fail")
    env: list[str] | None = field(_OPT_STRS, None)
    isolation: Isolation = field(LIT("none", "worktree"), "none")
    source: Source | None = field(OPT(REC(Source)), None)
    # why the unit runs where it does (akm.plan.engines.ROUTES); absent for exec units, without any engine
    # configured, and in plans frozen before it was recorded. Not part of the unit's identity.
    route: str | None = field(_OPT_STR, None)

    @property
    def is_exec(self) -> bool:
        return self.exec is not None


class MapNode(PlanRecord):
    kind: Literal["map"] = field(LIT("map"), "map")
    id: str = field(STR)
    over: str = field(STR)
    template: UnitNode = field(REC(UnitNode))
    concurrency: int = field(INT(1, 64))
    reducer: Reducer = field(LIT("collect", "vote"), "collect")
    source: Source | None = field(OPT(REC(Source)), None)


class RoutePlan(PlanRecord):
    input: str = field(STR)
    when: dict[str, str] = field(DICT(STR))
    default_step_id: str | None = field(_OPT_STR, None)


class GatePlan(PlanRecord):
    _keep_none = frozenset({"judge"})
    kind: Literal["gate"] = field(LIT("gate"), "gate")
    id: str = field(STR)
    step_id: str = field(STR)
    criteria: list[str] = field(LIST(STR), factory=list)
    max_loops: int = field(INT(1, 100), 1)
    judge: Invocation | None = field(OPT(REC(Invocation)), None)


def _root(value: Any, where: str) -> Any:
    """The step's root: a unit or a map, told apart by `kind`."""
    if isinstance(value, (UnitNode, MapNode)):
        return value
    if not isinstance(value, dict):
        raise _fail(where, "must be a unit or map object", value)
    kind = value.get("kind")
    if kind == "unit":
        return UnitNode._build(value.items(), where)
    if kind == "map":
        return MapNode._build(value.items(), where)
    raise _fail(f"{where}.kind", "must be 'unit' or 'map'", kind)


class StepPlan(PlanRecord):
    step_id: str = field(STR)
    title: str = field(STR)
    sequence_index: int = field(INT())
    root: UnitNode | MapNode | None = field(OPT(_root), None)
    route: RoutePlan | None = field(OPT(REC(RoutePlan)), None)
    output_schema: dict[str, Any] | None = field(_OPT_OBJ, None)
    gate: GatePlan = field(REC(GatePlan))

    @property
    def unit_template(self) -> UnitNode | None:
        """The unit every work item of this step runs (solo root or map template)."""
        if isinstance(self.root, MapNode):
            return self.root.template
        return self.root


class Budget(PlanRecord):
    max_tokens: int | None = field(OPT(INT(1)), None)
    max_units: int | None = field(OPT(INT(1, 10_000)), None)
    max_cost: float | None = field(OPT(NUM()), None)  # USD, priced with `Execution.prices`
    unknown: str | None = field(OPT(LIT("refuse", "allow")), None)  # None: refuse


class Execution(PlanRecord):
    """Run-wide dispatch settings. `maxConcurrency` absent = use the host limit (D6)."""

    max_concurrency: int | None = field(OPT(INT(1, 64)), None)
    engines: dict[str, dict[str, Any]] = field(DICT(DICT()), factory=dict)
    # USD per million tokens by engine name ({input, output, cached?}), from config `engines.<name>.prices`:
    # frozen like the engines, so a run's cost never changes with a later edit of the config.
    prices: dict[str, dict[str, Any]] | None = field(OPT(DICT(DICT(NUM()))), None)
    # config `limits.maxCostPerDay`: USD the project's runs together may spend per day (UTC)
    daily_cost_limit: float | None = field(OPT(NUM()), None)


class Plan(PlanRecord):
    ir_version: Literal[3] = field(LIT(IR_VERSION), IR_VERSION)
    title: str = field(STR)
    params: list[str] | None = field(_OPT_STRS, None)
    param_schemas: dict[str, dict[str, Any]] | None = field(OPT(DICT(DICT())), None)
    budget: Budget | None = field(OPT(REC(Budget)), None)
    execution: Execution = field(REC(Execution), factory=lambda: Execution())
    steps: list[StepPlan] = field(LIST(REC(StepPlan), 1, 256))

    def to_json_obj(self) -> dict[str, Any]:
        return self._dump()

    def canonical(self) -> str:
        return canonical_json(self._dump())

    def plan_hash(self) -> str:
        return sha256_hex(self.canonical())

    def step(self, step_id: str) -> StepPlan | None:
        for s in self.steps:
            if s.step_id == step_id:
                return s
        return None
