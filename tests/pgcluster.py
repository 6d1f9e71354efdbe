"""A throwaway PostgreSQL cluster on 127.0.0.1 for the tests of the PostgreSQL journal.

Why a real server: the races the PostgreSQL journal must survive (design notes, postgres.md §2.5, §2.9) only
happen against a real server under READ COMMITTED, so nothing here is simulated. The cluster is initdb'd into
a temporary directory, listens on a free loopback port with SCRAM-SHA-256 password auth (so the tests exercise
the same handshake a real deployment uses), and is stopped and deleted when the test session ends.
As root (CI runs as root) the server runs as the `postgres` user through `runuser`, because PostgreSQL
refuses to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

USER = "akm"


@dataclass(frozen=True)
class Cluster:
    """A running server: where to reach it and with which credentials."""

    host: str
    port: int
    user: str
    password: str
    database: str
    # where the server lives, for `restart` (empty on a Cluster built by hand)
    bindir: str = ""
    data: str = ""
    log: str = ""

    def url(self, **query: str) -> str:
        """A `postgresql://` URL for this server (query options such as sslmode appended)."""
        tail = "&".join(f"{k}={v}" for k, v in query.items())
        base = f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"
        return f"{base}?{tail}" if tail else base


def find_bindir() -> Path | None:
    """Where initdb and pg_ctl live: $AKM_TEST_PG_BINDIR, pg_config, Debian's layout, then PATH."""
    candidates: list[str] = []
    if os.environ.get("AKM_TEST_PG_BINDIR"):
        candidates.append(os.environ["AKM_TEST_PG_BINDIR"])
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=30)
            candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    candidates += ["/usr/local/bin", "/opt/homebrew/bin", "/usr/bin"]
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as `postgres` through runuser then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def _run(argv: list[str], timeout: float = 300) -> None:
    proc = subprocess.run(_as_server_user(argv), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


@contextlib.contextmanager
def cluster(bindir: Path, settings: dict[str, str] | None = None) -> Iterator[Cluster]:
    """Start a fresh cluster, yield how to reach it, stop and delete it afterwards.

    `settings`: more server settings (`-c name=value`), e.g. `shared_preload_libraries` for a bench that reads
    pg_stat_statements."""
    tmp = Path(tempfile.mkdtemp(prefix="akm-pg-"))
    data, sock, log = tmp / "data", tmp / "sock", tmp / "server.log"
    sock.mkdir()
    password = secrets.token_hex(12)
    pwfile = tmp / "pw"
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres")
        shutil.chown(sock, "postgres")
        shutil.chown(pwfile, "postgres")
    started = False
    try:
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                "--pwfile",
                str(pwfile),
                "--auth-host=scram-sha-256",
                "--auth-local=scram-sha-256",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        pwfile.unlink()
        port = _free_port()
        opts = (
            f"-k {sock} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
            " -c full_page_writes=off -c password_encryption=scram-sha-256 -c max_connections=100"
        )
        opts += "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        _run([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "120", "-o", opts, "start"])
        started = True
        yield Cluster(
            host="127.0.0.1",
            port=port,
            user=USER,
            password=password,
            database="postgres",
            bindir=str(bindir),
            data=str(data),
            log=str(log),
        )
    finally:
        if started:
            with contextlib.suppress(Exception):
                _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


def restart(c: Cluster, mode: str = "fast") -> None:
    """Stop and start the server again on the same port (`immediate` is a crash); every session ends.

    Tests that restart should use a cluster of their own (`cluster()`), not the session's shared one.
    """
    pg_ctl = str(Path(c.bindir) / "pg_ctl")
    _run([pg_ctl, "-D", c.data, "-l", c.log, "-m", mode, "-w", "-t", "120", "restart"], timeout=300)


@contextlib.contextmanager
def fresh_schema(c: Cluster) -> Iterator[str]:
    """A journal URL naming a schema of its own on `c` (created by akm on first open), dropped afterwards.

    One schema per test keeps tests apart on one server, as one data dir per test does for SQLite.
    """
    name = "t_" + secrets.token_hex(6)
    try:
        yield c.url(schema=name)
    finally:
        from akm.store.postgres.connect import connect, parse_url

        with contextlib.suppress(Exception):
            con = connect(parse_url(c.url()))
            try:
                con.run("SET lock_timeout = '10s'")
                con.run(f"DROP SCHEMA IF EXISTS {name} CASCADE")
            finally:
                con.close()
