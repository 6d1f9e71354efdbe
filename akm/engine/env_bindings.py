"""Resolve a unit's `env:` references to values at dispatch time.

An env ref `env/<name>` names a dotenv file: `<project>/.akm/env/<name>.env`
first, then `<user config dir>/akm/env/<name>.env`. Only the ref NAMES are in
the plan and the input hash; the values are secrets, resolved late, handed to
the process environment and scrubbed from everything akm stores or prints.
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvBindingError(ValueError):
    pass


def _candidates(ref: str, project_root: Path) -> list[Path]:
    name = ref[len("env/"):] if ref.startswith("env/") else ref
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise EnvBindingError(f'env ref "{ref}" is not of the form env/<name>')
    from platformdirs import user_config_dir

    return [project_root / ".akm" / "env" / f"{name}.env", Path(user_config_dir("akm")) / "env" / f"{name}.env"]


def parse_dotenv(text: str, origin: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _NAME.match(key):
            raise EnvBindingError(f"{origin}:{n}: expected NAME=value")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key] = value
    return values


def resolve_env_refs(refs: list[str], project_root: Path) -> dict[str, str]:
    """Later refs override earlier keys."""
    merged: dict[str, str] = {}
    for ref in refs:
        for path in _candidates(ref, project_root):
            if path.is_file():
                try:
                    merged.update(parse_dotenv(path.read_text(encoding="utf-8"), str(path)))
                except (OSError, UnicodeDecodeError) as exc:
                    raise EnvBindingError(f'env ref "{ref}": cannot read {path}: {exc}') from exc
                break
        else:
            raise EnvBindingError(
                f'env ref "{ref}" not found (looked for {", ".join(str(p) for p in _candidates(ref, project_root))})'
            )
    return merged


