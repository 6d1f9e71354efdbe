"""Progress notifications of a waiting call: what the background driver reports, sent without holding it up,
and a heartbeat when nothing else was sent for `HEARTBEAT_S` (a client sees a long unit is alive, and which)."""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

import anyio

from akm.report.live import activity_text
from akm.report.timeline_svg import duration_text

# A waiting call says something at least this often (issue 37: at least every 10 s), even when no unit finished.
HEARTBEAT_S = 5.0


class ProgressReporter:
    """Sends a call's progress notifications without ever holding up the driver.

    The driver drops messages into the call's mailbox (`drives.Listener`); this reporter sends them from the
    call's own task, each with a short bound, so a client that stops reading stalls only its own call. MCP wants
    `progress` to increase with every notification: progress and total accumulate over the steps this call
    reports — a step of N units counts N + 1 (each unit, then the step's own finish), so for one step `progress`
    is units done and the step's finish is the last, highest tick.
    """

    def __init__(self, report: Callable[[float, float, str], Awaitable[None]] | None) -> None:
        self.report = report  # the SDK's `report_progress` of the call (a no-op without a progress token)
        self.offset = 0  # ticks of the steps finished earlier in this call
        self.step: str | None = None
        self.step_total = 0
        self.step_done = 0
        self.sent = 0.0
        self.gone = False
        self.between = 0  # activity reports and heartbeats since the last unit tick
        self.between_at = -1  # the units done when they started
        self.started = time.monotonic()
        self.last_at = self.started  # when a notification was last sent (or the call began)

    async def send(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            if self.gone:
                return
            if item["kind"] == "step_started":
                self._open(item["stepId"])
                self.step_total = item["total"]
                continue  # nothing finished yet: no tick
            if item["kind"] == "unit_activity":
                # between two unit ticks: a fraction that grows with each report, so progress still increases
                if item["stepId"] != self.step:
                    self._open(item["stepId"])
                value, total = self._between_ticks()
                a = item["activity"]
                message = (
                    f"step {item['stepId']}: {item['attemptId']} {activity_text(a)} "
                    f"({duration_text(a.get('elapsedS') or 0)})"
                )
                await self._report(value, total, message)
                continue
            if item["kind"] == "unit":
                if item["stepId"] != self.step or item["done"] <= self.step_done:
                    self._open(item["stepId"])  # another step, or another pass (gate loop) of this one
                self.step_done, self.step_total = item["done"], max(item["total"], self.step_total)
                value, total = self.offset + item["done"], self.offset + self.step_total + 1
                mark = "ok" if item["ok"] else f"failed ({item['failureReason']})"
                message = f"step {item['stepId']}: unit {item['done']}/{item['total']} {item['attemptId']} {mark}"
            else:
                if item["stepId"] != self.step:
                    self._open(item["stepId"])
                value = total = self.offset + self.step_total + 1
                message = f"step {item['stepId']} {item['status']}"
                self._close()
            await self._report(value, total, message)

    def due(self) -> bool:
        """Has nothing been sent for `HEARTBEAT_S`?"""
        return time.monotonic() - self.last_at >= HEARTBEAT_S

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    async def heartbeat(self, message: str) -> None:
        """A notification that only says the call is alive (`message`: the run, its step, the time waited): a
        fraction further between two unit ticks, as an agent CLI's activity is."""
        if self.gone:
            return
        value, total = self._between_ticks()
        await self._report(value, total, message)

    def _between_ticks(self) -> tuple[float, float]:
        """A value between the last unit tick and the next that grows with each call, so progress increases."""
        self.between = self.between + 1 if self.between_at == self.step_done else 1
        self.between_at = self.step_done
        value = self.offset + self.step_done + 1 - 1 / (self.between + 1)
        return value, self.offset + max(self.step_total, self.step_done + 1) + 1

    async def _report(self, value: float, total: float, message: str) -> None:
        if value <= self.sent:
            return  # progress must increase; a repeat carries nothing new
        self.sent = value
        self.last_at = time.monotonic()
        with anyio.move_on_after(2.0) as scope:
            try:
                if self.report is not None:
                    await self.report(value, total, message)
            except Exception:
                self.gone = True  # progress is advisory; a gone client must not fail the call
        if scope.cancelled_caught:
            self.gone = True  # the client is not reading: send nothing more on this call

    def _close(self) -> None:
        if self.step is not None:
            self.offset += self.step_total + 1
        self.step, self.step_total, self.step_done = None, 0, 0

    def _open(self, step: str) -> None:
        self._close()
        self.step = step
