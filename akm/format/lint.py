"""`akm workflow lint`: run the parser over files and directories, report per file.

Lint never raises for anything about the inputs: a missing path, a directory
without workflows, a binary or non-UTF-8 file and an oversized file are all
reported as diagnostics in the file's entry, so one bad file never hides the
results for the others. The JSON shape (`LintReport.model_dump()`) is a public
contract shared by the CLI's `--format json` and the MCP `workflow_lint` tool
(which derives its output schema from these records, see akm.mcp).

The reports are plain records (`akm.views.View`), not pydantic models: linting
imports no pydantic, which keeps a cold start of the zipapp under a second.
"""

from __future__ import annotations

import os
from pathlib import Path

from akm.format.diagnostics import Diagnostic
from akm.format.grammar import MAX_SOURCE_BYTES
from akm.format.parse import parse_workflow
from akm.views import View


class FileReport(View):
    path: str
    ok: bool
    errors: list[Diagnostic]
    warnings: list[Diagnostic]


class LintReport(View):
    ok: bool
    files: list[FileReport]


def lint_text(text: str, path: str) -> FileReport:
    """Lint workflow source already in memory (`path` is only used in messages)."""
    result = parse_workflow(text, path)
    return FileReport(path=path, ok=not result.errors, errors=result.errors, warnings=result.warnings)


def _failed(path: str, code: str, message: str, hint: str | None = None) -> FileReport:
    return FileReport(
        path=path, ok=False, errors=[Diagnostic(code=code, message=message, line=1, hint=hint)], warnings=[]
    )


def lint_file(path: str) -> FileReport:
    """Read one file (bytes -> strict UTF-8) and lint it."""
    p = Path(path)
    try:
        if not p.exists():
            return _failed(path, "unreadable_file", "no such file or directory", hint="check the path")
        if not p.is_file():
            return _failed(path, "unreadable_file", "not a regular file")
        size = p.stat().st_size
        if size > MAX_SOURCE_BYTES:
            return _failed(
                path,
                "file_too_large",
                f"the file is {size} bytes; a workflow may be at most 1 MiB ({MAX_SOURCE_BYTES} bytes)",
                hint="move long reference material into separate files the steps read",
            )
        data = p.read_bytes()
    except OSError as exc:
        return _failed(path, "unreadable_file", f"cannot read the file: {exc.strerror or exc}")
    if len(data) > MAX_SOURCE_BYTES:  # grew between stat and read
        return _failed(path, "file_too_large", f"the file is more than 1 MiB ({MAX_SOURCE_BYTES} bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        report = _failed(
            path,
            "unreadable_file",
            f"the file is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint="save the file as UTF-8",
        )
        report.errors[0].line = line
        return report
    return lint_text(text, path)


def _expand(path: str) -> list[str]:
    """A file stays as is; a directory becomes its *.md files (recursively, sorted), minus README.md."""
    if not os.path.isdir(path):
        return [path]
    found: list[str] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.lower().endswith(".md") and name.lower() != "readme.md":
                found.append(os.path.join(root, name))
    return found


def lint_paths(paths: list[str]) -> LintReport:
    """Lint every given file and every workflow under every given directory, in order."""
    files: list[FileReport] = []
    seen: set[str] = set()
    for raw in paths:
        for path in _expand(raw):
            if path in seen:
                continue
            seen.add(path)
            files.append(lint_file(path))
    return LintReport(ok=all(f.ok for f in files), files=files)
