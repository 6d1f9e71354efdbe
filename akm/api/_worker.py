"""`run_worker`: one `akm worker` process, claiming queued units of active runs (akm.worker.loop)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from akm.api._args import _whole_number, _work_dir, parse_duration_ms
from akm.api._views import _open_db
from akm.codes import Code
from akm.engine.cancel import Cancellation
from akm.errors import UsageError

if TYPE_CHECKING:
    from akm.worker.loop import WorkerEvent, WorkerSummary

WORKER_KINDS = ("exec", "llm", "agent")
MAX_WORKER_CONCURRENCY = 1024  # units at once in one worker process (a thread each)


def parse_kinds(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """`exec,llm,agent` (or a list) as the unit kinds a worker takes; INVALID_ARGUMENT for anything else."""
    if value is None:
        return WORKER_KINDS
    parts = value.split(",") if isinstance(value, str) else list(value)
    names = [p.strip() if isinstance(p, str) else p for p in parts]
    kinds = tuple(dict.fromkeys(n for n in names if isinstance(n, str)))
    if not names or any(n not in WORKER_KINDS for n in names):
        raise UsageError(
            f"kinds must be a comma-separated list of {', '.join(WORKER_KINDS)}, not {value!r}.",
            code=Code.INVALID_ARGUMENT,
            details={"argument": "kinds"},
        )
    return kinds


def run_worker(
    *,
    kinds: str | list[str] | None = None,
    concurrency: int | str | None = None,
    project: str | None = None,
    idle_exit: int | str | None = None,
    poll: int | str | None = None,
    cancel: Cancellation | None = None,
    on_event: Callable[[WorkerEvent], None] | None = None,
) -> WorkerSummary:
    """Claim and run queued units until `cancel` trips (or, with `idle_exit`, after that long with nothing to do).

    `kinds`: which unit kinds this worker takes (default all three); `concurrency`: units at once (default: this
    host's limit, max(2, CPUs)); `project`: the project checkout units run in (default: the current directory's
    project); `idle_exit` / `poll`: ms or text (`30s`). `on_event` gets one `WorkerEvent` per claim, finish,
    rejection, release, refusal and sweep, from unit threads too.
    """
    from akm.engine.concurrency import host_concurrency_limit
    from akm.store import queue as queue_store
    from akm.worker.loop import Worker, WorkerOptions

    wanted = parse_kinds(kinds)
    try:
        width = (
            host_concurrency_limit()
            if concurrency is None
            else _whole_number(concurrency, "concurrency", 1, MAX_WORKER_CONCURRENCY)
        )
    except ValueError as exc:
        raise UsageError(f"{exc}.", code=Code.INVALID_ARGUMENT, details={"argument": "concurrency"}) from None
    idle_ms = None if idle_exit is None else parse_duration_ms(idle_exit, "idle_exit")
    poll_ms = 1000 if poll is None else max(10, parse_duration_ms(poll, "poll"))
    queue_store.claim_ttl_s()  # a bad AKM_WORKER_CLAIM_TTL_S is refused before anything is claimed
    root = _work_dir(project).resolve()
    if not root.is_dir():
        raise UsageError(
            f"the project directory {str(root)!r} does not exist.",
            code=Code.INVALID_ARGUMENT,
            details={"argument": "project"},
        )
    db = _open_db()
    try:
        opts = WorkerOptions(
            project_root=root,
            kinds=wanted,
            concurrency=width,
            poll_s=poll_ms / 1000.0,
            idle_exit_s=None if idle_ms is None else idle_ms / 1000.0,
            cancel=cancel or Cancellation(),
            on_event=on_event,
        )
        return Worker(db, opts).run()
    finally:
        db.close()
