"""Open a pg8000 connection from a `postgresql://` URL, with clear coded errors and bounded waits.

Why a module of its own: the URL is the whole user-facing surface of the PostgreSQL journal (host, port,
database, credentials, TLS), and its failures (server down, wrong password, bad URL) must reach the user as
stable codes, never as a driver traceback. pg8000 is imported here only, and only when a connection is made.

Every connection akm opens bounds how long anything on it can wait, because a network that breaks
without telling anyone — a partition, a middlebox that forgets the flow, a pooler — otherwise leaves both
ends waiting for hours:

* on the server, set in the startup packet (no extra round trip): `lock_timeout` (a row or advisory lock
  akm waits for), `idle_in_transaction_session_timeout` (a session of akm's that stopped talking in the
  middle of a transaction is ended and its locks released: no run row held for minutes by a dead client),
  `statement_timeout`, and TCP keepalives of the server's side (`tcp_keepalives_*`, `tcp_user_timeout`), so
  the server notices a vanished client within about half a minute instead of the OS's two hours;
* on the client: TCP keepalives and `TCP_USER_TIMEOUT` on the socket, and a socket timeout longer than the
  server's own limits (the server gives up first and says why; the socket timeout only ends a stall);
* `application_name` names the connection's role (`akm`, `akm-liveness`, `akm-listen`, `akm-notify`), so
  an operator (and the fault tests) can tell akm's sessions apart in `pg_stat_activity`.

A failure of the connection itself (reset, stalled, ended by the server) is `connection_fault`; the journal
turns it into JOURNAL_CONNECTION_LOST, a lock or statement timeout into JOURNAL_BUSY (`fault_error`).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from akm.codes import Code
from akm.errors import JournalError

# Server-side limits of every akm session (seconds). A waiter's lock_timeout outlasts the idle-in-transaction
# limit, so a waiter behind a session that went silent mid-transaction gets the lock once the server ended it.
IDLE_IN_TRANSACTION_S = 15
LOCK_TIMEOUT_S = 20
STATEMENT_TIMEOUT_S = 60
# TCP keepalives, both ends: first probe after this much silence, then every interval, dead after count.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
TCP_USER_TIMEOUT_S = 30  # sent data unacknowledged this long: the connection is dead
SOCKET_TIMEOUT_S = STATEMENT_TIMEOUT_S + 15  # a read that waits longer is a stall: the server would have answered
CONNECT_TIMEOUT_S = 15  # TCP connect, TLS and authentication of a new connection

_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
SSLMODES = ("disable", "prefer", "require", "verify-ca", "verify-full")


def password_ref(password: str) -> str | None:
    """The variable a URL's (unquoted) password names as `${NAME}`, or None when it is not such a reference.

    The one rule for both where a URL is stored (config `journal.url`, which refuses anything else) and where
    it is used (`parse_url`, which reads the variable).
    """
    m = _ENV_REF.match(password)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Target:
    """Where and as whom to connect; the password is resolved (never printed: `shown` masks it)."""

    host: str
    port: int
    database: str
    user: str
    password: str | None
    sslmode: str
    sslrootcert: str | None
    schema: str

    @property
    def shown(self) -> str:
        """The URL without its password, for messages."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"


def _bad_url(message: str) -> JournalError:
    return JournalError(
        message,
        code=Code.JOURNAL_URL_INVALID,
        hint="Use postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require]; the password may be "
        "a ${ENV_VAR} reference.",
    )


def parse_url(url: str, env: dict[str, str] | None = None) -> Target:
    """Parse a `postgresql://` URL; a password written `${NAME}` is read from the environment variable NAME."""
    env = dict(os.environ) if env is None else env
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise _bad_url(f"the journal URL must start with postgresql:// (got scheme {parts.scheme!r})")
    if not parts.hostname:
        raise _bad_url("the journal URL names no host")
    try:
        port = parts.port or 5432
    except ValueError as exc:
        raise _bad_url(f"the journal URL has an invalid port: {exc}") from None
    user = unquote(parts.username or "") or env.get("USER", "postgres")
    password = _password(parts.password, env)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    sslmode = query.get("sslmode", "prefer")
    if sslmode not in SSLMODES:
        raise _bad_url(f"sslmode={sslmode!r} is not one of {', '.join(SSLMODES)}")
    database = unquote(parts.path.lstrip("/")) or user
    schema = query.get("schema", "akm")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
        raise _bad_url(f"schema={schema!r} must be a lower-case SQL identifier")
    return Target(parts.hostname, port, database, user, password, sslmode, query.get("sslrootcert"), schema)


def _password(written: str | None, env: dict[str, str]) -> str | None:
    """The URL's password: as written (unquoted), or the environment variable a `${NAME}` names."""
    password = unquote(written) if written is not None else None
    if password is not None and (name := password_ref(password)) is not None:
        if name not in env:
            raise _bad_url(f"the journal URL's password refers to ${{{name}}}, which is not set")
        password = env[name]
    return password


def _ssl_context(target: Target) -> ssl.SSLContext | bool:
    """pg8000's ssl_context for a libpq-style sslmode (`prefer` is treated as `disable`: no silent fallback).

    Without TLS it is `False`, not pg8000's default `None`: that one asks the server for TLS first and takes it
    unverified when offered (a silent `prefer`), and builds a default context for it, loading the system's CA
    bundle — tens of milliseconds of CPU and one more round trip on every connection a pool opens."""
    if target.sslmode in ("disable", "prefer"):
        return False
    ctx = ssl.create_default_context(cafile=target.sslrootcert)
    if target.sslmode == "require":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif target.sslmode == "verify-ca":
        ctx.check_hostname = False
    return ctx


def session_settings(server_version: int) -> dict[str, str]:
    """The server-side settings every akm session starts with, for a server of `server_version`
    (`server_version_num`, e.g. 150004); the ones an older server lacks are left out."""
    settings = {
        "TimeZone": "UTC",
        "lock_timeout": f"{LOCK_TIMEOUT_S}s",
        "idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION_S}s",
        "statement_timeout": f"{STATEMENT_TIMEOUT_S}s",
        "tcp_keepalives_idle": str(KEEPALIVE_IDLE_S),
        "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_S),
        "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    }
    if server_version >= 120000:
        settings["tcp_user_timeout"] = str(TCP_USER_TIMEOUT_S * 1000)
    if server_version >= 140000:  # a backend waiting on a lock notices a client that went away
        settings["client_connection_check_interval"] = "2s"
    return settings


def _server_version(con: Any) -> int:
    """`server_version_num` from the version the server announced at start-up ("15.18 (Debian …)" → 150000)."""
    m = re.match(r"(\d+)(?:\.(\d+))?", str(con.parameter_statuses.get("server_version", "")))
    if m is None:
        return 0
    major, minor = int(m.group(1)), int(m.group(2) or 0)
    return major * 10000 if major >= 10 else major * 10000 + minor * 100


def _apply_settings(con: Any, search_path: str | None = None) -> None:
    """All of `session_settings` (and the `search_path`, when given) in one round trip and one statement
    (`set_config`, not the startup packet: poolers refuse unknown startup parameters; one statement rather than
    a SET each, which a server counts one by one)."""
    settings = session_settings(_server_version(con))
    if search_path is not None:
        settings["search_path"] = search_path
    calls = ", ".join(f"set_config('{k}', '{v}', false)" for k, v in settings.items())
    con.execute_simple(f"SELECT {calls}")


TIMESTAMPTZ_OID = 1184


def stamp_in(text: str) -> str:
    """A `timestamptz` as the server sends it to akm's sessions (TimeZone UTC, DateStyle ISO: `2026-12-07
    09:51:22.123+00`, the fraction optional) in the journal's format (`akm.store.clock.format_iso`: milliseconds,
    truncated), without the datetime pg8000 would parse it into only for akm to format it back — the rows a
    coordinator and its workers read carry several stamps each. Anything else goes the long way."""
    if len(text) >= 22 and text[10] == " " and text[13] == ":" and text.endswith("+00"):
        fraction = text[20:-3] if text[19] == "." else ""
        return f"{text[:10]}T{text[11:19]}.{(fraction + '000')[:3]}Z"
    from pg8000.converters import timestamptz_in

    from akm.store.clock import format_iso

    parsed = timestamptz_in(text)
    return parsed if isinstance(parsed, str) else format_iso(parsed)


def _socket_options(sock: Any) -> None:
    """No Nagle delay, TCP keepalives and a user timeout on the client's socket (where the OS has them).

    TCP_NODELAY (the server sets it on its side): pg8000 writes a message with a large parameter (a batch of
    queued units, a step's evidence) in more than one send, and Nagle's algorithm holds the last piece until the
    first is acknowledged — which a peer delaying its ACKs does after 40 ms, paid by that statement."""
    options = (
        ("TCP_NODELAY", socket.IPPROTO_TCP, 1),
        ("SO_KEEPALIVE", socket.SOL_SOCKET, 1),
        ("TCP_KEEPIDLE", socket.IPPROTO_TCP, KEEPALIVE_IDLE_S),
        ("TCP_KEEPALIVE", socket.IPPROTO_TCP, KEEPALIVE_IDLE_S),  # macOS's name for the idle time
        ("TCP_KEEPINTVL", socket.IPPROTO_TCP, KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", socket.IPPROTO_TCP, KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", socket.IPPROTO_TCP, TCP_USER_TIMEOUT_S * 1000),
    )
    for name, level, value in options:
        opt = getattr(socket, name, None)
        if opt is not None:
            try:
                sock.setsockopt(level, opt, value)
            except OSError:  # not on this socket type or OS: the server's keepalives still apply
                pass


def connect(target: Target, timeout: float | None = None, *, role: str = "akm", search_path: str | None = None) -> Any:
    """A pg8000 native connection (autocommit, as pg8000.native is) or a coded JournalError.

    `timeout` bounds every read and write on the socket (default SOCKET_TIMEOUT_S); making the connection
    (TCP, TLS, authentication) is bounded by CONNECT_TIMEOUT_S, or `timeout` when shorter: a server that
    cannot be reached is said so in seconds, not after a read timeout. `role` is the session's
    `application_name`; `search_path`, set with the session's settings (no round trip of its own).
    """
    read_timeout = SOCKET_TIMEOUT_S if timeout is None else timeout
    import pg8000.native  # lazily: the SQLite journal never loads the driver

    try:
        con = pg8000.native.Connection(
            target.user,
            host=target.host,
            port=target.port,
            database=target.database,
            password=target.password,
            ssl_context=_ssl_context(target),
            timeout=min(CONNECT_TIMEOUT_S, read_timeout),
            application_name=role,
        )
    except pg8000.native.InterfaceError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ssl.SSLError) or "ssl" in str(exc).lower():
            raise JournalError(
                f"TLS to the journal server {target.shown} failed: {exc}",
                code=Code.JOURNAL_TLS_FAILED,
                hint="Check sslmode and sslrootcert in the journal URL, and that the server has TLS enabled.",
            ) from None
        if isinstance(cause, (OSError, socket.timeout)) or "connect" in str(exc).lower():
            raise JournalError(
                f"the journal server {target.shown} is unreachable: {exc}",
                code=Code.JOURNAL_UNREACHABLE,
                hint="Check that PostgreSQL runs and accepts TCP connections at that host and port.",
            ) from None
        raise JournalError(f"cannot connect to the journal server {target.shown}: {exc}") from None
    except pg8000.native.DatabaseError as exc:
        state = _sqlstate(exc)
        if state in ("28P01", "28000"):
            raise JournalError(
                f"the journal server {target.shown} refused the credentials of user {target.user!r}",
                code=Code.JOURNAL_AUTH_FAILED,
                hint="Check the user and password of the journal URL (a ${ENV_VAR} password must be set).",
            ) from None
        raise JournalError(f"cannot connect to the journal server {target.shown}: {_message(exc)}") from None
    except OSError as exc:  # a socket failure pg8000 did not wrap (a reset or a timeout mid-handshake)
        raise JournalError(
            f"the journal server {target.shown} is unreachable: {exc}",
            code=Code.JOURNAL_UNREACHABLE,
            hint="Check that PostgreSQL runs and accepts TCP connections at that host and port.",
        ) from None
    try:
        _socket_options(con._usock)
        con.register_in_adapter(TIMESTAMPTZ_OID, stamp_in)
        _apply_settings(con, search_path)
        con._usock.settimeout(read_timeout)
    except Exception as exc:
        with contextlib.suppress(Exception):
            con.close()
        if connection_fault(exc):
            raise fault_error(exc, "connect", target.shown) from None
        raise JournalError(f"cannot set up a session on the journal server {target.shown}: {exc}") from None
    return con


# SQLSTATEs that mean the session itself is gone: the connection class (08), the server ending it
# (admin_shutdown when terminated, crash_shutdown, cannot_connect_now) and the idle-in-transaction limit.
_SESSION_GONE = ("57P01", "57P02", "57P03", "25P03")
# What the server's own limits answer: lock_timeout (lock_not_available) and statement_timeout (query_canceled).
_TIMED_OUT = ("55P03", "57014")


def connection_fault(exc: BaseException) -> bool:
    """Did `exc` come from the connection failing (reset, closed, stalled, ended by the server), rather than
    from an error the server reported about a statement? The driver's `network error`s, the socket errors it
    lets through (a timeout: `cannot read from timed out object` afterwards), and the SQLSTATEs of a session
    the server ended."""
    if isinstance(exc, (OSError, EOFError)):
        return True
    if not type(exc).__module__.startswith("pg8000"):
        return False
    state = _sqlstate(exc)
    if state is not None:
        return state.startswith("08") or state in _SESSION_GONE
    return type(exc).__name__ == "InterfaceError"


def lock_timed_out(exc: BaseException) -> bool:
    """The server gave up waiting (lock_timeout, statement_timeout)."""
    state = _sqlstate(exc)
    return type(exc).__module__.startswith("pg8000") and state is not None and state in _TIMED_OUT


def fault_error(exc: BaseException, what: str, shown: str) -> JournalError:
    """The coded error of a connection fault or a server-side timeout (see `connection_fault`)."""
    if lock_timed_out(exc):
        return JournalError(
            f"journal {what} on {shown} gave up waiting: {_message(exc)}",
            code=Code.JOURNAL_BUSY,
            hint=f"Another session held what this command needed for over {LOCK_TIMEOUT_S} s (for example one left "
            f"idle in a transaction by a broken connection, which the server ends after {IDLE_IN_TRANSACTION_S} s); "
            "nothing was written. Run the command again.",
        )
    detail = _message(exc) if _sqlstate(exc) else (str(exc) or type(exc).__name__)
    return JournalError(
        f"the connection to the journal server {shown} failed during {what}: {detail}",
        code=Code.JOURNAL_CONNECTION_LOST,
        hint="The network or the server dropped or stalled the connection; the transaction in flight was not "
        "committed (or, if it was, the journal shows it). Once the server is reachable, run the command again: a "
        "run resumes where its journal stands.",
    )


def _sqlstate(exc: BaseException) -> str | None:
    arg = exc.args[0] if exc.args else None
    return arg.get("C") if isinstance(arg, dict) else None


def _message(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else None
    return str(arg.get("M", arg)) if isinstance(arg, dict) else str(exc)


def sqlstate(exc: Exception) -> str | None:
    """The SQLSTATE of a pg8000 DatabaseError (None for anything else)."""
    return _sqlstate(exc)
