"""The journal's timestamp format: fixed-width ISO-8601 UTC with milliseconds and `Z`.

Why a module of its own: both journals (store/sqlite, store/postgres) write and read stamps in this one
text form, so lease and claim expiries compare as strings in Python and in SQLite alike, and every front
shows the same text whatever the backend. `now_iso` is the *host* clock; a journal's own clock is
`Journal.now` (the host's on SQLite, the server's on PostgreSQL).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

_second_cache: dict[int, str] = {}


def now_iso(offset_s: float = 0.0) -> str:
    """UTC now (+ offset seconds) as `YYYY-MM-DDTHH:MM:SS.mmmZ` — fixed width, string-comparable.

    Every journal write stamps a row, so this is on the per-unit path: the
    `YYYY-MM-DDTHH:MM:SS` part is formatted once per second and cached (the
    same text `format_iso` gives). A few seconds are kept, not one: a unit's
    insert asks for now and for now + half a lease TTL, which would evict each
    other from a single entry.
    """
    moment = time.time() + offset_s
    second = int(moment)
    text = _second_cache.get(second)
    if text is None:
        if len(_second_cache) >= 8:
            _second_cache.clear()
        text = _second_cache[second] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{text}.{int((moment - second) * 1000):03d}Z"


def format_iso(moment: datetime) -> str:
    """Render an aware datetime in the journal's timestamp format."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_iso(text: str) -> datetime:
    """Inverse of `format_iso` (accepts any ISO form Python understands)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
