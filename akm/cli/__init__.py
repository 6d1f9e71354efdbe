"""The command-line front: parse argv, call `akm.api`, render, exit.

No workflow logic lives here. Start-up must stay fast, so this module imports
only the standard library and `akm.errors` at top level; everything else is
imported inside the command that needs it (never `mcp` or `httpx`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import argparse

from akm import __version__
from akm.errors import EXIT_INTERNAL, EXIT_USAGE, AkmError, UsageError

_RUN_HELP = """\
usage: akm workflow run TARGET [--<param> VALUE ...] [--new] [--max-steps N] [--timeout DUR]
                        [--detach] [--format text|json] [--quiet] [--verbose]

Start or continue a workflow run and drive it as far as it can go.

TARGET is a workflow file path, a workflows/<name> ref (.akm/workflows/ of the
project, then the user library) or an existing run id.

Which run: a workflow TARGET continues the active run of the same workflow in
this project with the same params (after defaults), with the plan it froze
even if the file was edited since (a warning says so); otherwise it starts a
new run. Runs with other params live side by side.

Params: every declared param is a flag after TARGET: --name value, --name=value,
a bare --name (true), repeat for arrays or pass JSON ([..], {..}).

Run flags:
  --new           always start a new run (e.g. to run an edited file)
  --max-steps N   finish at most N steps in this invocation (exit 4 if more remain)
  --timeout DUR   stop after DUR (500ms, 30s, 5m); the run stays active
  --detach        drive the run in the background: print the run id at once and
                  log to <data dir>/logs/RUN.log; `akm workflow wait RUN` waits
  --format F      text (default) or json
  --quiet, -q     no progress at all
  --verbose       a progress line per finished unit on stderr, terminal or not
                  (by default a terminal gets a board of steps redrawn in place)
  --help, -h      this help
These names are reserved: a param of the same name cannot be set on the CLI.

Exit status: 0 completed, 1 failed/blocked/timed out, 2 usage error,
3 awaiting the calling agent (session units), 4 stopped at --max-steps,
130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP.
"""


def _terminal_width() -> int:
    try:
        columns = int(os.environ.get("COLUMNS", "") or os.get_terminal_size(sys.stdout.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        columns = 80
    return max(40, columns)


def _build_parser() -> "argparse.ArgumentParser":
    import argparse  # lazy: `akm --version` should not pay for it

    class _Parser(argparse.ArgumentParser):
        """argparse that raises a UsageError instead of printing and exiting."""

        def error(self, message: str) -> None:  # type: ignore[override]
            raise UsageError(f"{self.prog}: {message}", code="USAGE", hint=f"See `{self.prog} --help`.")

        def _get_formatter(self) -> "argparse.HelpFormatter":
            # argparse sizes its formatter through shutil (and shutil's imports: zlib, bz2, lzma) even
            # when nothing is printed; the terminal width from os costs nothing.
            formatter_class: Any = self.formatter_class
            return formatter_class(prog=self.prog, width=_terminal_width() - 2)

    p = _Parser(prog="akm", description="akm: durable workflows for coding agents.")
    p.add_argument("--version", action="version", version=f"akm {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    wf = sub.add_parser(
        "workflow",
        help="lint, run and inspect workflows",
        description="Lint, run and inspect workflows. `akm workflow ACTION --help` for each action.",
    )
    p.workflow_parser = wf  # type: ignore[attr-defined]
    wsub = wf.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    run_id_help = "a run id (from `akm workflow list` or a run's output)"

    def add(name: str, text: str) -> "argparse.ArgumentParser":
        return wsub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")

    def fmt(sp: "argparse.ArgumentParser", choices: tuple[str, ...] = ("text", "json")) -> None:
        sp.add_argument(
            "--format",
            choices=choices,
            default="text",
            help="output format: " + ", ".join(choices) + " (default: text)",
        )

    lint = add("lint", "check workflow files (or directories of them)")
    lint.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a workflow file, or a directory whose *.md files are linted (README.md skipped)",
    )
    fmt(lint)

    up = add("upgrade", "convert a legacy workflow file to the current format")
    up.add_argument("path", metavar="FILE", help="the legacy workflow file; printed converted unless --write")
    up.add_argument("--write", action="store_true", help="rewrite the file in place (only if it lints clean)")
    fmt(up)

    wsub.add_parser("run", help="start or continue a run (see `akm workflow run --help`)", add_help=False)

    cat = add("catalog", "the workflows this project can run by name, with their steps and params")
    fmt(cat)

    ls = add("list", "list runs in this project (newest first)")
    ls.add_argument("--active", action="store_true", help="only runs that can still be driven")
    ls.add_argument("--ref", help="only runs of this workflow (path or workflows/<name>)")
    ls.add_argument("--all", action="store_true", help="runs of every project, not just this one")
    fmt(ls)

    st = add("status", "where a run stands: its steps, their outputs and the run's result")
    st.add_argument("run_id", metavar="RUN", help=run_id_help)
    st.add_argument("--units", action="store_true", help="include every journaled unit attempt")
    st.add_argument(
        "--watch",
        action="store_true",
        help="follow a run driven elsewhere: live progress on stderr until it is no longer active",
    )
    st.add_argument("--step", metavar="STEP", help="only this step (its output whole)")
    fmt(st, ("text", "json", "mermaid", "html"))

    for name, text in (
        ("resume", "reopen a failed or blocked run (completed units are kept)"),
        ("abandon", "give up on a run for good: stops it at once; it can never be resumed"),
    ):
        sp = add(name, text)
        sp.add_argument("run_id", metavar="RUN", help=run_id_help)
        fmt(sp)

    wt = add("wait", "wait until a run is no longer active (driven elsewhere, e.g. by `workflow run --detach`)")
    wt.add_argument("run_id", metavar="RUN", help=run_id_help)
    wt.add_argument("--timeout", metavar="DUR", help="give up after DUR (500ms, 30s, 5m): exit 124")
    fmt(wt)
    wt.epilog = (
        "Exit status: that of `workflow run` for the state the run reached (0 completed, 1 failed, "
        "blocked or abandoned, 3 awaiting the calling agent); 124 when --timeout expired first; 5 when "
        "the run is active but no driver has held it for 10 s (resume it with `akm workflow run RUN`)."
    )

    nx = wsub.add_parser(
        "next",
        help="what the calling agent should do now for a run (read-only)",
        description="Print the brief of a run's current step: the session units an agent must "
        "do (prompt, context, schema, claim, how to report) or the gate verdict it "
        "must give. Never changes the run.",
    )
    nx.add_argument("run_id", metavar="RUN", help=run_id_help)
    fmt(nx)

    rp = wsub.add_parser(
        "report",
        help="record a session unit's result or a gate verdict",
        description="Record the result of a session unit (or a judge's verdict) done by the calling agent. "
        "When it completes the step's work the step finishes (gate, route); then `akm workflow run "
        "RUN` continues the run. Every refusal leaves the journal unchanged.",
    )
    rp.add_argument("run_id", metavar="RUN", help=run_id_help)
    rp.add_argument("unit_id", metavar="UNIT", help="the unit id from `akm workflow next` (or STEP.gate:lN)")
    rp.add_argument(
        "--status",
        choices=("completed", "failed", "running"),
        help="completed (with --result; the default with --verdict), failed (with --failure-reason), "
        "or running (claim it)",
    )
    rp.add_argument(
        "--result",
        metavar="JSON|@FILE|-",
        help="the unit's result: JSON for units with an output schema, else text; @FILE reads a file, "
        "- reads standard input",
    )
    rp.add_argument(
        "--verdict", metavar="JSON|@FILE|-", help='a gate verdict {"complete": bool, "missing": [..], "feedback": ".."}'
    )
    rp.add_argument("--tokens", metavar="N", help="tokens spent (counted against the run's budget)")
    rp.add_argument("--failure-reason", metavar="R", help="why the unit failed (e.g. timeout)")
    rp.add_argument("--expect-step", metavar="STEP", help="refuse unless the run is still on this step")
    rp.add_argument(
        "--attempt",
        metavar="ID",
        help="the brief's attemptId: the attempt this report answers (a "
        "report for a gate loop already closed is never counted for "
        "a later one)",
    )
    rp.add_argument("--rerun", action="store_true", help="replace a result already recorded for this unit")
    rp.add_argument("--holder", metavar="H", help="claim holder name (default: this user and host)")
    fmt(rp)

    _add_config_parser(sub)
    _add_setup_parser(sub)

    log = sub.add_parser(
        "log",
        help="journal events (cursor-paged)",
        description="Journal events in order, a page at a time. Continue with "
        "--since @offset:<nextOffset> of the previous page.",
    )
    log.add_argument("--run", dest="run_id", metavar="RUN", help="only events of this run")
    log.add_argument("--since", help="@offset:N (a previous nextOffset) or an ISO time such as 2026-11-30T12:00:00Z")
    log.add_argument("--limit", type=int, metavar="N", help="at most N events per page (default 100, at most 10000)")
    fmt(log)
    return p


# ------------------------------------------------------------------ `akm config` (engines issue)


def _add_config_parser(sub: Any) -> None:
    cp = sub.add_parser(
        "config",
        help="read and change engine configuration",
        description="Read and change engine configuration (user file, and the project's "
        ".akm/config.json over it). `akm config ACTION --help` for each action.",
    )
    csub = cp.add_subparsers(dest="config_action", metavar="ACTION", parser_class=type(cp))
    cp.set_defaults(config_parser=cp)

    def add(name: str, text: str) -> "argparse.ArgumentParser":
        return csub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")

    def scope(sp: "argparse.ArgumentParser") -> None:
        sp.add_argument(
            "--project",
            action="store_true",
            help="the project file (<project>/.akm/config.json) instead of the user file",
        )

    def fmt(sp: "argparse.ArgumentParser", default: str) -> None:
        sp.add_argument(
            "--format",
            choices=("text", "json"),
            default=default,
            help=f"output format: text, json (default: {default})",
        )

    key_help = "a dotted key path, e.g. engines.fast.model"
    pth = add("path", "print where the config file is")
    scope(pth)
    fmt(pth, "text")
    ls = add("list", "the effective config (user file under the project file), as JSON")
    fmt(ls, "json")
    get = add("get", "one value (JSON; null when unset)")
    get.add_argument("key", metavar="KEY", help=key_help)
    fmt(get, "json")
    st = add("set", "set a value (objects merge, arrays replace)")
    st.add_argument("key", metavar="KEY", help=key_help)
    st.add_argument(
        "value",
        metavar="VALUE",
        help="the value, turned into the key's type: text, a number, true/false, a duration, or JSON",
    )
    scope(st)
    st.add_argument("--silent", action="store_true", help="print nothing on success")
    fmt(st, "text")
    un = add("unset", "remove a key (emptied parents are removed too)")
    un.add_argument("key", metavar="KEY", help=key_help)
    scope(un)
    un.add_argument("--silent", action="store_true", help="print nothing on success")
    fmt(un, "text")


def _cmd_config(args: "argparse.Namespace") -> int:
    from akm import api

    action = args.config_action
    if action is None:
        args.config_parser.print_help(sys.stderr)
        return EXIT_USAGE
    if action == "path":
        paths_ = api.config_paths()
        if args.format == "json":
            _emit_json(paths_.to_json())
        else:
            _out(paths_.project if args.project else paths_.user)
        return 0
    if action == "list":
        _emit_json(api.config_list())
        return 0
    if action == "get":
        _emit_json(api.config_get(args.key))
        return 0
    try:
        if action == "set":
            change = api.config_set(args.key, args.value, project=args.project)
        else:
            change = api.config_unset(args.key, project=args.project)
    except AkmError as exc:
        if exc.code == "INVALID_ARGUMENT" and exc.hint is None:
            exc.hint = "See `akm config --help`; `akm config get KEY` shows a key's current value."
        raise
    if args.silent:
        return 0
    if args.format == "json":
        _emit_json(change.to_json())
    elif not change.written:
        _out(f"{change.key}: unchanged ({change.file})")
    elif action == "set":
        _out(f"{change.key} = {json.dumps(change.value, ensure_ascii=False)}  ({change.file})")
    else:
        _out(f"{change.key} removed  ({change.file})")
    return 0


# ------------------------------------------------------------------ `akm setup` (setup issue)

_SETUP_HELP = """\
Find local model servers (Ollama, LM Studio, any OpenAI-compatible server), agent
CLIs on PATH and harness configs (Claude Code, OpenCode); check that they answer;
write engines into the config.

  akm setup                     a short wizard (needs a terminal)
  akm setup --yes               no questions: write an llm engine for the first local
                                server that answers and an agent engine for the
                                preferred CLI on PATH (only where no default is set);
                                prints a JSON summary
  akm setup --config JSON       deep-merge a config object (keys only as ${ENV_NAME})
  akm setup --from FILE         the same from a JSON or YAML file
"""


def _add_setup_parser(sub: Any) -> None:
    import argparse

    sp = sub.add_parser(
        "setup",
        help="find model servers and agent CLIs, verify them, write engines",
        description=_SETUP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sp.add_argument("--yes", "-y", action="store_true", help="no questions: detect, verify and write engines")
    sp.add_argument("--config", metavar="JSON", help="a config object to deep-merge (API keys only as ${ENV_NAME})")
    sp.add_argument("--from", dest="from_file", metavar="FILE", help="read that config object from a JSON/YAML file")
    sp.add_argument(
        "--probe",
        action="store_true",
        help="also probe the default LLM engine for json_schema support (records supportsJsonSchema)",
    )
    sp.add_argument(
        "--project",
        action="store_true",
        help="write the project file (<project>/.akm/config.json) instead of the user file",
    )
    sp.add_argument(
        "--format", choices=("text", "json"), default=None, help="output of the non-interactive forms (default: json)"
    )


def _cmd_setup(args: "argparse.Namespace") -> int:
    from akm import api
    from akm.errors import ConfigError

    if args.config is not None and args.from_file is not None:
        raise UsageError("--config and --from cannot be combined: give the config one way.", code="INVALID_ARGUMENT")
    blob = None
    if args.config is not None:
        try:
            blob = json.loads(args.config)
        except ValueError as exc:
            raise UsageError(
                f"Invalid JSON in --config: {getattr(exc, 'msg', exc)} "
                f"(line {getattr(exc, 'lineno', '?')}, column {getattr(exc, 'colno', '?')}).",
                code="INVALID_ARGUMENT",
                hint='Pass one JSON object, e.g. --config \'{"defaults": {"llmEngine": "fast"}}\'.',
            ) from None
        if not isinstance(blob, dict):
            raise ConfigError(
                f"--config must be one JSON object, not {type(blob).__name__}.", code="INVALID_CONFIG_FILE"
            )
    if not (args.yes or args.probe or args.config is not None or args.from_file is not None):
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise UsageError(
                "akm setup asks questions, and there is no terminal to ask them on.",
                code="NON_INTERACTIVE_REQUIRES_YES",
                hint="Use `akm setup --yes` to detect and write engines without questions, or give "
                "the config with `--config JSON` or `--from FILE`.",
            )
        from akm.cli.wizard import run_wizard

        return run_wizard(project=args.project)

    def warning(message: str) -> None:
        _err(f"warning: {message}")

    try:
        res = api.setup(
            yes=args.yes,
            config=blob,
            from_file=args.from_file,
            probe=args.probe,
            project=args.project,
            on_warning=warning,
        ).to_json()
    except AkmError as exc:
        if exc.code == "INVALID_CONFIG_FILE" and exc.hint and "akm config" not in exc.hint:
            exc.hint += " `akm config path` shows where the files are."
        raise
    if (args.format or "json") == "json":
        _emit_json(res)
        if sys.stderr.isatty():  # a person is watching: say it in words too
            _err(res["message"])
    else:
        _out(_render_setup_text(res))
    return 0


def _render_setup_text(res: dict[str, Any]) -> str:
    lines = [res["message"]]
    for a in res["engines"]:
        lines.append(f"  {a['action']} {a['kind']} engine {a['engine']}" + (f": {a['detail']}" if a["detail"] else ""))
    d = res.get("defaults") or {}
    if d:
        lines.append("defaults: " + ", ".join(f"{k} = {v}" for k, v in d.items()))
    lines.append("you can now run:")
    lines.extend(f"  - {line}" for line in res["canRun"])
    return "\n".join(lines)


# ------------------------------------------------------------------ output helpers


# Characters a terminal may act on rather than show: C0 controls (ESC starts escape sequences, CR
# overwrites a line, BS erases), DEL, C1 controls (0x9b is a one-byte CSI) and the bidi overrides that
# reorder what is displayed. Unit output, file contents and messages quoting them are printed with these
# made visible; newline and tab stay as they are.
_TERMINAL_UNSAFE = (
    [c for c in range(0x20) if c not in (0x09, 0x0A)]
    + list(range(0x7F, 0xA0))
    + [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)
_TEXT_ESCAPES: dict[int, str] | None = None
_JSON_ESCAPES: dict[int, str] | None = None


def _printable(text: str) -> str:
    """Text with every terminal-active character written as a visible escape (`\\x1b`, `\\u202e`)."""
    global _TEXT_ESCAPES
    if _TEXT_ESCAPES is None:
        _TEXT_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _TERMINAL_UNSAFE}
    return text.translate(_TEXT_ESCAPES)


def _json_text(data: Any) -> str:
    """JSON whose strings carry terminal-active characters as `\\u` escapes (the same JSON values)."""
    global _JSON_ESCAPES
    if _JSON_ESCAPES is None:
        _JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _TERMINAL_UNSAFE if c >= 0x7F}  # json.dumps escapes C0
    return json.dumps(data, indent=2, ensure_ascii=False).translate(_JSON_ESCAPES)


def _emit_json(data: Any) -> None:
    sys.stdout.write(_json_text(data) + "\n")


def _out(text: str) -> None:
    text = _printable(text)
    sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))


def _err(text: str) -> None:
    text = _printable(text)
    sys.stderr.write(text + ("" if text.endswith("\n") else "\n"))
    sys.stderr.flush()


def _err_json(data: Any) -> None:
    sys.stderr.write(_json_text(data) + "\n")
    sys.stderr.flush()


# ------------------------------------------------------------------ commands


def _cmd_lint(args: argparse.Namespace) -> int:
    from akm import api
    from akm.format.lint import render_text

    report = api.lint(args.paths)
    if args.format == "json":
        _emit_json(report.model_dump())
    else:
        _out(render_text(report))
    return 0 if report.ok else 1


def _cmd_upgrade(args: argparse.Namespace) -> int:
    from akm import api

    res = api.upgrade(args.path, write=args.write)
    if args.format == "json":
        _emit_json(res.to_json())
    elif args.write:
        _out(f"upgraded {res.path}")
    else:
        _out(res.text)
    return 0 if res.ok else 1


def _cmd_run(tokens: list[str]) -> int:
    from akm import api
    from akm.cli import render
    from akm.format.params import split_run_args

    if any(t in ("-h", "--help") for t in tokens):
        _out(_RUN_HELP)
        return 0
    ra = split_run_args(tokens)
    if ra.target is None:
        raise UsageError(
            "workflow run needs a TARGET (a workflow file, workflows/<name> or a run id).",
            code="USAGE",
            hint="See `akm workflow run --help`.",
        )
    fmt = api.check_output_format(str(ra.controls.get("format", "text")), ("text", "json"))

    if ra.controls.get("detach"):
        detached = api.detach_run(
            ra.target,
            param_pairs=ra.params,
            max_steps=ra.controls.get("max-steps"),
            timeout=ra.controls.get("timeout"),
            new=bool(ra.controls.get("new")),
        )
        for message in detached.warnings:
            _err(f"warning: {message}")
        if fmt == "json":
            _emit_json(detached.to_json())
        elif detached.pid is None:
            _out(f"{detached.run_id} {detached.status}: nothing to drive")
        else:
            _out(detached.run_id)
            if not ra.controls.get("quiet"):
                _err(
                    f"driving in the background (pid {detached.pid}), log: {detached.log}; "
                    f"wait with: akm workflow wait {detached.run_id}"
                )
        return 0

    import signal

    cancel = api.Cancellation()
    if ra.controls.get("quiet") and ra.controls.get("verbose"):
        raise UsageError("--quiet and --verbose contradict each other; pass one.", code="INVALID_ARGUMENT")
    # Progress lines go to a terminal by default; --verbose sends them anywhere (an agent's pipe, a log).
    show_progress = bool(ra.controls.get("verbose")) or sys.stderr.isatty() or os.environ.get("AKM_PROGRESS") == "1"
    if ra.controls.get("quiet"):
        show_progress = False

    reasons = {signal.SIGINT: "sigint", signal.SIGTERM: "sigterm", signal.SIGHUP: "sighup"}

    def on_signal(signum: int, _frame: Any) -> None:
        cancel.trip(reasons[signum])
        signal.signal(signum, signal.SIG_DFL)  # a second signal kills at once

    for signum in reasons:
        signal.signal(signum, on_signal)

    # On a terminal (and without --verbose) the progress is a board of steps redrawn in place.
    live = None
    if (
        show_progress
        and sys.stderr.isatty()
        and not ra.controls.get("verbose")
        and os.environ.get("AKM_PROGRESS") != "1"
        and os.environ.get("TERM") != "dumb"
    ):
        from akm.report.live import LiveProgress

        live = LiveProgress(sys.stderr)

    def progress(p: Any) -> None:  # from worker threads too: one write per line
        if live is not None:
            live.progress(p)
            return
        if not show_progress or p.kind == "step_started":
            return
        if p.kind == "step":
            _err(f"[{p.step_id}] step {p.status}")
        else:
            mark = "ok" if p.ok else f"FAILED ({p.failure_reason})"
            _err(f"[{p.step_id} {p.done}/{p.total}] {p.attempt_id} {mark}")

    def warning(w: Any) -> None:
        say = live.message if live is not None else _err
        say(f"warning: {w.message}")
        if w.code == "WORKFLOW_CHANGED":
            say(
                f"  hint: to run the edited file, start a new run: akm workflow run {ra.target} --new "
                f"(and `akm workflow abandon {w.details['runId']}` to drop the old one)"
            )

    try:
        result = api.run_workflow(
            ra.target,
            param_pairs=ra.params,
            max_steps=ra.controls.get("max-steps"),
            timeout=ra.controls.get("timeout"),
            new=bool(ra.controls.get("new")),
            cancel=cancel,
            on_progress=progress,
            on_warning=warning,
        )
    finally:
        if live is not None:
            live.stop()
    data = result.to_json()
    if fmt == "json":
        _emit_json(data)
    else:
        _out(render.run_text(data["run"]))
        if result.timed_out:
            _out("stopped: --timeout expired (the run is still active; run it again to continue)")
        elif result.aborted:
            _out("stopped: interrupted (the run is still active; run it again to continue)")
    return api.exit_status_for(result)


def _cmd_list(args: argparse.Namespace) -> int:
    from akm import api

    res = api.list_runs(active_only=args.active, ref=args.ref, all_scopes=args.all)
    if args.format == "json":
        _emit_json(res.to_json())
    else:
        if not res.runs:
            _out("no runs")
        for r in res.runs:
            _out(f"{r.run_id}  {r.status:<17} {r.title:<24} {r.updated_at}")
    return 0


def _cmd_catalog(args: argparse.Namespace) -> int:
    from akm import api

    res = api.workflow_catalog().to_json()
    if args.format == "json":
        _emit_json(res)
        return 0
    if not res["workflows"]:
        _out("no workflows in " + " or ".join(res["roots"]))
    for w in res["workflows"]:
        about = w["description"] or w["title"] or ""
        _out(f"{w['ref']}  ({w['source']})" + (f"  {about}" if about else ""))
        _out("  steps: " + ", ".join(s["id"] + (" [gate]" if s["gated"] else "") for s in w["steps"]))
        for p in w["params"]:
            default = "" if p["required"] else f" = {json.dumps(p['default'], ensure_ascii=False)}"
            _out(
                f"  --{p['name']} {p['type'] or 'any'}{default}" + (f"  {p['description']}" if p["description"] else "")
            )
        for problem in w["problems"]:
            _out(f"  problem: {problem}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from akm import api
    from akm.cli import render

    code = 0
    if args.watch:  # follow a run driven elsewhere; then print its status as usual
        from akm.report.watch import follow

        try:
            code = follow(args.run_id, sys.stderr)
        except KeyboardInterrupt:
            return 130  # Ctrl-C ends a watch quietly; the run itself is not touched
    if args.format == "html":  # one self-contained page: `> run.html`, then open it in a browser
        page = api.run_report_html(args.run_id)
        raw = getattr(sys.stdout, "buffer", None)
        if raw is None:
            sys.stdout.write(page)
        else:  # bytes: the page says charset=utf-8, whatever the locale's encoding
            sys.stdout.flush()
            raw.write(page.encode("utf-8"))
        return code
    view = api.run_status(args.run_id, units=args.units, step=args.step).to_json()
    if args.format == "json":
        _emit_json(view)
    elif args.format == "mermaid":
        _out(render.mermaid(api.run_graph(args.run_id).to_json()))
    else:
        _out(render.run_text(view))
    return code


def _cmd_wait(args: argparse.Namespace) -> int:
    import signal

    from akm import api
    from akm.cli import render

    cancel = api.Cancellation()
    signal.signal(signal.SIGINT, lambda *_: cancel.trip("sigint"))
    result = api.wait_run(args.run_id, timeout=args.timeout, cancel=cancel)
    if cancel.tripped:
        return 130
    if args.format == "json":
        _emit_json(result.to_json())
    else:
        _out(render.run_text(result.run.to_json()))
        if result.timed_out:
            _out("waiting stopped: --timeout expired (the run is still active)")
        elif result.undriven:
            _out(f"the run is active but nothing drives it: continue it with akm workflow run {args.run_id}")
    return api.wait_exit_status(result)


def _cmd_control(args: argparse.Namespace) -> int:
    from akm import api
    from akm.cli import render

    view = (api.resume if args.action == "resume" else api.abandon)(args.run_id).to_json()
    if args.format == "json":
        _emit_json(view)
    else:
        _out(render.run_text(view))
    return 0


def _cmd_log(args: argparse.Namespace) -> int:
    from akm import api

    page = api.events(run_id=args.run_id, since=args.since, limit=args.limit).to_json()
    if args.format == "json":
        _emit_json(page)
    else:
        for e in page["events"]:
            _out(f"{e['id']:>6} {e['ts']} {e['eventType']} {json.dumps(e.get('metadata', {}), ensure_ascii=False)}")
        more = "more events are waiting; " if page["hasMore"] else ""
        _out(f"{more}next: --since @offset:{page['nextOffset']}")
    return 0


def _render_brief_text(b: dict[str, Any]) -> str:
    lines = [
        f"run {b['runId']}  {b['status']}  step {b.get('stepId') or '-'}"
        + (f" (gate loop {b['gateLoop']} of {b['maxLoops']})" if (b.get("maxLoops") or 0) > 1 else "")
    ]
    lines.append(b.get("message") or "")
    for w in b.get("warnings") or []:
        lines.append(f"warning: {w}")
    if b.get("gateFeedback"):
        lines.append(f"feedback from the last loop: {b['gateFeedback'].get('feedback')}")
    for u in b.get("units") or []:
        claim = f", claimed by {u['claim']['holder']} until {u['claim']['expiresAt']}" if u.get("claim") else ""
        lines.append(f"\n== unit {u['unitId']} ({u['action']}{claim})")
        if u["context"].get("itemIndex") is not None:  # a fan-out unit (a solo unit has no item)
            lines.append(f"item {u['context']['itemIndex']}: {json.dumps(u['context']['item'], ensure_ascii=False)}")
        lines.append(u["prompt"])
        rep = u["report"]
        arg = "--result @result.json" if u.get("resultKind") == "json" else "--result @result.txt"
        lines.append(
            f"-> akm workflow report {rep['runId']} {rep['unitId']} --expect-step {rep['expectStep']} "
            f"--attempt {rep['attemptId']} --status completed {arg}" + (" --rerun" if rep.get("rerun") else "")
        )
    j = b.get("judge")
    if j:
        lines.append(f"\n== verdict {j['unitId']}")
        lines.append(j["prompt"])
        lines.append(
            f"-> akm workflow report {b['runId']} {j['unitId']} --expect-step {b['stepId']} "
            '--verdict \'{"complete": true, "missing": [], "feedback": ""}\''
        )
    if b.get("kind") == "engine":
        lines.append(f"-> akm workflow run {b['runId']}")
    return "\n".join(lines)


def _cmd_next(args: argparse.Namespace) -> int:
    from akm import api

    b = api.next_brief(args.run_id).to_json()
    if args.format == "json":
        _emit_json(b)
    else:
        _out(_render_brief_text(b))
    return 0


# The most `--result`/`--verdict` text read from a file or standard input (akm.engine.session.MAX_RESULT_BYTES,
# which the CLI does not import for this): one byte more is read, so `@/dev/zero` is refused at once.
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024


def _read_payload(value: str, what: str) -> str:
    """`--result`/`--verdict` text: literal, @FILE or - (standard input), reading at most 16 MiB + 1 byte."""
    if value != "-" and not value.startswith("@"):
        return value
    source = "standard input" if value == "-" else value[1:]
    try:
        if value == "-":
            stdin = getattr(sys.stdin, "buffer", None)  # a text-only stdin (embedding, tests) is read as text
            data = (
                stdin.read(MAX_PAYLOAD_BYTES + 1)
                if stdin is not None
                else sys.stdin.read(MAX_PAYLOAD_BYTES + 1).encode("utf-8", "surrogateescape")
            )
        else:
            with open(value[1:], "rb") as f:
                data = f.read(MAX_PAYLOAD_BYTES + 1)
        if len(data) > MAX_PAYLOAD_BYTES:
            raise UsageError(
                f"{what} {_clip(value)}: {source} holds more than {MAX_PAYLOAD_BYTES} bytes (16 MiB), "
                "the most a report may carry; nothing was recorded. Report the path of a large output "
                "instead.",
                code="RESULT_TOO_LARGE",
                details={"maxBytes": MAX_PAYLOAD_BYTES},
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(
            f"{what} {_clip(value)}: cannot read {_clip(source)}: {getattr(exc, 'strerror', None) or exc}.",
            code="UNREADABLE_FILE",
        ) from None


def _clip(text: str) -> str:
    from akm.text import quoted

    return quoted(text)


def _cmd_report(args: argparse.Namespace) -> int:
    from akm import api
    from akm.engine.budget import MAX_UNIT_TOKENS as MAX_REPORT_TOKENS

    tokens = None
    if args.tokens is not None:
        digits = args.tokens
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 13 and int(digits) <= MAX_REPORT_TOKENS):
            from akm.text import quoted

            raise UsageError(
                f"--tokens {quoted(args.tokens)}: expected a whole number from 0 to {MAX_REPORT_TOKENS}.",
                code="INVALID_ARGUMENT",
            )
        tokens = int(args.tokens)
    status = args.status
    if status is None:
        if args.verdict is None:
            raise UsageError(
                "--status is required (completed, failed or running); only --verdict implies completed.",
                code="INVALID_ARGUMENT",
                details={"argument": "status"},
            )
        status = "completed"
    res = api.report_unit(
        args.run_id,
        args.unit_id,
        status=status,
        attempt_id=args.attempt,
        result=_read_payload(args.result, "--result") if args.result is not None else None,
        has_result=args.result is not None,
        verdict=_read_payload(args.verdict, "--verdict") if args.verdict is not None else None,
        has_verdict=args.verdict is not None,
        tokens=tokens,
        failure_reason=args.failure_reason,
        expect_step=args.expect_step,
        rerun=args.rerun,
        holder=args.holder,
    ).to_json()
    if args.format == "json":
        _emit_json(res)
    else:
        _out(f"{res['recorded']}: {res['unitId']} ({res['status']}) — {res['message']}")
        if res.get("brief"):  # the step's work changed: what to do now, without another `next`
            _out("")
            _out(_render_brief_text(res["brief"]))
        elif (
            res.get("stepOutcome")
            and res["stepOutcome"].get("kind") == "completed"
            and res.get("runStatus") != "completed"
        ):
            _out(f"-> akm workflow run {res['runId']}")
    return 0


def _cmd_mcp(rest: list[str]) -> int:
    """`akm mcp`: the MCP stdio server. Only this path imports `mcp` (it costs about a second)."""
    if rest in (["-h"], ["--help"]):
        _out(
            "usage: akm mcp\n\nServe akm's tools over the Model Context Protocol on stdin/stdout, e.g.\n"
            "  claude mcp add akm -- /path/to/akm mcp"
        )
        return 0
    if rest:
        _err(f"error[USAGE]: akm mcp takes no arguments (got {' '.join(rest)})")
        return EXIT_USAGE
    from akm.mcp import serve

    return serve()


# The core says what is wrong; the CLI says what to type about it. Templates take `{key}` from the
# error's details (a template whose keys are missing is not used, and the core's own hint stays).
_CLI_HINTS: dict[str, str] = {
    "RUN_NOT_FOUND": "List runs with `akm workflow list` (`--all` for every project).",
    "RUN_ABANDONED": "Abandoning is final; start a new run from the workflow file with `akm workflow run FILE`.",
    "RUN_ALREADY_FINISHED": "Start a new run from the workflow file with `akm workflow run FILE`.",
    "LEASE_HELD": "Wait for that `akm workflow run` to finish, or for its lease to expire; "
    "`akm workflow status {runId}` shows who holds it.",
    "WORKFLOW_INVALID": "Run `akm workflow lint {path}` for every problem and how to fix it.",
    "CORRUPT_RUN": "Inspect it with `akm workflow status {runId}` or discard it with `akm workflow abandon {runId}`.",
    "PARAMS_ON_EXISTING_RUN": "Params go with the workflow file: `akm workflow run FILE --name value`.",
    "NEW_RUN_NEEDS_WORKFLOW": "Pass the workflow file or workflows/<name> together with --new.",
    "REPORT_CONFLICT": "Add --rerun to replace the recorded result.",
    "UNIT_TERMINAL": "Add --rerun to do the finished unit again.",
    "CLAIM_EXPIRED": "Claim it again with --status running (same --holder), then report its result.",
    "STEP_MISMATCH": "`akm workflow next RUN` shows what the run needs now.",
    "STEP_CLOSED": "Start a new run to change it: `akm workflow run FILE --new`.",
    "STALE_REPORT": "`akm workflow next RUN` shows the current attempt; report that with --attempt.",
    "REPLAY_DIVERGED": "Start a new run: `akm workflow run FILE --new`.",
    "UNKNOWN_UNIT": "`akm workflow next RUN` lists the units to report.",
}
# An argument of the api (details.argument) as the CLI spells it.
_FLAG_OF = {
    "max_steps": "--max-steps",
    "timeout": "--timeout",
    "format": "--format",
    "since": "--since",
    "limit": "--limit",
    "paths": "PATH",
    "run_id": "RUN",
    "target": "TARGET",
    "tokens": "--tokens",
}


def _cli_hint(exc: AkmError) -> str | None:
    """This front's advice for an error, else the core's own hint."""
    details = exc.details or {}
    if exc.code == "RUN_NOT_ACTIVE" and details.get("status") in ("failed", "blocked") and details.get("runId"):
        return f"Reopen it with `akm workflow resume {details['runId']}`, then run it again."
    argument = details.get("argument")
    if argument in _FLAG_OF:
        return f"Check {_FLAG_OF[argument]}; `--help` on the command describes it."
    template = _CLI_HINTS.get(exc.code)
    if template is not None:
        try:
            return template.format(**details)
        except (KeyError, IndexError):
            pass
    return exc.hint


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
    from akm.text import require_utf8

    for i, token in enumerate(argv):
        after = f" (after {argv[i - 1]})" if i and argv[i - 1].startswith("-") and len(argv[i - 1]) <= 64 else ""
        require_utf8(token, f"argument {i + 1}{after}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    json_errors = _wants_json(argv)
    if argv == ["--version"]:
        _out(f"akm {__version__}")
        return 0
    if argv[:1] == ["mcp"]:
        return _cmd_mcp(argv[1:])
    _tolerant_streams()
    try:
        _check_argv(argv)
        if len(argv) >= 2 and argv[0] == "workflow" and argv[1] == "run":
            return _cmd_run(argv[2:])
        parser = _build_parser()
        args = parser.parse_args(argv)
        if args.command is None or (args.command == "workflow" and args.action is None):
            (parser if args.command is None else parser.workflow_parser).print_help(sys.stderr)
            return EXIT_USAGE
        if args.command == "log":
            return _cmd_log(args)
        if args.command == "config":
            return _cmd_config(args)
        if args.command == "setup":
            return _cmd_setup(args)
        handler = {
            "lint": _cmd_lint,
            "upgrade": _cmd_upgrade,
            "list": _cmd_list,
            "status": _cmd_status,
            "catalog": _cmd_catalog,
            "resume": _cmd_control,
            "abandon": _cmd_control,
            "next": _cmd_next,
            "wait": _cmd_wait,
            "report": _cmd_report,
        }[args.action]
        return handler(args)
    except AkmError as exc:
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
            sys.stdout.flush()
        except BrokenPipeError:
            pass


if __name__ == "__main__":
    raise SystemExit(main())
