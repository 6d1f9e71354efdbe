"""A page as headless Chromium lays it out and paints it: its text, element geometry and a screenshot.

`--dump-dom` says what markup the browser built, not whether a label fits its box. This drives Debian's
`chromium` over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages ending in NUL on
fds 3 and 4, so no websocket and no extra package), loads a file, asks the page for geometry with
`Runtime.evaluate` (the report itself has no script; the expression runs in the test's own world) and takes
a PNG screenshot, decoded here with zlib so a test can look at the pixels.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.test_report_html import CHROMIUM_FLAGS, chromium_bin

DEADLINE_S = 120.0


class _Pipe:
    """The DevTools protocol over Chromium's pipe: commands out on our fd 3, answers and events in on fd 4."""

    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int) -> None:
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self) -> dict[str, Any]:
        import select

        while b"\0" not in self.buf:
            ready, _, _ = select.select([self.inp], [], [], DEADLINE_S)
            if not ready:
                raise TimeoutError("chromium sent nothing for two minutes")
            chunk = os.read(self.inp, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe (exit {self.proc.poll()})")
            self.buf += chunk
        raw, _, self.buf = self.buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        while True:
            answer = self._read_message()
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_event(self, method: str) -> dict[str, Any]:
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message())


@dataclass
class Png:
    """A decoded screenshot: width, height and RGB rows."""

    width: int
    height: int
    rows: list[bytes]  # each row: width * 3 bytes, RGB

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        row = self.rows[y]
        return row[3 * x], row[3 * x + 1], row[3 * x + 2]

    def dark_pixels(self, left: float, top: float, right: float, bottom: float, below: int = 70) -> int:
        """Pixels in the rectangle darker than `below` on every channel (text ink, not lines or fills)."""
        count = 0
        for y in range(max(0, int(top)), min(self.height, int(bottom) + 1)):
            for x in range(max(0, int(left)), min(self.width, int(right) + 1)):
                r, g, b = self.pixel(x, y)
                if r < below and g < below and b < below:
                    count += 1
        return count


def decode_png(data: bytes) -> Png:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium's screenshots are) as RGB rows."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    i = 0
    for _ in range(height):
        kind, line = raw[i], bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b, c = prev[x], prev[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + ((a + b) >> 1)) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        prev = line
        rgb = line if channels == 3 else bytearray(v for k, v in enumerate(line) if k % 4 != 3)
        rows.append(bytes(rgb))
    return Png(width, height, rows)


@dataclass
class Rendered:
    """What the browser made of a page: the value of `probe` (a JS expression) and a full-page screenshot."""

    probe: Any
    screenshot: Png


def render(page: Path, probe: str, *, width: int = 1280, height: int = 900) -> Rendered:
    """Load `page` in headless Chromium at `width`×`height` CSS pixels (scale 1), evaluate `probe` (its value
    is returned as JSON), and screenshot the whole page."""
    with tempfile.TemporaryDirectory(prefix="akm-chromium-") as profile:
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()

        def wire() -> None:  # the child's fds 3 (it reads) and 4 (it writes); every other fd closes on exec
            read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)  # out of the way of 3 and 4
            os.dup2(read_end, 3)  # dup2 makes the copies inheritable
            os.dup2(write_end, 4)

        proc = subprocess.Popen(
            [
                chromium_bin(),
                *CHROMIUM_FLAGS,
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire,
            close_fds=False,  # the close would run after `wire` and take 3 and 4 with it
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        pipe = _Pipe(proc, to_browser_w, from_browser_r)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            pipe.call("Page.enable", session=session)
            pipe.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            pipe.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
            pipe.wait_event("Page.loadEventFired")
            value = pipe.call("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session=session)[
                "result"
            ].get("value")
            shot = pipe.call(
                "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session
            )
            png = decode_png(base64.b64decode(shot["data"]))
            try:
                pipe.call("Browser.close")
            except RuntimeError:
                pass
        finally:
            os.close(to_browser_w)
            os.close(from_browser_r)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return Rendered(probe=value, screenshot=png)
