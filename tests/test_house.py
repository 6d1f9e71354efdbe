"""The house rules, checked with every test run (and so by CI): formatted, linted, type-checked.

`ruff format --check` and `ruff check` (E, F, I, B; pyproject.toml) must pass as they are. mypy passes on all
of `akm/`, and the packages in STRICT_PACKAGES pass `mypy --strict`.
"""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

SOURCES = ["akm", "tests", "bench"]


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_format_check_passes():
    proc = _tool("ruff", "format", "--check", *SOURCES)
    assert proc.returncode == 0, f"run `ruff format {' '.join(SOURCES)}`:\n{proc.stdout}{proc.stderr}"


def test_ruff_check_passes():
    proc = _tool("ruff", "check", *SOURCES)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean_on_akm():
    """Plain mypy on all of `akm/`: no errors. (It was held to a baseline that could only go down while the old
    errors were paid off: 148 at the review, 0 with issue 36 item 5.)"""
    proc = _tool("mypy", "akm")
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout[-4000:] + proc.stderr


# Packages held to `mypy --strict` (issue 36 item 5); each is added once it is clean, and stays clean.
STRICT_PACKAGES = ["akm/api", "akm/dispatch", "akm/engine", "akm/store"]


def test_mypy_strict_on_the_core_packages():
    """Strict on the packages listed: every function typed, no `Any` leaking out as a return, generics
    with their arguments. Imports outside them are followed silently (plain mypy checks those)."""
    proc = _tool("mypy", "--strict", "--follow-imports=silent", *STRICT_PACKAGES)
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout[-4000:] + proc.stderr


# Functions and methods over this cyclomatic complexity are hard to read and to test whole (issue 36 item 5).
COMPLEXITY_LIMIT = 15
# The share of them allowed in `akm/`: 4.4% at the review, 3% the goal it set (httpx 0.5%, the MCP SDK 2%).
COMPLEX_SHARE_MAX = 0.03


def test_few_functions_are_over_complexity_15():
    """radon's cyclomatic complexity (the measure the review used), counted over every function and method
    radon lists in `akm/` (nested functions count toward the function around them, as radon does; classes are
    not counted): at most 3% above 15. Split the function you made complex, by concern, not by lines."""
    from radon.complexity import cc_visit

    blocks = []
    for path in sorted((ROOT / "akm").rglob("*.py")):  # cc_visit lists a class's methods after the class
        for block in cc_visit(path.read_text(encoding="utf-8")):
            blocks.append((path.relative_to(ROOT), block))
    functions = [(p, b) for p, b in blocks if b.letter in ("F", "M")]
    over = sorted(
        (b.complexity, f"{p}:{b.lineno} {b.fullname}") for p, b in functions if b.complexity > COMPLEXITY_LIMIT
    )
    share = len(over) / len(functions)
    worst = "\n".join(f"  {c} {name}" for c, name in reversed(over))
    assert share <= COMPLEX_SHARE_MAX, (
        f"{len(over)} of {len(functions)} functions ({share:.1%}) are over complexity {COMPLEXITY_LIMIT}:\n{worst}"
    )
