"""What every bench script does the same way: interleaved rounds, and "median (range)" figures.

Why interleaved: the machine is shared, and its load drifts over a run. Each round runs every
contender once, and the order is reversed every other round, so a trend in the load hits each
contender alike instead of whichever happens to run last. A figure is then the median of the
rounds with its range, so one disturbed round shows as a wide range, not as a wrong median.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


def order_for(round_index: int, names: Sequence[str]) -> list[str]:
    """The contenders' order in round `round_index`: as given in even rounds, reversed in odd ones."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def interleaved(rounds: int, contenders: Mapping[str, Callable[[], T]]) -> dict[str, list[T]]:
    """Run every contender once per round (see `order_for`); each one's results, in round order."""
    got: dict[str, list[T]] = {name: [] for name in contenders}
    for r in range(rounds):
        for name in order_for(r, list(contenders)):
            got[name].append(contenders[name]())
    return got


def spread(values: Sequence[float], fmt: str = ".2f", scale: float = 1.0, unit: str = "") -> str:
    """'median M (range A-B)' of `values` (each multiplied by `scale`, printed with `fmt` and `unit`)."""
    xs = [v * scale for v in values]
    return (
        f"median {statistics.median(xs):{fmt}}{unit} (range {min(xs):{fmt}}{unit}-{max(xs):{fmt}}{unit}; "
        f"{len(xs)} rounds)"
    )


def fan_workflow(*, width: int = 2, command: str = '["true"]', does: str = "Run `true` once per item.") -> str:
    """The workflow most benches drive: one step that maps `params.xs` with `width` units in flight, each
    running `command` (a flow-style YAML list); `does` is the step's instructions."""
    return (
        "---\nparams:\n  xs: { type: array }\nsteps:\n  - id: fan\n    map:\n      over: params.xs\n"
        f"      concurrency: {width}\n      unit:\n        exec: {{ command: {command} }}\n---\n\n## fan\n\n{does}\n"
    )


@contextlib.contextmanager
def server(url: str | None, settings: dict[str, str] | None = None) -> Iterator[str]:
    """A PostgreSQL server for a bench: `url` when given, else a throwaway local cluster (tests/pgcluster.py)
    started with `settings` (server settings such as `shared_preload_libraries`)."""
    if url:
        yield url
        return
    from tests import pgcluster

    bindir = pgcluster.find_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL binaries found (set AKM_TEST_PG_BINDIR) and no --url given")
    with pgcluster.cluster(bindir, settings) as c:
        yield c.url()
