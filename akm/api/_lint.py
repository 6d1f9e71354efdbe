"""`lint` and `upgrade`: the calls that read workflow files and never touch the journal."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from akm.errors import UsageError

if TYPE_CHECKING:
    from akm.api._models import (
        LintRequest,
        UpgradeRequest,
        UpgradeResult,
    )
    from akm.format.lint import LintReport
from akm.api._request import _arguments, _validated
from akm.api._targets import _read_workflow_text


def lint(paths_: list[str] | LintRequest) -> LintReport:
    """Lint files or directories; returns a `LintReport` (see akm.format.lint)."""
    from akm.format.lint import lint_paths

    req = _arguments("LintRequest", paths_, {"paths": paths_}, {"paths": _path_list})
    report = lint_paths(req.paths)
    if not report.files:
        from akm.codes import Code

        raise UsageError(
            f"No workflow files found in {', '.join(req.paths)}.",
            code=Code.NO_WORKFLOW_FILES,
            hint="Workflows are *.md files (README.md is skipped); pass a file or a directory holding them.",
        )
    return report


def _path_list(value: Any) -> list[str]:
    """LintRequest's rule for `paths` (a non-empty list of strings), without pydantic."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise TypeError(f"paths {value!r}: expected a list of workflow files or directories")
    if not value:
        raise ValueError("paths: expected at least one workflow file or directory")
    return list(value)


def upgrade(path: str | UpgradeRequest, *, write: bool = False) -> UpgradeResult:
    """Convert a legacy workflow file to the current format (optionally in place)."""
    from akm.format.lint import lint_text
    from akm.format.upgrade import detect_legacy, upgrade_legacy

    req = _validated("UpgradeRequest", path, {"path": path, "write": write})
    file: str = req.path
    write = req.write
    text = _read_workflow_text(Path(file))
    if detect_legacy(text) is None:
        from akm.codes import Code

        raise UsageError(f"{file} is not in the legacy workflow format; nothing to upgrade.", code=Code.NOT_LEGACY)
    new_text = upgrade_legacy(text)
    report = lint_text(new_text, file)
    errors = [e.model_dump() for e in report.errors]  # a Diagnostic's dump omits its empty fields
    if write:
        if errors:
            from akm.codes import Code

            raise UsageError(
                f"The upgraded {file} would still have {len(errors)} lint error(s); not written.",
                code=Code.UPGRADE_FAILED,
                details={"errors": errors},
            )
        Path(file).write_text(new_text, encoding="utf-8")
    from akm.api._models import UpgradeResult

    return UpgradeResult(path=file, written=write, text=new_text, ok=not errors, errors=errors)
