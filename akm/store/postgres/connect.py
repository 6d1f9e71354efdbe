"""Open a pg8000 connection from a `postgresql://` URL, with clear coded errors.

Why a module of its own: the URL is the whole user-facing surface of the PostgreSQL journal (host, port,
database, credentials, TLS), and its failures (server down, wrong password, bad URL) must reach the user as
stable codes, never as a driver traceback. pg8000 is imported here only, and only when a connection is made.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from akm.errors import JournalError

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
        code="JOURNAL_URL_INVALID",
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
    password = unquote(parts.password) if parts.password is not None else None
    if password is not None and (name := password_ref(password)) is not None:
        if name not in env:
            raise _bad_url(f"the journal URL's password refers to ${{{name}}}, which is not set")
        password = env[name]
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    sslmode = query.get("sslmode", "prefer")
    if sslmode not in SSLMODES:
        raise _bad_url(f"sslmode={sslmode!r} is not one of {', '.join(SSLMODES)}")
    database = unquote(parts.path.lstrip("/")) or user
    schema = query.get("schema", "akm")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
        raise _bad_url(f"schema={schema!r} must be a lower-case SQL identifier")
    return Target(parts.hostname, port, database, user, password, sslmode, query.get("sslrootcert"), schema)


def _ssl_context(target: Target) -> ssl.SSLContext | bool | None:
    """pg8000's ssl_context for a libpq-style sslmode (`prefer` is treated as `disable`: no silent fallback)."""
    if target.sslmode in ("disable", "prefer"):
        return None
    ctx = ssl.create_default_context(cafile=target.sslrootcert)
    if target.sslmode == "require":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif target.sslmode == "verify-ca":
        ctx.check_hostname = False
    return ctx


def connect(target: Target, timeout: float = 30.0) -> Any:
    """A pg8000 native connection (autocommit, as pg8000.native is) or a coded JournalError."""
    import pg8000.native  # lazily: the SQLite journal never loads the driver

    try:
        return pg8000.native.Connection(
            target.user,
            host=target.host,
            port=target.port,
            database=target.database,
            password=target.password,
            ssl_context=_ssl_context(target),
            timeout=timeout,
            application_name="akm",
        )
    except pg8000.native.InterfaceError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ssl.SSLError) or "ssl" in str(exc).lower():
            raise JournalError(
                f"TLS to the journal server {target.shown} failed: {exc}",
                code="JOURNAL_TLS_FAILED",
                hint="Check sslmode and sslrootcert in the journal URL, and that the server has TLS enabled.",
            ) from None
        if isinstance(cause, (OSError, socket.timeout)) or "connect" in str(exc).lower():
            raise JournalError(
                f"the journal server {target.shown} is unreachable: {exc}",
                code="JOURNAL_UNREACHABLE",
                hint="Check that PostgreSQL runs and accepts TCP connections at that host and port.",
            ) from None
        raise JournalError(f"cannot connect to the journal server {target.shown}: {exc}") from None
    except pg8000.native.DatabaseError as exc:
        state = _sqlstate(exc)
        if state in ("28P01", "28000"):
            raise JournalError(
                f"the journal server {target.shown} refused the credentials of user {target.user!r}",
                code="JOURNAL_AUTH_FAILED",
                hint="Check the user and password of the journal URL (a ${ENV_VAR} password must be set).",
            ) from None
        raise JournalError(f"cannot connect to the journal server {target.shown}: {_message(exc)}") from None


def _sqlstate(exc: Exception) -> str | None:
    arg = exc.args[0] if exc.args else None
    return arg.get("C") if isinstance(arg, dict) else None


def _message(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else None
    return str(arg.get("M", arg)) if isinstance(arg, dict) else str(exc)


def sqlstate(exc: Exception) -> str | None:
    """The SQLSTATE of a pg8000 DatabaseError (None for anything else)."""
    return _sqlstate(exc)
