"""Resolve a unit's `env:` references to values at dispatch time.

An env ref `env/<name>` names a dotenv file: `<project>/.akm/env/<name>.env`
first, then `<user config dir>/akm/env/<name>.env`. Only the ref NAMES are in
the plan and the input hash; the values are secrets, resolved late, handed to
the process environment and scrubbed from everything akm stores or prints.

The files are read with python-dotenv's parser, so they mean what they mean to
every other tool that reads `.env` files: `# comments` (also after an unquoted
value), `export NAME=...`, single quotes (literal), double quotes (with `\\n`,
`\\t`, `\\"`, `\\\\` escapes), values spanning lines inside quotes. Two choices
are ours: there is no `${VAR}` expansion (a value is exactly what the file says,
never something pulled from akm's own environment), and a line the parser
cannot read, or a name that is not an environment variable name, is an error
naming the file and line — a secrets file that is silently half-read would
make a unit fail far away from the cause.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from akm.format.grammar import ENV_REF_RE

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvBindingError(ValueError):
    pass


def _candidates(ref: str, project_root: Path) -> list[Path]:
    if not ENV_REF_RE.match(ref):
        raise EnvBindingError(f'env ref "{ref}" is not of the form env/<name>')
    name = ref[len("env/"):]
    from platformdirs import user_config_dir

    return [project_root / ".akm" / "env" / f"{name}.env", Path(user_config_dir("akm")) / "env" / f"{name}.env"]


def parse_dotenv(text: str, origin: str) -> dict[str, str]:
    """`NAME=value` bindings of a dotenv file (python-dotenv's rules, no interpolation).

    A bare `NAME` line (no `=`) binds nothing, as in python-dotenv.
    """
    from dotenv.parser import parse_stream  # lazy: only runs that bind env files pay for it

    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text.lstrip("\ufeff"))):
        line = binding.original.line
        if binding.error:
            raise EnvBindingError(f"{origin}:{line}: cannot read this line; expected NAME=value")
        if binding.key is None:  # blank line or comment
            continue
        if not _NAME.match(binding.key):
            raise EnvBindingError(f"{origin}:{line}: {binding.key!r} is not an environment variable name "
                                  "(letters, digits and _, not starting with a digit)")
        if binding.value is None:
            continue
        values[binding.key] = binding.value
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
