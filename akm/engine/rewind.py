"""Taking a run back to a step: the engine's half of `workflow rewind` (spec/engine.md "Rewind and reuse").

The rewind itself is one store transaction (`akm.store.rewinds.rewind_run`); this module refuses a run the
engine could not drive afterwards (a corrupt plan or spine, `CORRUPT_RUN`) and waits, as a driver does, for
a report that holds the run for a moment while it finishes a step, instead of answering LEASE_HELD.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from akm.engine.state import load_run
from akm.errors import UsageError
from akm.ids import uuid4
from akm.store import rewinds as rewinds_store
from akm.store import runs as runs_store
from akm.store.journal import Journal
from akm.store.status import REPORT_LOCK_PREFIX

# As long as a driver waits for a report's finalize lock (akm.engine.drive.REPORT_LOCK_WAIT_S).
REPORT_LOCK_WAIT_S = 10.0


def rewind(
    db: Journal, run_id: str, to_step: str, *, redo: bool | Sequence[str] = False
) -> rewinds_store.RewindOutcome:
    """Reopen `to_step` and every later step of the run (see `rewinds.rewind_run`)."""
    load_run(db, run_id)  # CORRUPT_RUN (and RUN_NOT_FOUND) before anything is written
    deadline = time.monotonic() + REPORT_LOCK_WAIT_S
    while True:
        try:
            return rewinds_store.rewind_run(db, run_id, rewind_id=uuid4(), to_step=to_step, redo=redo)
        except UsageError as exc:
            holder = str((exc.details or {}).get("holder") or "")
            if exc.code != "LEASE_HELD" or not holder.startswith(REPORT_LOCK_PREFIX):
                raise
            seen = runs_store.read_lease(db, run_id)
            if seen is not None and not runs_store.wait_lease_change(db, run_id, seen, deadline):
                raise
