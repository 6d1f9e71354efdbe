"""The error-code vocabulary: every code akm can answer with, and what each means.

Kept apart from `akm.errors` so that building some eighty enum members costs nothing on the way to a
command's first output: every error is raised with a member (`UsageError(..., code=Code.LEASE_HELD)`; a test
refuses a code as a string literal), and a `StrEnum` member is its string on the wire and in the journal.
Modules that a short command loads (`workflow run`, `list`, `status`, `lint`) import `Code` where they raise,
so the enum is built only when an error is; the rest import it at the top.
spec/errors.md is generated from here (`python -m akm.codes > spec/errors.md`); tests/test_vocabulary.py
checks the file, that every code the source raises is a member, and that the fronts' hint tables key on members.
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    """Every error code akm can answer with: the one vocabulary of both fronts (spec/errors.md is generated
    from it; a test checks every code the source raises, and every hint table's key, is a member)."""

    # -- arguments, files and paths
    USAGE = "USAGE"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    UNKNOWN_FLAG = "UNKNOWN_FLAG"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    NOT_UTF8 = "NOT_UTF8"
    INVALID_PATH = "INVALID_PATH"
    INVALID_REF = "INVALID_REF"
    UNREADABLE_FILE = "UNREADABLE_FILE"
    NO_WORKFLOW_FILES = "NO_WORKFLOW_FILES"
    NOT_FOUND = "NOT_FOUND"
    WORKFLOW_NOT_FOUND = "WORKFLOW_NOT_FOUND"
    WORKFLOW_INVALID = "WORKFLOW_INVALID"
    NOT_LEGACY = "NOT_LEGACY"
    UPGRADE_FAILED = "UPGRADE_FAILED"
    # -- runs and the lease
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    RUN_ID_AMBIGUOUS = "RUN_ID_AMBIGUOUS"
    RUN_NOT_ACTIVE = "RUN_NOT_ACTIVE"
    RUN_ABANDONED = "RUN_ABANDONED"
    RUN_ALREADY_ACTIVE = "RUN_ALREADY_ACTIVE"
    RUN_ALREADY_FINISHED = "RUN_ALREADY_FINISHED"
    RUN_COMPLETED = "RUN_COMPLETED"
    PARAMS_ON_EXISTING_RUN = "PARAMS_ON_EXISTING_RUN"
    NEW_RUN_NEEDS_WORKFLOW = "NEW_RUN_NEEDS_WORKFLOW"
    CORRUPT_RUN = "CORRUPT_RUN"
    REPLAY_DIVERGED = "REPLAY_DIVERGED"
    LEASE_HELD = "LEASE_HELD"
    LEASE_LOST = "LEASE_LOST"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    STEP_NOT_FOUND = "STEP_NOT_FOUND"
    STEP_NOT_CURRENT = "STEP_NOT_CURRENT"
    STEP_NOT_PENDING = "STEP_NOT_PENDING"
    STEP_NOT_REACHED = "STEP_NOT_REACHED"
    # -- session reports
    UNKNOWN_UNIT = "UNKNOWN_UNIT"
    UNIT_NOT_REPORTABLE = "UNIT_NOT_REPORTABLE"
    STEP_MISMATCH = "STEP_MISMATCH"
    STEP_CLOSED = "STEP_CLOSED"
    STALE_REPORT = "STALE_REPORT"
    CLAIM_HELD = "CLAIM_HELD"
    CLAIM_EXPIRED = "CLAIM_EXPIRED"
    REPORT_CONFLICT = "REPORT_CONFLICT"
    UNIT_TERMINAL = "UNIT_TERMINAL"
    RESULT_REQUIRED = "RESULT_REQUIRED"
    RESULT_INVALID = "RESULT_INVALID"
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    VERDICT_REQUIRED = "VERDICT_REQUIRED"
    VERDICT_INVALID = "VERDICT_INVALID"
    NOT_AWAITING_VERDICT = "NOT_AWAITING_VERDICT"
    # -- configuration, environment and the journal
    INVALID_CONFIG = "INVALID_CONFIG"
    INVALID_CONFIG_FILE = "INVALID_CONFIG_FILE"
    CONFIG_LOCKED = "CONFIG_LOCKED"
    UNKNOWN_ENGINE = "UNKNOWN_ENGINE"
    ENGINE_MISMATCH = "ENGINE_MISMATCH"
    INVALID_ENV = "INVALID_ENV"
    NON_INTERACTIVE_REQUIRES_YES = "NON_INTERACTIVE_REQUIRES_YES"
    JOURNAL_ERROR = "JOURNAL_ERROR"
    JOURNAL_TOO_NEW = "JOURNAL_TOO_NEW"
    JOURNAL_FOREIGN = "JOURNAL_FOREIGN"
    JOURNAL_INCONSISTENT = "JOURNAL_INCONSISTENT"
    JOURNAL_URL_INVALID = "JOURNAL_URL_INVALID"
    JOURNAL_UNREACHABLE = "JOURNAL_UNREACHABLE"
    JOURNAL_AUTH_FAILED = "JOURNAL_AUTH_FAILED"
    JOURNAL_TLS_FAILED = "JOURNAL_TLS_FAILED"
    JOURNAL_CONNECTION_LOST = "JOURNAL_CONNECTION_LOST"
    JOURNAL_BUSY = "JOURNAL_BUSY"
    INVALID_TASK_METADATA = "INVALID_TASK_METADATA"
    # -- the single-file runtime (bundle/)
    UNSUPPORTED_PYTHON = "UNSUPPORTED_PYTHON"
    UNSUPPORTED_PLATFORM = "UNSUPPORTED_PLATFORM"
    NO_CACHE_DIR = "NO_CACHE_DIR"
    CORRUPT_BUNDLE = "CORRUPT_BUNDLE"
    NATIVE_LOAD_FAILED = "NATIVE_LOAD_FAILED"
    NO_LZMA = "NO_LZMA"
    NO_SCRIPT = "NO_SCRIPT"
    # -- the process's own streams
    MCP_NO_STDIO = "MCP_NO_STDIO"
    OUTPUT_FAILED = "OUTPUT_FAILED"
    # -- bugs
    INTERNAL = "INTERNAL"
    INTERNAL_LOOP = "INTERNAL_LOOP"
    ERROR = "ERROR"


CODE_MEANINGS: dict[Code, str] = {
    Code.USAGE: "the command line is malformed (a missing or unknown argument, a bad choice)",
    Code.INVALID_ARGUMENT: "an argument's value is wrong (a type, a range, an unknown or doubly given argument); "
    "`details.argument` names it — the same code on both fronts",
    Code.UNKNOWN_FLAG: "`workflow run` got a `--flag` that is neither a run flag nor a declared param",
    Code.UNKNOWN_TOOL: "an MCP call named a tool akm does not have (the message lists the tools)",
    Code.NOT_UTF8: "an argument, path or payload is not UTF-8 text",
    Code.INVALID_PATH: "a path or ref the OS cannot take (a NUL byte, over 4096 characters)",
    Code.INVALID_REF: "a `workflows/<name>` ref that is not a valid name",
    Code.UNREADABLE_FILE: "a file exists but cannot be read (permissions, a directory, a device)",
    Code.NO_WORKFLOW_FILES: "a directory given to `lint` holds no workflow files",
    Code.NOT_FOUND: "something named does not exist",
    Code.WORKFLOW_NOT_FOUND: "no workflow file or `workflows/<name>` matches the target",
    Code.WORKFLOW_INVALID: "the workflow file has lint errors (run `workflow lint` for each with its fix)",
    Code.NOT_LEGACY: "`workflow upgrade` was given a file already in the current format",
    Code.UPGRADE_FAILED: "a legacy file could not be converted (the message says what is missing)",
    Code.RUN_NOT_FOUND: "no run has this id (or prefix of one; `@last`: the project has no run yet)",
    Code.RUN_ID_AMBIGUOUS: "a run id prefix several runs share (the message lists them); give more of the id",
    Code.RUN_NOT_ACTIVE: "the run cannot be driven or reported in its state (failed, blocked, completed)",
    Code.RUN_ABANDONED: "the run was abandoned for good",
    Code.RUN_ALREADY_ACTIVE: "an identical run (same workflow, project and params) is already drivable",
    Code.RUN_ALREADY_FINISHED: "the run is already completed or abandoned (abandoning it again does nothing)",
    Code.RUN_COMPLETED: "the run is completed; it cannot be resumed",
    Code.PARAMS_ON_EXISTING_RUN: "params were given with a run id; params are fixed when a run starts",
    Code.NEW_RUN_NEEDS_WORKFLOW: "`new` was given with a run id; a new run starts from a workflow",
    Code.CORRUPT_RUN: "the run's journal rows are damaged; it cannot be driven",
    Code.REPLAY_DIVERGED: "a journaled unit's input hash differs from the frozen plan's; nothing was written",
    Code.LEASE_HELD: "another live driver holds the run's lease",
    Code.LEASE_LOST: "this driver's lease was taken over (fencing): it started nothing more and journaled nothing",
    Code.BUDGET_EXCEEDED: "a report would pass the run's token or unit budget; the step and run fail",
    Code.SHUTTING_DOWN: "the MCP server is ending its session and starts no run",
    Code.STEP_NOT_FOUND: "the run has no step of that id",
    Code.STEP_NOT_CURRENT: "the step named is not the run's current step",
    Code.STEP_NOT_PENDING: "the step named has already finished",
    Code.STEP_NOT_REACHED: "a rewind names a step the run has not reached (a later step, or one a route skipped)",
    Code.UNKNOWN_UNIT: "the unit id is not one of the current step's units",
    Code.UNIT_NOT_REPORTABLE: "the unit is run by akm itself (an exec or engine unit), not by the agent",
    Code.STEP_MISMATCH: "`expect_step` names a step the run has moved past",
    Code.STEP_CLOSED: "other content for a step that already finished (rewind the run to that step to change it)",
    Code.STALE_REPORT: "other content for a closed attempt or gate loop; never counted for a later one",
    Code.CLAIM_HELD: "another holder has a live claim on the unit",
    Code.CLAIM_EXPIRED: "this holder's claim on the unit expired; claim it again",
    Code.REPORT_CONFLICT: "a different result for a unit already completed, without `rerun`",
    Code.UNIT_TERMINAL: "the unit finished for good; `rerun` does it again",
    Code.RESULT_REQUIRED: "a completed report without a result",
    Code.RESULT_INVALID: "the result misses the unit's output schema (the errors are listed)",
    Code.RESULT_TOO_LARGE: "the result is over 16 MiB to read, or over the journal's 1 MiB to record",
    Code.VERDICT_REQUIRED: "a gate report without a verdict",
    Code.VERDICT_INVALID: "the verdict is not `{complete, missing, feedback}`",
    Code.NOT_AWAITING_VERDICT: "the run is not waiting for a verdict of that gate loop",
    Code.INVALID_CONFIG: "the merged engine configuration is invalid (the key and the rule are named)",
    Code.INVALID_CONFIG_FILE: "a config file is not valid JSON or not an object",
    Code.CONFIG_LOCKED: "another process is writing the config file",
    Code.UNKNOWN_ENGINE: "a workflow or default names an engine that is not configured",
    Code.ENGINE_MISMATCH: "an engine's kind does not fit the unit (an agent engine for an LLM unit, …)",
    Code.INVALID_ENV: "an akm environment variable has a value it cannot use (e.g. `AKM_LEASE_TTL_S`)",
    Code.NON_INTERACTIVE_REQUIRES_YES: "`akm setup` without a terminal needs `--yes` (or `--config`)",
    Code.JOURNAL_ERROR: "the journal cannot be opened or written",
    Code.JOURNAL_TOO_NEW: "the journal was migrated by a newer akm",
    Code.JOURNAL_FOREIGN: "the journal file is not akm's",
    Code.JOURNAL_INCONSISTENT: "the journal's migration ledger and schema disagree",
    Code.JOURNAL_URL_INVALID: "a PostgreSQL journal URL cannot be used (scheme, port, sslmode, unset `${ENV}`)",
    Code.JOURNAL_UNREACHABLE: "the PostgreSQL journal server does not answer at the URL's host and port",
    Code.JOURNAL_AUTH_FAILED: "the PostgreSQL journal server refused the URL's user or password",
    Code.JOURNAL_TLS_FAILED: "TLS to the PostgreSQL journal server failed (sslmode / certificate)",
    Code.JOURNAL_CONNECTION_LOST: "the connection to the PostgreSQL journal server broke, stalled or was ended "
    "mid-command; nothing half-written is kept and the run stays resumable",
    Code.JOURNAL_BUSY: "the PostgreSQL journal server gave up waiting for a lock or a statement (lock_timeout, "
    "statement_timeout); nothing was written",
    Code.INVALID_TASK_METADATA: "an invocation-history row has metadata akm cannot read",
    Code.UNSUPPORTED_PYTHON: "`dist/akm` needs CPython 3.11+",
    Code.UNSUPPORTED_PLATFORM: "`dist/akm` carries no native code for this OS, machine or interpreter",
    Code.NO_CACHE_DIR: "no writable cache directory for the native code (set `AKM_CACHE_DIR`)",
    Code.CORRUPT_BUNDLE: "the archive failed its integrity checks (download or build it again)",
    Code.NATIVE_LOAD_FAILED: "a bundled native extension could not be loaded",
    Code.NO_LZMA: "this Python lacks the lzma module the archive's native code is packed with",
    Code.NO_SCRIPT: "`AKM_BUNDLE_EXEC` names a script that cannot be read",
    Code.MCP_NO_STDIO: "`akm mcp` was started with stdin or stdout closed; it speaks MCP over them",
    Code.OUTPUT_FAILED: "what a command printed could not be written whole to stdout: a full disk, an I/O error "
    "(120 is CPython's status when its last flush fails; a failed command keeps its own). A reader that stops "
    "reading (`akm … \\| head`) is not a failure",
    Code.INTERNAL: "a bug in akm (`AKM_DEBUG=1` shows the traceback)",
    Code.INTERNAL_LOOP: "a step decision did not converge (a bug in akm)",
    Code.ERROR: "the generic code of an error that carries no more specific one",
}


def render_errors_md() -> str:
    """spec/errors.md, generated from `Code` (tests/test_vocabulary.py checks the file matches)."""
    from akm.errors import exit_status_of

    lines = [
        "# Error codes",
        "",
        "Generated from `akm.codes.Code` (`python -m akm.codes > spec/errors.md`); a test keeps them equal.",
        "Every error prints `error[CODE]: message` (a JSON object with `--format json`; an MCP tool error with",
        "the code in its text and `exitCode`) and exits with its code's status — one rule, `akm.errors.EXIT_BY_CODE`:",
        "1 what was named does not exist, 2 the request was refused and nothing changed, 70 a bug, 78 the",
        'configuration or the environment, 120 the output could not be written (README, "Exit status").',
        "",
        "| code | exit | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{code.value}` | {exit_status_of(code.value)} | {CODE_MEANINGS[code]} |" for code in Code]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_errors_md())
