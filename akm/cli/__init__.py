"""The command-line front: parse argv, call `akm.api`, render, exit.

No workflow logic lives here. `parser.py` holds the grammar, `commands.py` one function per command,
`render.py` the renderings and output, `hints.py` what to type about an error. Start-up must stay fast, so
this module imports only the standard library, `akm.errors` and `render` at top level; the parser and the
commands are loaded by `main` once `--version` is answered, the hints only when an error is printed, and
everything heavier inside the command that needs it (never `mcp` outside `akm mcp`, nor `httpx`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn, Sequence

from akm import __version__
from akm.cli.render import _err, _err_json, _out
from akm.errors import EXIT_INTERNAL, EXIT_OUTPUT, EXIT_USAGE, AkmError


def __getattr__(name: str) -> Any:
    """`akm.cli._build_parser` and `akm.cli._CLI_HINTS`, kept where tests reach them, without loading
    their modules on every start."""
    if name == "_build_parser":
        from akm.cli.parser import _build_parser

        return _build_parser
    if name == "_CLI_HINTS":
        from akm.cli.hints import _CLI_HINTS

        return _CLI_HINTS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _wants_json(argv: Sequence[str]) -> bool:
    for i, tok in enumerate(argv):
        if tok == "--format=json" or (tok == "--format" and i + 1 < len(argv) and argv[i + 1] == "json"):
            return True
    return False


def _tolerant_streams() -> None:
    """Never crash while printing: text that cannot be encoded is written escaped.

    A strict UTF-8 stdout raises on a lone surrogate (an undecodable file name
    listed by lint, say); the user should see `\\udcff`, not an internal error.
    """
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


def _check_argv(argv: Sequence[str]) -> None:
    """Every argument must be UTF-8 text: paths, refs, run ids and param values are stored as text."""
    from akm.api import require_utf8

    for i, token in enumerate(argv):
        after = f" (after {argv[i - 1]})" if i and argv[i - 1].startswith("-") and len(argv[i - 1]) <= 64 else ""
        require_utf8(token, f"argument {i + 1}{after}")


def run() -> NoReturn:
    """The process entry (`akm`, `python -m akm`, the zipapp): `main`, then leave without the teardown.

    Why: once a command has answered, the interpreter's teardown (clearing some 150 modules, a last
    garbage collection) is a few milliseconds of a short `workflow run`'s ~100 ms, for nothing: every
    journal write is committed and every connection closed before `main` returns. What a normal exit
    must still do is done here: the atexit handlers run (the orphan guard's goodbye) and the standard
    streams are flushed. If a thread that is not a daemon still runs, the normal exit joins it — except
    after `akm mcp`: once its serving loop returned, every background driver was stopped and waited for,
    and what is left is the SDK's stdin reader, blocked in a read that may never return (a client that
    closed our stdout but not our stdin); joining it would keep the process alive until the next line.
    """
    code = main()
    import threading

    main_thread = threading.main_thread()
    if sys.argv[1:2] != ["mcp"] and any(
        t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()
    ):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    code = code if isinstance(code, int) else 0  # as sys.exit(None) would
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        pass  # the reader stopped reading (`akm … | head`): not a failure, as in `main`
    except (OSError, ValueError) as exc:  # a full disk, an I/O error: the output is not all there
        from akm.codes import Code

        failure = AkmError(f"the output could not be written whole: {exc}", code=Code.OUTPUT_FAILED)
        if code == 0:
            code = EXIT_OUTPUT
        try:
            sys.stderr.write(f"error[{failure.code}]: {failure.message}\n")
        except (OSError, ValueError):
            pass
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    json_errors = _wants_json(argv)
    if argv == ["--version"]:
        _out(f"akm {__version__}")
        return 0
    mcp = argv[:1] == ["mcp"]  # the protocol owns the streams and takes no arguments: neither is touched
    if not mcp:
        _tolerant_streams()
    try:
        if mcp:
            from akm.cli.commands import _cmd_mcp

            return _cmd_mcp(argv[1:])
        _check_argv(argv)
        from akm.cli import commands

        if len(argv) >= 2 and argv[0] == "workflow" and argv[1] == "run":
            return commands._cmd_run(argv[2:])
        from akm.cli.parser import _build_parser

        parser = _build_parser()
        args = parser.parse_args(argv)
        if args.command is None or (args.command == "workflow" and args.action is None):
            (parser if args.command is None else args.workflow_parser).print_help(sys.stderr)
            return EXIT_USAGE
        if args.command == "log":
            return commands._cmd_log(args)
        if args.command == "config":
            return commands._cmd_config(args)
        if args.command == "setup":
            return commands._cmd_setup(args)
        if args.command == "worker":
            return commands._cmd_worker(args)
        if args.command == "trace":
            if args.trace_action is None:
                parser.parse_args(["trace", "--help"])
            return commands._cmd_trace(args)
        handler = {
            "lint": commands._cmd_lint,
            "upgrade": commands._cmd_upgrade,
            "list": commands._cmd_list,
            "status": commands._cmd_status,
            "catalog": commands._cmd_catalog,
            "resume": commands._cmd_control,
            "abandon": commands._cmd_control,
            "rewind": commands._cmd_rewind,
            "next": commands._cmd_next,
            "wait": commands._cmd_wait,
            "report": commands._cmd_report,
        }[args.action]
        return handler(args)
    except AkmError as exc:
        from akm.cli.hints import _cli_hint

        exc.hint = _cli_hint(exc)
        if json_errors:
            _err_json(exc.to_dict())
        else:
            _err(f"error[{exc.code}]: {exc.message}")
            if exc.hint:
                _err(f"  hint: {exc.hint}")
        return exc.exit_status
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last line of defence: never a traceback to a user
        _err(f"error[INTERNAL]: unexpected {type(exc).__name__}: {exc}")
        _err("  hint: this is a bug in akm; set AKM_DEBUG=1 to see the traceback.")
        if os.environ.get("AKM_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        return EXIT_INTERNAL
    finally:
        try:
            if sys.stdout is not None:  # None: started with stdout closed
                sys.stdout.flush()
        except OSError:  # a closed pipe: fine; a full disk: `run` flushes again and says so
            pass


if __name__ == "__main__":
    raise SystemExit(main())
