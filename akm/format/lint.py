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


def render_text(report: LintReport) -> str:
    """Human output: one `path:line[:col]: severity[code]: message` line per finding, hints indented."""
    out: list[str] = []
    n_err = n_warn = bad_files = 0
    for f in report.files:
        if f.errors:
            bad_files += 1
        hinted: set[tuple[str, str]] = set()  # a repeated warning's hint is printed once per file
        for severity, items in (("error", f.errors), ("warning", f.warnings)):
            for d in items:
                where = f"{f.path}:{d.line}" + (f":{d.column}" if d.column is not None else "")
                out.append(f"{where}: {severity}[{d.code}]: {d.message}")
                if d.hint and (severity == "error" or (d.code, d.hint) not in hinted):
                    hinted.add((d.code, d.hint))
                    out.append(f"    hint: {d.hint}")
        n_err += len(f.errors)
        n_warn += sum(d.count or 1 for d in f.warnings)
    total = len(report.files)
    files_word = "file" if total == 1 else "files"
    if not report.files:
        out.append("no workflow files found")
    elif n_err:
        out.append(
            f"{n_err} error(s), {n_warn} warning(s) in {total} {files_word} checked; "
            f"{bad_files} {'file has' if bad_files == 1 else 'files have'} errors"
        )
    else:
        out.append(f"{total} {files_word} checked: no errors, {n_warn} warning(s)")
    return "\n".join(out) + "\n"
