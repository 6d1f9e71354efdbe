"""`akm mcp` spoken to in raw JSON-RPC lines, for tests that write the frames themselves.

The official client (`from mcp import Client`) hides the wire; these tests need it: malformed lines, ids of every
type, a 2026-07-28 envelope, the size of each answer line, a client that stops reading. Reading is pulled, never
done behind the test's back: stdout is read only while a test waits for a frame (with a deadline that holds even
when the server writes nothing), so a test can leave the pipe unread to play a client that never reads. Stderr is
drained by a thread so that a chatty server cannot block on it; it is shown when the server ends too early.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypeVar

from tests.helpers import ROOT

T = TypeVar("T")


def _minimal_env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AKM_DATA_DIR": str(tmp_path / "akm-data"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
    }


def server_env(tmp_path: Path, shiv_root: Path) -> dict[str, str]:
    """The stdio client passes a minimal environment: give the zipapp what it needs explicitly."""
    return {**_minimal_env(tmp_path), "SHIV_ROOT": str(shiv_root)}


def source_env(tmp_path: Path) -> dict[str, str]:
    """The same minimal environment for akm run from this checkout (`python -m akm mcp`)."""
    return {**_minimal_env(tmp_path), "PYTHONPATH": str(ROOT)}


def meta_2026(client: str, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `_meta` a 2026-07-28 client puts on every request in place of an `initialize` handshake."""
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": client, "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
    }


class McpWire:
    """One `akm mcp` process on pipes; every stdout line read must be a JSON-RPC frame (kept in `frames`, its
    raw bytes in `lines`), and waits fail after `timeout` seconds naming what was awaited."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, *, timeout: float = 120) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd
        )
        self.timeout = timeout
        self.frames: list[dict[str, Any]] = []
        self.lines: list[bytes] = []
        self.next_id = 0
        self._buffer = bytearray()
        self._closed_stdout = False
        self._stderr: list[bytes] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    @classmethod
    def built(cls, akm_bin: Path, env: dict[str, str], cwd: Path, **kw: Any) -> Self:
        """The built zipapp, `dist/akm mcp`."""
        return cls([str(akm_bin), "mcp"], env, cwd, **kw)

    @classmethod
    def from_source(cls, env: dict[str, str], cwd: Path, **kw: Any) -> Self:
        """This checkout's code, `python -m akm mcp` (give it `source_env`)."""
        return cls([sys.executable, "-m", "akm", "mcp"], env, cwd, **kw)

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(1 << 16), b""):  # type: ignore[union-attr]
            self._stderr.append(chunk)

    @property
    def stderr(self) -> str:
        """What the server wrote on stderr so far."""
        return b"".join(self._stderr).decode("utf-8", "replace")

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, *messages: dict[str, Any] | str) -> None:
        """Each message (a dict, or a line written as given) on a line of its own, in one write."""
        self.write(b"".join((m if isinstance(m, str) else json.dumps(m)).encode() + b"\n" for m in messages))

    def request(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        meta: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send a request with the next integer id (`meta` as its params' `_meta`) and return its answer."""
        self.next_id += 1
        rid = self.next_id
        if meta is not None:
            params = {**(params or {}), "_meta": meta}
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params else {})})
        return self.answer(rid, timeout, what=f"an answer to {method}")

    def initialize(self, version: str = "2025-06-18") -> dict[str, Any]:
        """The handshake of the protocols before 2026-07-28: `initialize`, then `notifications/initialized`."""
        init = self.request(
            "initialize",
            {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw-test", "version": "0"}},
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return init

    # ------------------------------------------------------------------ reading

    def answer(self, rid: Any, timeout: float | None = None, *, what: str | None = None) -> dict[str, Any]:
        """The frame whose id is `rid`, of the same JSON type (the id 1 is not the id "1")."""
        return self.wait_for(
            lambda f: "id" in f and f["id"] == rid and type(f["id"]) is type(rid),
            timeout,
            what=what or f"an answer to id {rid!r}",
        )

    def wait_for(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float | None = None, *, what: str = "a frame"
    ) -> dict[str, Any]:
        """The first frame, read already or still to come, for which `pred` holds."""
        return self.wait_until(lambda: next((f for f in self.frames if pred(f)), None), timeout, what=what)

    def wait_until(self, cond: Callable[[], T | None], timeout: float | None = None, *, what: str = "a frame") -> T:
        """Read frames until `cond()` (which looks at `frames`) returns something truthy, and return it."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not (value := cond()):
            self._read_line(deadline, what)
        return value

    def read_to_end(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Every frame until the server closes its stdout (it has ended, or is ending)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self._closed_stdout:
            self._read_line(deadline, "the server to close its stdout", at_end=True)
        return self.frames

    def line_of(self, frame: dict[str, Any]) -> bytes:
        """The raw line `frame` was read from (its trailing newline included)."""
        return next(line for f, line in zip(self.frames, self.lines, strict=True) if f is frame)

    def _read_line(self, deadline: float, what: str, *, at_end: bool = False) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if self._closed_stdout:
                if at_end:
                    return
                raise AssertionError(
                    f"the server closed stdout before {what}; frames: {self.frames}; stderr:\n{self.stderr}"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} in time; frames: {self.frames}")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                self._buffer += chunk
                self._closed_stdout = not chunk
        end = self._buffer.index(b"\n") + 1
        line = bytes(self._buffer[:end])
        del self._buffer[:end]
        frame = json.loads(line)  # anything that is not a JSON-RPC frame fails here
        assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0", line
        self.frames.append(frame)
        self.lines.append(line)

    # ------------------------------------------------------------------ ending

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        self.proc.kill()
        self.proc.wait(timeout=60)

    def close(self, *, gracefully: bool = False) -> None:
        """Kill the server if it still runs; `gracefully`: close its stdin and give it time to end first."""
        if self.proc.poll() is None and gracefully:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)
