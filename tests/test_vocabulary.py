"""One vocabulary: every error code akm raises is an `akm.codes.Code`, spec/errors.md is generated from it,
and the fronts' hint tables key on real codes (a typo there would be silent)."""

from __future__ import annotations

import re
from pathlib import Path

from akm import cli, codes, errors
from akm.codes import Code

ROOT = Path(__file__).resolve().parent.parent
# `code="X"` or `code=Code.X` in a call, `code = "X"` on an error class; the runtime's `fail("X", ...)`.
_LITERAL = re.compile(r"""\bcode\s*=\s*(?:["']|Code\.)([A-Z][A-Z0-9_]+)""")
_BUNDLE = re.compile(r"""\bfail\(\s*["']([A-Z][A-Z0-9_]+)["']""")
# Warning codes (`RunWarning.code`) and lint diagnostics share the word `code` but are not errors.
_NOT_ERRORS = {"ENGINE", "LINT", "SECRET_REDACTED", "WORKFLOW_CHANGED", "CONFIG_KEY", "TELEMETRY"}


def _codes_in(paths: list[Path], pattern: re.Pattern[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        for m in pattern.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(m.group(1), str(path.relative_to(ROOT)))
    return found


def test_spec_errors_md_is_generated_from_the_enum():
    assert (ROOT / "spec" / "errors.md").read_text(encoding="utf-8") == codes.render_errors_md(), (
        "spec/errors.md is stale: python -m akm.codes > spec/errors.md"
    )
    assert set(codes.CODE_MEANINGS) == set(Code)


def test_every_code_the_source_raises_is_in_the_enum():
    raised = _codes_in(sorted((ROOT / "akm").rglob("*.py")), _LITERAL)
    raised.update(_codes_in(sorted((ROOT / "bundle").glob("*.py")), _BUNDLE))
    unknown = {c: where for c, where in raised.items() if c not in Code.__members__ and c not in _NOT_ERRORS}
    assert not unknown, f"codes missing from akm.codes.Code (add them with a meaning): {unknown}"
    unused = {c.value for c in Code} - set(raised) - {"ERROR", "INVALID_ARGUMENT", "UNKNOWN_FLAG", "UPGRADE_FAILED"}
    assert not unused, f"codes nothing raises (remove them, or raise them): {unused}"


def test_hint_tables_key_on_real_codes():
    import akm.mcp as mcp_front

    for table, where in ((cli._CLI_HINTS, "cli"), (mcp_front._HINTS, "mcp")):
        bad = [k for k in table if k not in Code.__members__]
        assert not bad, f"{where} hint table keys that are no error code: {bad}"


def test_a_code_is_its_string():
    """Code members are plain strings on the wire: AkmError(code=Code.X) and code="X" are the same error."""
    err = errors.UsageError("m", code=Code.LEASE_HELD)
    assert err.code == "LEASE_HELD" and err.to_dict()["code"] == "LEASE_HELD"
    import json

    assert json.dumps(err.to_dict())  # serialisable as a str


def _readme_exit_rows() -> dict[str, str]:
    """README's "Exit status" table: status -> meaning."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("**Exit status.**") :]
    rows = {}
    for line in table.splitlines()[5:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        for status in cells[0].split("/"):
            rows[status.strip()] = cells[1]
    return rows


def test_every_code_exits_with_one_status_that_readme_documents():
    """One rule (issue 39): the code decides the exit status wherever it is raised, and README's table has
    every status a code can take; what it names as examples exits as it says."""
    rows = _readme_exit_rows()
    for code in Code:
        status = errors.exit_status_of(code.value)
        assert str(status) in rows, f"{code.value} exits {status}, which README's table does not list"
        for cls in (errors.AkmError, errors.UsageError, errors.NotFoundError, errors.ConfigError):
            assert cls("m", code=code.value).exit_status == status, (cls, code)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for line in text[text.index("**Exit status.**") :].splitlines()[5:16]:
        if line.startswith("|"):
            status, _, examples = [c.strip() for c in line.strip("|").split("|")]
            for named in re.findall(r"`([A-Z_]+)`", examples):
                assert str(errors.exit_status_of(named)) == status, (named, status)
    # the two the issue names, and the classes' own codes
    assert errors.exit_status_of("LEASE_HELD") == 2 and errors.exit_status_of("WORKFLOW_NOT_FOUND") == 1
    assert errors.UsageError("m").exit_status == 2 and errors.NotFoundError("m").exit_status == 1
    assert errors.ConfigError("m").exit_status == 78 and errors.JournalError("m").exit_status == 78
    assert set(errors.EXIT_BY_CODE) <= set(Code.__members__), "EXIT_BY_CODE names a code that does not exist"


def test_spec_errors_md_lists_each_codes_exit_status():
    md = (ROOT / "spec" / "errors.md").read_text(encoding="utf-8")
    for code in Code:
        assert f"| `{code.value}` | {errors.exit_status_of(code.value)} |" in md, code


def test_no_error_code_is_a_string_literal_in_akm():
    """Every error is raised with the enum (`code=Code.X`, issue 36 item 4): a misspelt member fails at once,
    where a misspelt string would be a new, undocumented code. Warning codes are not errors: they are typed
    by `akm.views.WarningCode`; lint diagnostics' codes are lowercase."""
    import ast
    import typing

    from akm.views import WarningCode

    warnings = set(typing.get_args(WarningCode))
    assert warnings == _NOT_ERRORS
    literal = []
    for path in sorted((ROOT / "akm").rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "akm":
            continue  # the classes' own defaults: plain strings, so `import akm.errors` builds no enum
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for kw in node.keywords if isinstance(node, ast.Call) else ():
                v = kw.value
                if kw.arg == "code" and isinstance(v, ast.Constant) and isinstance(v.value, str):
                    if re.fullmatch(r"[A-Z][A-Z0-9_]+", v.value) and v.value not in warnings:
                        literal.append(f"{path.relative_to(ROOT)}:{v.lineno} code={v.value!r}")
    assert not literal, "error codes as string literals (use code=Code.X):\n" + "\n".join(literal)


def test_the_short_commands_never_build_the_code_enum(project):
    """Raising with `Code.X` must not cost the commands that answer fast: modules on their paths import
    `akm.codes` where they raise, so it is loaded only when an error is."""
    import os
    import shutil
    import subprocess
    import sys

    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    probe = (
        "import sys\nfrom akm.cli import main\nmain(sys.argv[1:])\n"
        "sys.stderr.write('CODES LOADED' if 'akm.codes' in sys.modules else 'CODES NOT LOADED')"
    )
    for argv in (
        ["--version"],
        ["workflow", "lint", "hello.md"],
        ["workflow", "run", "hello.md"],
        ["workflow", "run", "hello.md"],
        ["workflow", "list"],
        ["workflow", "status", "@last", "--format", "json"],
    ):
        proc = subprocess.run(
            [sys.executable, "-c", probe, *argv],
            cwd=project,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.stderr.endswith("CODES NOT LOADED"), (argv, proc.stderr[-2000:])
