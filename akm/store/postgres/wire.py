"""Each statement in one round trip — its first run on a connection and a transaction's BEGIN included.

pg8000's own paths cost more across a network: `prepare_statement` + `execute_named` is two round trips the
first time a connection runs a statement (parse and describe, then bind and execute), `execute_unnamed`
three, and a transaction's `BEGIN` one of its own. A run's start, a worker's first claims and a step's end are
chains of statements each run once, so at 10 ms of RTT those extra waits added up to a quarter of a second.

Here the messages of one statement go out in one flight and are answered in one: Parse (into a named
statement the connection keeps for its next runs) + Bind + Describe of the portal (its columns, read as they
come: the rows follow in the same answer) + Execute + Sync; a statement the connection has prepared already
is Bind + Execute + Sync, as pg8000 does it. A transaction's BEGIN, deferred until its first statement, is
a simple Query in front of that flight: the server answers it first, then the statement.

This uses pg8000's message writers (`send_PARSE`, `send_BIND`, `send_EXECUTE`, `handle_messages`): the
protocol is PostgreSQL's (v3, unchanged since 7.4); pg8000's lower bound is pinned in pyproject.toml and
tests/test_pg_wire.py runs each path against a real server.
"""

from __future__ import annotations

from typing import Any

UNNAMED = b"\x00"  # the unnamed statement: parsed again at each run (a connection's prepared set is full)


def run(
    raw: Any, statement: str, params: list[Any], prepared: tuple[bytes, Any, Any] | None, name: bytes, *, begin: bool
) -> Any:
    """Run `statement` with `params` (pg8000's text form, `make_params`) on `raw` in one round trip; returns
    pg8000's Context (columns, rows, row_count). `prepared`: (name, columns, input functions) of a statement
    this connection prepared earlier, else None: parsed now as `name` (kept by the server for its next runs,
    or UNNAMED). `begin`: send the transaction's BEGIN first, in the same flight."""
    from pg8000 import core

    opening = _send_begin(raw) if begin else None
    if prepared is not None:
        context = core.Context(statement, columns=prepared[1], input_funcs=prepared[2])
        raw.send_BIND(prepared[0], params)
    else:
        context = core.Context(statement)
        raw.send_PARSE(name, statement, ())
        raw.send_BIND(name, params)
        raw._send_message(core.DESCRIBE, core.PORTAL + core.NULL_BYTE)  # the unnamed portal's columns
    raw.send_EXECUTE()
    core._write(raw._sock, core.SYNC_MSG)
    core._flush(raw._sock)
    _receive(raw, opening, context)
    return context


def query(raw: Any, sql: str, **params: Any) -> list[list[Any]]:
    """pg8000 native's `Connection.run(sql, **params)` (`:name` parameters) in one round trip — pg8000 takes three
    for a statement with parameters — for akm's connections outside a journal's pool: the liveness session's
    probe every second, the migration ledger's check at each open, a notifier's NOTIFY. Returns the rows (empty when
    none)."""
    from pg8000.converters import make_params
    from pg8000.native import to_statement

    statement, make_vals = to_statement(sql)
    context = run(raw, statement, make_params(raw.py_types, make_vals(params)), None, UNNAMED, begin=False)
    return list(context.rows or [])


def simple(raw: Any, sql: str, *, begin: bool) -> None:
    """A statement without parameters (COMMIT, SET …) as a simple Query, after the deferred BEGIN if `begin`."""
    from pg8000 import core

    opening = _send_begin(raw) if begin else None
    context = core.Context(sql)
    raw.send_QUERY(sql)
    core._flush(raw._sock)
    _receive(raw, opening, context)


def _send_begin(raw: Any) -> Any:
    from pg8000 import core

    raw.send_QUERY("BEGIN")
    return core.Context("BEGIN")


def _receive(raw: Any, opening: Any, context: Any) -> None:
    """Read every answer of the flight (each ends with ReadyForQuery), then raise the first error: an answer
    left unread would be taken for the next statement's. An error the server sent is raised by pg8000 once
    its answer was read to the end (it is the context's `error`); any other (the socket's) ends the reading."""
    failure: BaseException | None = None
    for ctx in (opening, context):
        if ctx is None:
            continue
        try:
            raw.handle_messages(ctx)
        except Exception as exc:
            failure = failure or exc
            if ctx.error is not exc:
                break
    if failure is not None:
        raise failure
