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
