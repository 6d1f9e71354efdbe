"""Plain terminal prompts for the setup wizard: arrow-key selects, text with defaults and validation, yes/no.

Why not a prompt library: the wizard needs three widgets, and akm ships as one
zipapp that must stay small and start fast. prompt_toolkit (the well-kept
choice) adds about 1 MB to the archive once compiled, plus wcwidth, and 0.2 s
to import; these widgets need termios (or msvcrt on Windows) and ANSI escapes.

Behaviour:

* `select`: ↑/↓ (or k/j, or a digit) move, Enter picks, the default starts
  highlighted. Without raw key input (Windows without msvcrt, odd terminals) it
  falls back to typing the option's number.
* `text`: the terminal's own line editing (cooked mode); Enter on an empty line
  takes the default; `validate` returns an error message to re-ask.
* `confirm`: y/n, Enter takes the default.
* Ctrl-C raises `Cancelled` from any prompt (so does Ctrl-D);
  the terminal is always restored. The wizard writes only after the last
  question, so cancelling leaves no file half-written.

Output goes to the stream given (stdout); color only when it is a TTY and
`NO_COLOR` is unset.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TextIO


class Cancelled(Exception):
    """The user pressed Ctrl-C (or closed input): stop without writing anything."""


@dataclass
class Option:
    value: Any
    label: str
    hint: str = ""


class Terminal:
    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.out = stdout or sys.stdout
        enc = (getattr(self.out, "encoding", None) or "").lower()
        self.unicode = "utf" in enc
        self.color = self.out.isatty() and not os.environ.get("NO_COLOR")
        self.pointer = "❯" if self.unicode else ">"
        self.tick = "✔" if self.unicode else "+"
        self.cross = "✘" if self.unicode else "x"
        self.bullet = "•" if self.unicode else "-"

    # ------------------------------------------------------------------ output

    def _style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self._style(text, "1")

    def dim(self, text: str) -> str:
        return self._style(text, "2")

    def green(self, text: str) -> str:
        return self._style(text, "32")

    def yellow(self, text: str) -> str:
        return self._style(text, "33")

    def cyan(self, text: str) -> str:
        return self._style(text, "36")

    def write(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def heading(self, text: str) -> None:
        self.write()
        self.write(self.bold(text))

    def ok(self, text: str) -> None:
        self.write(f"{self.green(self.tick)} {text}")

    def warn(self, text: str) -> None:
        self.write(f"{self.yellow('!')} {text}")

    def status(self, text: str) -> None:
        """A line that the next `done`/`ok` replaces (an in-progress note)."""
        self.out.write(self.dim(text) + ("\r" if self.out.isatty() else "\n"))
        self.out.flush()

    def clear_line(self) -> None:
        if self.out.isatty():
            self.out.write("\x1b[2K\r")
            self.out.flush()

    # ------------------------------------------------------------------ keys

    def _raw_keys(self) -> "_KeyReader | None":
        if not self.stdin.isatty():
            return None
        try:
            return _KeyReader(self.stdin)
        except (ImportError, OSError, ValueError):
            return None

    # ------------------------------------------------------------------ widgets

    def select(self, message: str, options: Sequence[Option], default: int = 0) -> Any:
        if not options:
            raise ValueError("select needs at least one option")
        index = max(0, min(default, len(options) - 1))
        reader = self._raw_keys()
        if reader is None:
            return self._select_by_number(message, options, index)
        keys = "(↑/↓ and Enter)" if self.unicode else "(up/down, Enter)"
        self.write(f"{self.cyan('?')} {self.bold(message)} {self.dim(keys)}")
        header_lines = self._rows(f"? {message} {keys}")
        self.out.write("\x1b[?25l")  # hide the cursor while drawing
        drawn = 0
        try:
            with reader:
                while True:
                    if drawn:
                        self.out.write(f"\x1b[{drawn}A")
                    drawn = self._draw(options, index)
                    key = reader.read()
                    if key in ("up", "k"):
                        index = (index - 1) % len(options)
                    elif key in ("down", "j", "tab"):
                        index = (index + 1) % len(options)
                    elif key.isdigit() and 1 <= int(key) <= len(options):
                        index = int(key) - 1
                    elif key == "enter":
                        break
                    elif key in ("ctrl-c", "ctrl-d"):
                        raise Cancelled()
        finally:
            self.out.write("\x1b[?25h")
            self.out.flush()
        # collapse the list into one answered line
        self.out.write(f"\x1b[{drawn + header_lines}A\x1b[J")
        self.write(f"{self.green(self.tick)} {message} {self.cyan(options[index].label)}")
        return options[index].value

    @staticmethod
    def _columns() -> int:
        return max(20, shutil.get_terminal_size((80, 24)).columns)

    def _rows(self, plain: str) -> int:
        """How many terminal rows `plain` (no escapes) takes."""
        return max(1, math.ceil(len(plain) / self._columns()))

    def _fit(self, label: str, hint: str) -> tuple[str, str]:
        """Label and hint cut to one row (a wrapped row would break the redraw)."""
        room = self._columns() - 5
        ell = "…" if self.unicode else "~"
        if len(label) > room:
            return label[: room - 1] + ell, ""
        if hint and len(label) + 2 + len(hint) > room:
            left = room - len(label) - 2
            hint = hint[: left - 1] + ell if left > 8 else ""
        return label, hint

    def _draw(self, options: Sequence[Option], index: int) -> int:
        for i, opt in enumerate(options):
            label, hint_text = self._fit(opt.label, opt.hint)
            hint = f"  {self.dim(hint_text)}" if hint_text else ""
            if i == index:
                line = f"  {self.cyan(self.pointer)} {self.cyan(label)}{hint}"
            else:
                line = f"    {label}{hint}"
            self.out.write("\x1b[2K" + line + "\r\n")
        self.out.flush()
        return len(options)

    def _select_by_number(self, message: str, options: Sequence[Option], index: int) -> Any:
        self.write(f"? {message}")
        for i, opt in enumerate(options, 1):
            self.write(f"  {i}. {opt.label}" + (f"  ({opt.hint})" if opt.hint else ""))
        while True:
            raw = self._line(f"Number [{index + 1}]: ")
            if not raw.strip():
                return options[index].value
            if raw.strip().isdigit() and 1 <= int(raw) <= len(options):
                return options[int(raw) - 1].value
            self.write(f"  Type a number from 1 to {len(options)}.")

    def _line(self, prompt: str) -> str:
        self.out.write(prompt)
        self.out.flush()
        try:
            line = self.stdin.readline()
        except KeyboardInterrupt:
            self.write()
            raise Cancelled() from None
        if not line:  # EOF (Ctrl-D)
            self.write()
            raise Cancelled()
        return line.rstrip("\r\n")

    def text(
        self,
        message: str,
        *,
        default: str | None = None,
        placeholder: str | None = None,
        validate: Callable[[str], str | None] | None = None,
        required: bool = False,
        conceal_rejected: bool = False,
    ) -> str:
        """A line of text. Empty input takes `default` (or "" when there is none and it is optional).

        `conceal_rejected`: a rejected answer is wiped from the screen (someone
        who pastes a key where a variable NAME belongs should not leave it in
        the scrollback).
        """
        hint = f"[{default}]" if default else (f"(e.g. {placeholder})" if placeholder else "")
        shown = f" {self.dim(hint)}" if hint else ""
        while True:
            raw = self._line(f"{self.cyan('?')} {self.bold(message)}{shown} ").strip()
            value = raw or (default or "")
            if not value and required:
                self.write(f"  {self.yellow(self.cross)} A value is required.")
                continue
            problem = validate(value) if (validate and value) else None
            if problem:
                if conceal_rejected and raw and self.out.isatty():
                    rows = self._rows(f"? {message} {hint} {raw}")
                    self.out.write(f"\x1b[{rows}A\x1b[J")
                    self.write(f"{self.cyan('?')} {self.bold(message)}{shown} {self.dim('(hidden)')}")
                self.write(f"  {self.yellow(self.cross)} {problem}")
                continue
            return value

    def confirm(self, message: str, *, default: bool = True) -> bool:
        choices = "Y/n" if default else "y/N"
        while True:
            raw = self._line(f"{self.cyan('?')} {self.bold(message)} {self.dim('(' + choices + ')')} ").strip().lower()
            if not raw:
                return default
            if raw in ("y", "yes"):
                return True
            if raw in ("n", "no"):
                return False
            self.write("  Answer y or n.")


class _KeyReader:
    """Single key presses from a terminal: 'up', 'down', 'enter', 'ctrl-c', … or the character typed."""

    def __init__(self, stream: TextIO) -> None:
        self.fd = stream.fileno()
        if os.name == "nt":
            import msvcrt  # noqa: F401

            self._mode = "msvcrt"
        else:
            import termios  # noqa: F401

            self._mode = "termios"
        self._saved: Any = None

    def __enter__(self) -> "_KeyReader":
        if self._mode == "termios":
            import termios

            self._saved = termios.tcgetattr(self.fd)
            mode = termios.tcgetattr(self.fd)
            mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG)  # lflags: keys one by one, Ctrl-C as a key
            mode[6][termios.VMIN] = 1
            mode[6][termios.VTIME] = 0
            termios.tcsetattr(self.fd, termios.TCSADRAIN, mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._mode == "termios" and self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def _byte(self, timeout: float | None = None) -> bytes:
        if timeout is not None:
            import select

            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return b""
        return os.read(self.fd, 1)

    def read(self) -> str:
        if sys.platform == "win32" and self._mode == "msvcrt":  # the platform test tells mypy msvcrt exists
            import msvcrt

            ch = msvcrt.getwch()
            if ch in ("\x00", "\xe0"):
                return {"H": "up", "P": "down"}.get(msvcrt.getwch(), "")
            return _NAMED.get(ch, ch)
        b = self._byte()
        if b == b"\x1b":
            nxt = self._byte(0.05)
            if nxt in (b"[", b"O"):
                code = self._byte(0.05)
                return {b"A": "up", b"B": "down", b"C": "right", b"D": "left"}.get(code, "")
            return "escape"
        ch = b.decode("utf-8", errors="ignore")
        return _NAMED.get(ch, ch)


_NAMED = {"\r": "enter", "\n": "enter", "\x03": "ctrl-c", "\x04": "ctrl-d", "\t": "tab"}
