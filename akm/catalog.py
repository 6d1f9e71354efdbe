"""The workflows a project can run (`workflow_catalog`, `akm workflow catalog`).

An agent should not have to guess a workflow's name or params from an error: this lists every
`workflows/<name>` the run targets resolve — the project's `.akm/workflows/`, then the user library —
with its description, steps and params. Parsing only (no plan, no config): listing stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from akm.views import Catalog, CatalogEntry, CatalogParam, CatalogStep


def library_roots(project_root: Path) -> list[tuple[str, Path]]:
    """(source, directory) in lookup order: what `workflows/<name>` resolves against."""
    import platformdirs

    return [
        ("project", project_root / ".akm" / "workflows"),
        ("user", Path(platformdirs.user_data_dir("akm", appauthor=False)) / "workflows"),
    ]


def catalog(project_root: Path) -> Catalog:
    """Every workflow under the library roots; a name in the project shadows the user library's."""
    roots = library_roots(project_root)
    seen: set[str] = set()
    entries: list[CatalogEntry] = []
    for source, root in roots:
        try:
            files = sorted(p for p in root.rglob("*.md") if p.is_file() and p.name != "README.md")
        except OSError:
            continue
        for path in files:
            name = path.relative_to(root).with_suffix("").as_posix()
            if name in seen:
                continue
            seen.add(name)
            entries.append(_entry(f"workflows/{name}", path, source))
    return Catalog(workflows=entries, roots=[str(r) for _, r in roots])


def describe(ref: str, path: Path, project_root: Path) -> CatalogEntry:
    """One workflow's entry, wherever it lives: `source` is project or user for a `workflows/<name>` ref
    (which library it resolved in), file for a file path."""
    source = "file"
    if ref.startswith("workflows/"):
        source = "project" if path.is_relative_to(project_root / ".akm" / "workflows") else "user"
    return _entry(ref, path, source)


def _entry(ref: str, path: Path, source: str) -> CatalogEntry:
    from akm.format.parse import parse_workflow

    entry = CatalogEntry(ref=ref, path=str(path), source=source)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        entry.problems = [f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"]
        return entry
    parsed = parse_workflow(text, str(path))
    doc = parsed.document
    entry.problems = [f"line {e.line}: {e.message} [{e.code}]" for e in parsed.errors]
    if doc is None:
        return entry
    entry.title, entry.description, entry.when_to_use = doc.title, doc.description, doc.when_to_use
    entry.steps = [CatalogStep(id=s.id, kind=str(s.kind), gated=s.gate is not None) for s in doc.steps]
    entry.params = [_param(name, schema) for name, schema in doc.params.items()]
    return entry


def _param(name: str, schema: Any) -> CatalogParam:
    schema = schema if isinstance(schema, dict) else {}
    kind = schema.get("type")
    return CatalogParam(
        name=name,
        type=kind if isinstance(kind, str) else (" | ".join(str(k) for k in kind) if isinstance(kind, list) else None),
        description=schema.get("description"),
        required="default" not in schema,
        default=schema.get("default"),
    )
