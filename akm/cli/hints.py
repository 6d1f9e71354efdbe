"""This front's hints: what to type about an error, keyed on its code (`akm.codes.Code` members, checked by
tests/test_vocabulary.py). Imported only when an error is printed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from akm.errors import AkmError

# The core says what is wrong; the CLI says what to type about it. Templates take `{key}` from the
# error's details (a template whose keys are missing is not used, and the core's own hint stays).
_CLI_HINTS: dict[str, str] = {
    "RUN_NOT_FOUND": "List runs with `akm workflow list` (`--all` for every project).",
    "RUN_ID_AMBIGUOUS": "Type more of the run id; `akm workflow list` shows them whole.",
    "RUN_ABANDONED": "Abandoning is final; `akm workflow run FILE --from {runId}` starts a new run that reuses its "
    "completed units.",
    "RUN_ALREADY_FINISHED": "Start a new run from the workflow file with `akm workflow run FILE`.",
    "LEASE_HELD": "Wait for that `akm workflow run` to finish, or for its lease to expire; "
    "`akm workflow status {runId}` shows who holds it.",
    "WORKFLOW_INVALID": "Run `akm workflow lint {path}` for every problem and how to fix it.",
    "CORRUPT_RUN": "Inspect it with `akm workflow status {runId}` or discard it with `akm workflow abandon {runId}`.",
    "PARAMS_ON_EXISTING_RUN": "Params go with the workflow file: `akm workflow run FILE --name value`.",
    "NEW_RUN_NEEDS_WORKFLOW": "Pass the workflow file or workflows/<name> together with --new.",
    "REPORT_CONFLICT": "Add --rerun to replace the recorded result.",
    "UNIT_TERMINAL": "Add --rerun to do the finished unit again.",
    "CLAIM_EXPIRED": "Claim it again with --status running (same --holder), then report its result.",
    "STEP_MISMATCH": "`akm workflow next RUN` shows what the run needs now.",
    "STEP_CLOSED": "Go back to that step with `akm workflow rewind {runId} --to {stepId}`, then report the unit "
    "again with --rerun.",
    "STALE_REPORT": "`akm workflow next RUN` shows the current attempt; report that with --attempt.",
    "REPLAY_DIVERGED": "Go back to the unit's step: `akm workflow rewind {runId} --to {stepId} --redo`.",
    "UNKNOWN_UNIT": "`akm workflow next RUN` lists the units to report; a unit of a finished step is done again "
    "after `akm workflow rewind RUN --to STEP`.",
    "BUDGET_EXCEEDED": "A rewind gives no budget back: raise it in the workflow file, then `akm workflow run FILE "
    "--from RUN` starts a new run that reuses every completed unit.",
    "STEP_NOT_REACHED": "`akm workflow status RUN` shows the steps the run finished or is on.",
    "JOURNAL_CONNECTION_LOST": "Once the journal server is reachable, run the command again; "
    "`akm workflow run RUN` resumes a run where its journal stands.",
}
# An argument of the api (details.argument) as the CLI spells it.
_FLAG_OF = {
    "max_steps": "--max-steps",
    "timeout": "--timeout",
    "format": "--format",
    "since": "--since",
    "limit": "--limit",
    "paths": "PATH",
    "run_id": "RUN",
    "target": "TARGET",
    "tokens": "--tokens",
}


def _cli_hint(exc: "AkmError") -> str | None:
    """This front's advice for an error, else the core's own hint."""
    details = exc.details or {}
    if exc.code == "RUN_NOT_ACTIVE" and details.get("status") in ("failed", "blocked") and details.get("runId"):
        rid = details["runId"]
        return (
            f"`akm workflow status {rid}` says what moves it on: `akm workflow resume {rid}` (its current step is "
            f"retried as it is) or `akm workflow rewind {rid} --to STEP` (back to an earlier step), then "
            f"`akm workflow run {rid}`."
        )
    argument = details.get("argument")
    if argument in _FLAG_OF:
        return f"Check {_FLAG_OF[argument]}; `--help` on the command describes it."
    template = _CLI_HINTS.get(exc.code)
    if template is not None:
        try:
            return template.format(**details)
        except (KeyError, IndexError):
            pass
    return exc.hint
