"""What a call names: a workflow file or `workflows/<name>` ref resolved to a file, checked as a path, and
compiled (parse, lint, plan) into the frozen plan a run starts from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from akm import paths
from akm.api._args import MAX_TARGET_CHARS
from akm.errors import NotFoundError, UsageError
from akm.views import (
    RunWarning,
)

if TYPE_CHECKING:
    from akm.plan.model import Plan


def _read_workflow_text(path: Path) -> str:
    from akm.text import shown

    where = shown(str(path))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        from akm.codes import Code

        raise NotFoundError(f"Workflow file {where} does not exist.", code=Code.WORKFLOW_NOT_FOUND) from None
    except OSError as exc:
        from akm.codes import Code

        raise UsageError(
            f"Cannot read workflow file {where}: {exc.strerror or exc}.", code=Code.UNREADABLE_FILE
        ) from None
    except ValueError as exc:  # an embedded NUL (API callers)
        from akm.codes import Code

        raise UsageError(f"Cannot read workflow file {where}: {exc}.", code=Code.INVALID_PATH) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        from akm.codes import Code

        raise UsageError(f"{where} is not UTF-8 text (byte {exc.start}).", code=Code.UNREADABLE_FILE) from None


def resolve_workflow_file(target: str, cwd: Path) -> tuple[Path, str]:
    """D4: a file path, or `workflows/<name>` looked up in the project then the user library.

    Returns (file, workflow_ref). A path's ref is its real path, so runs of the same
    file from anywhere in the project share one identity.
    """
    from akm.text import require_utf8, shown

    _checked_target(target, "the workflow target")
    candidate = (cwd / target) if not os.path.isabs(target) else Path(target)
    if _is_file(candidate, target):
        # The real path, not `cwd / target`: a relative target joined to an invocation directory
        # whose name is not UTF-8 ("<bad>/../wf.md") would carry that name into the plan.
        real = os.path.realpath(candidate)
        require_utf8(real, "the workflow file's path")
        return Path(real), real
    if target.startswith("workflows/"):
        ref = normalized_ref(target)
        if ref is None:
            from akm.codes import Code

            raise UsageError(f"Invalid workflow ref {shown(target)}.", code=Code.INVALID_REF)
        name = ref[len("workflows/") :]
        import platformdirs

        roots = [
            paths.project_root(cwd) / ".akm" / "workflows",
            Path(platformdirs.user_data_dir("akm", appauthor=False)) / "workflows",
        ]
        for root in roots:
            f = root / f"{name}.md"
            if _is_file(f, target):
                require_utf8(str(f), "the workflow file's path")
                return f, f"workflows/{name}"
        from akm.codes import Code

        raise NotFoundError(
            f"Workflow {shown(target)} not found.",
            code=Code.WORKFLOW_NOT_FOUND,
            hint="Looked in " + " and ".join(str(r) for r in roots) + ".",
        )
    from akm.codes import Code

    raise NotFoundError(
        f"{shown(target)} is not a workflow file, a workflows/<name> ref or a run id.",
        code=Code.WORKFLOW_NOT_FOUND,
    )


def normalized_ref(target: str) -> str | None:
    """`workflows/<name>` with `.` and empty segments and a trailing `.md` dropped (`workflows/./s`,
    `workflows//s.md` and `workflows/s` are one ref, so one identity for `which run`); None when `target`
    is no such ref or names nothing (`workflows/`, a `..` segment)."""
    if not target.startswith("workflows/"):
        return None
    name = target[len("workflows/") :]
    if name.endswith(".md"):
        name = name[:-3]
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "workflows/" + "/".join(parts)


def _checked_target(target: str, what: str) -> None:
    from akm.text import require_utf8, shown

    require_utf8(target, what)
    if len(target) > MAX_TARGET_CHARS:
        from akm.codes import Code

        raise UsageError(
            f"{what[0].upper() + what[1:]} is {len(target)} characters long, over the "
            f"{MAX_TARGET_CHARS}-character limit for a path or ref: {shown(target)}",
            code=Code.INVALID_PATH,
        )
    if "\0" in target:
        from akm.codes import Code

        raise UsageError(
            f"{what[0].upper() + what[1:]} {shown(target)} contains a NUL character, which no path can hold.",
            code=Code.INVALID_PATH,
        )


def _is_file(path: Path, target: str) -> bool:
    """`path.is_file()`, but a path the OS cannot even look up is a usage error, not a crash."""
    from akm.text import shown

    try:
        return path.is_file()
    except OSError as exc:  # ENAMETOOLONG (a component over 255 bytes), EACCES on a parent, ...
        from akm.codes import Code

        raise UsageError(
            f"Cannot look up the workflow {shown(target)}: {exc.strerror or exc}.", code=Code.INVALID_PATH
        ) from None


def compile_workflow_file(path: Path, *, cwd: Path | None = None) -> tuple[Plan, list[RunWarning]]:
    """Parse + lint + compile a workflow file to a frozen plan, or raise with every problem listed.

    Engines are frozen from the config of the project `cwd` is in (none read when no config file exists).
    """
    from akm.config import load_config_if_any
    from akm.format.parse import parse_workflow
    from akm.plan.compile import compile_plan

    text = _read_workflow_text(path)
    parsed = parse_workflow(text, str(path))
    if parsed.errors or parsed.document is None:
        lines = [f"{path}:{e.line}: {e.message} [{e.code}]" for e in parsed.errors]
        from akm.codes import Code

        raise UsageError(
            f"Workflow {path} has {len(parsed.errors)} error(s):\n" + "\n".join(lines),
            code=Code.WORKFLOW_INVALID,
            details={"path": str(path)},
        )
    warnings = [
        RunWarning(
            code="LINT",
            message=f"{path}:{w.line}: {w.message} [{w.code}]",
            details={"path": str(path), "line": w.line, "lintCode": w.code},
        )
        for w in parsed.warnings
    ]
    config = load_config_if_any(cwd)
    if config is not None:  # a misspelt engine key is kept but does nothing: say so where the run is started
        from akm.config.keys import unknown_key_warnings

        for file, data in ((config.user_path, config.user), (config.project_path, config.project)):
            warnings += [
                RunWarning(code="CONFIG_KEY", message=m, details={"file": str(file)})
                for m in unknown_key_warnings(data, str(file))
            ]
    return compile_plan(parsed.document, title=path.stem, config=config), warnings
