"""One error type for both fronts.

Every failure a user can cause is an `AkmError` with a stable `code`, a process
`exit_status` and an optional `hint`. The CLI prints it (text or JSON) and exits
with the status; the MCP server returns it as a tool error. Nothing else should
ever reach a user as a traceback.
"""

from __future__ import annotations

from typing import Any

# Exit statuses (documented in spec/engine.md).
EXIT_OK = 0
EXIT_FAILED = 1  # run failed / blocked / gate rejected / not found / lint errors
EXIT_USAGE = 2  # bad input: flags, files, corrupt state, lease held
EXIT_INTERNAL = 70
EXIT_OUTPUT = 120  # the output could not be written whole (a full disk): CPython's status for a failed flush
EXIT_CONFIG = 78
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
EXIT_SIGHUP = 129


class AkmError(Exception):
    """A user-facing failure with a stable code."""

    code: str = "ERROR"
    exit_status: int = EXIT_FAILED

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        hint: str | None = None,
        exit_status: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if exit_status is not None:
            self.exit_status = exit_status
        self.hint = hint
        self.details = details or {}

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
    exit_status = EXIT_USAGE


class NotFoundError(AkmError):
    """A run, workflow or step that does not exist (exit 1)."""

    code = "NOT_FOUND"
    exit_status = EXIT_FAILED


class ConfigError(AkmError):
    """Engine configuration is missing or invalid (exit 78)."""

    code = "INVALID_CONFIG"
    exit_status = EXIT_CONFIG


class JournalError(AkmError):
    """The SQLite journal could not be opened, read or written (exit 78: the environment, not a bug)."""

    code = "JOURNAL_ERROR"
    exit_status = EXIT_CONFIG
