"""What one drive of a run returns (a light module: a re-run of a finished run needs only this)."""

from __future__ import annotations

from typing import Any

from akm.record import dataclass, field


@dataclass
class DriveResult:
    run_id: str
    executed: list[dict[str, Any]] = field(default_factory=list)
    steps_processed: int = 0
    done: bool = False
    aborted: bool = False
    abort_reason: str | None = None
    awaiting: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
