"""One error type for both fronts.

Every failure a user can cause is an `AkmError` with a stable `code`, a process
`exit_status` and an optional `hint`. The CLI prints it (text or JSON) and exits
with the status; the MCP server returns it as a tool error. Nothing else should
ever reach a user as a traceback.
"""

from __future__ import annotations

from typing import Any

# Exit statuses (README "Exit status", spec/engine.md §6; spec/errors.md lists every code's).
EXIT_OK = 0
EXIT_FAILED = 1  # run failed / blocked / timed out; lint errors; what was named does not exist
EXIT_USAGE = 2  # refused, nothing changed: malformed or invalid input, or not possible in the run's state now
EXIT_INTERNAL = 70
EXIT_OUTPUT = 120  # the output could not be written whole (a full disk): CPython's status for a failed flush
EXIT_CONFIG = 78
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
EXIT_SIGHUP = 129

# The one rule: an error's exit status is its code's, wherever it is raised. Codes not listed exit 2 — the
# request was refused and nothing changed: malformed or invalid input, or something the run's state does not
# allow now (another driver holds it, it is not active, a report conflicts). Plain strings, so that the
# errors every command can raise cost no enum (`akm.codes` has the vocabulary and renders this table).
EXIT_BY_CODE: dict[str, int] = {
    # 1: what was named does not exist (as upstream: `workflow status <unknown id>` exits 1), or a failure
    # that carries no more specific code
    **dict.fromkeys(("NOT_FOUND", "RUN_NOT_FOUND", "WORKFLOW_NOT_FOUND", "STEP_NOT_FOUND", "ERROR"), EXIT_FAILED),
    # 78: the configuration or the environment — the config, akm's environment variables, the journal, the
    # single-file runtime — not the request
    **dict.fromkeys(
        (
            "INVALID_CONFIG",
            "INVALID_CONFIG_FILE",
            "CONFIG_LOCKED",
            "UNKNOWN_ENGINE",
            "ENGINE_MISMATCH",
            "INVALID_ENV",
            "JOURNAL_ERROR",
            "JOURNAL_TOO_NEW",
            "JOURNAL_FOREIGN",
            "JOURNAL_INCONSISTENT",
            "JOURNAL_URL_INVALID",
            "JOURNAL_UNREACHABLE",
            "JOURNAL_AUTH_FAILED",
            "JOURNAL_TLS_FAILED",
            "JOURNAL_CONNECTION_LOST",
            "JOURNAL_BUSY",
            "UNSUPPORTED_PYTHON",
            "UNSUPPORTED_PLATFORM",
            "NO_CACHE_DIR",
            "CORRUPT_BUNDLE",
            "NATIVE_LOAD_FAILED",
            "NO_LZMA",
            "NO_SCRIPT",
        ),
        EXIT_CONFIG,
    ),
    # 70: a bug in akm
    **dict.fromkeys(("INTERNAL", "INTERNAL_LOOP"), EXIT_INTERNAL),
    "OUTPUT_FAILED": EXIT_OUTPUT,
}


def exit_status_of(code: str) -> int:
    """The exit status of an error code (the one rule above)."""
    return EXIT_BY_CODE.get(code, EXIT_USAGE)


class AkmError(Exception):
    """A user-facing failure with a stable code; its exit status is the code's (`exit_status_of`)."""

    code: str = "ERROR"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        hint: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.hint = hint
        self.details = details or {}

    @property
    def exit_status(self) -> int:
        return exit_status_of(self.code)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": False, "code": self.code, "error": self.message}
        if self.hint:
            out["hint"] = self.hint
        if self.details:
            out["details"] = self.details
        return out


class UsageError(AkmError):
    """The caller asked for something malformed or impossible right now (exit 2)."""

    code = "USAGE"


class InternalError(AkmError):
    """A state akm cannot reach unless it has a bug, such as a step decision that never settles (exit 70):
    answered with its code like any error, not as the caller's mistake."""

    code = "INTERNAL"


class NotFoundError(AkmError):
    """A run, workflow or step that does not exist (exit 1)."""

    code = "NOT_FOUND"


class ConfigError(AkmError):
    """Engine configuration is missing or invalid (exit 78)."""

    code = "INVALID_CONFIG"


class JournalError(AkmError):
    """The SQLite journal could not be opened, read or written (exit 78: the environment, not a bug)."""

    code = "JOURNAL_ERROR"
