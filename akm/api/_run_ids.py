"""Which run a caller names: a whole run id, the first characters of one, or `@last`.

Run ids are UUIDs nobody types whole (`workflow status ce0c35b3` answered RUN_NOT_FOUND). Every api call
that takes a run id resolves it here, once, so both fronts accept the same forms:

* a whole id — as it is, in any project;
* a unique prefix of at least `MIN_PREFIX` characters (`ce0c35b3`), in any project; a prefix several runs
  share is refused with RUN_ID_AMBIGUOUS listing them (newest first), never guessed;
* `@last` — the newest run of the project of `cwd` (the caller's directory; over MCP, the server's).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from akm.errors import NotFoundError, UsageError

MIN_PREFIX = 6
LAST = "@last"
# How many candidates an ambiguous prefix lists.
SHOWN_CANDIDATES = 10
_PREFIX = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]*\Z")


def is_run_reference(text: str) -> bool:
    """Whether `text` has the form of a run reference other than a whole id (`@last`, or a long enough
    prefix): a `workflow run` target of this form is looked up as a run when no file has that name."""
    return text == LAST or (MIN_PREFIX <= len(text) < 36 and _PREFIX.match(text) is not None)


def resolve_run_id(db: Any, text: str, cwd: Path | None = None) -> str:
    """The whole id of the run `text` names. A whole id, or anything that is no run reference, comes back
    as it is (looking it up says RUN_NOT_FOUND); `@last` with no run in the project, and a prefix no run has,
    are RUN_NOT_FOUND; a prefix several runs share is RUN_ID_AMBIGUOUS."""
    from akm.store import runs as runs_store

    if text == LAST:
        from akm import paths

        where = paths.project_root((cwd or Path.cwd()).resolve())
        found = runs_store.newest_run_id(db, paths.scope_keys(where, portable=db.shared))
        if found is None:
            from akm.codes import Code

            raise NotFoundError(
                f"@last names the newest run of this project ({where}), and it has none yet.",
                code=Code.RUN_NOT_FOUND,
                details={"runId": text, "project": str(where)},
            )
        return found
    if len(text) >= 36 or _PREFIX.match(text) is None:
        return text
    if len(text) < MIN_PREFIX:
        from akm.codes import Code
        from akm.text import shown

        raise NotFoundError(
            f"No workflow run with id {shown(text)}; a run id may be shortened to its first {MIN_PREFIX} "
            "characters or more, not fewer.",
            code=Code.RUN_NOT_FOUND,
            details={"runId": text},
        )
    prefix = text.lower()
    found_runs = runs_store.runs_with_id_prefix(db, prefix, SHOWN_CANDIDATES + 1)
    if not found_runs:
        return text  # looked up as it is: RUN_NOT_FOUND naming what was typed
    if len(found_runs) == 1:
        return found_runs[0][0]
    shown_runs = found_runs[:SHOWN_CANDIDATES]
    more = " (and more)" if len(found_runs) > SHOWN_CANDIDATES else ""
    from akm.codes import Code

    raise UsageError(
        f"Run id {text} is ambiguous: it begins {len(shown_runs)}{more} runs — "
        + "; ".join(f"{rid} ({status}, {ref}, {created})" for rid, status, ref, created in shown_runs)
        + ". Give more of the id.",
        code=Code.RUN_ID_AMBIGUOUS,
        details={"prefix": text, "candidates": [rid for rid, *_ in shown_runs]},
    )
