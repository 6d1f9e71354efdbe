"""The commands: each `_cmd_*` turns parsed arguments into one `akm.api` call and prints its result.

No workflow logic lives here (the api validates; a command only adds what the command line needs: reading
`@FILE` payloads, signals, progress lines). Each command imports the api and whatever else it needs inside
itself, so loading this module costs nothing but its own code (never `mcp`, `httpx` or pydantic).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from akm.api import ConfigChange

from akm.cli.render import _emit_json, _err, _out, _render_brief_text, _render_setup_text
from akm.errors import EXIT_USAGE, AkmError, UsageError


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
    for warning in change.to_json().get("warnings") or []:
        _err(f"warning: {warning}")
    if not args.silent:
        _print_config_change(args, change)
    return 0


def _print_config_change(args: "argparse.Namespace", change: "ConfigChange") -> None:
    """What `config set`/`config unset` did: the change as JSON, or a line (unchanged, the new value, removed)."""
    if args.format == "json":
        _emit_json(change.to_json())
    elif not change.written:
        _out(f"{change.key}: unchanged ({change.file})")
    elif args.config_action == "set":
        _out(f"{change.key} = {json.dumps(change.value, ensure_ascii=False)}  ({change.file})")
    else:
        _out(f"{change.key} removed  ({change.file})")


def _cmd_setup(args: "argparse.Namespace") -> int:
    from akm import api
    from akm.errors import ConfigError

    if args.config is not None and args.from_file is not None:
        from akm.codes import Code

        raise UsageError("--config and --from cannot be combined: give the config one way.", code=Code.INVALID_ARGUMENT)
    blob = None
    if args.config is not None:
        try:
            blob = json.loads(args.config)
        except ValueError as exc:
            from akm.codes import Code

            raise UsageError(
                f"Invalid JSON in --config: {getattr(exc, 'msg', exc)} "
                f"(line {getattr(exc, 'lineno', '?')}, column {getattr(exc, 'colno', '?')}).",
                code=Code.INVALID_ARGUMENT,
                hint='Pass one JSON object, e.g. --config \'{"defaults": {"llmEngine": "fast"}}\'.',
            ) from None
        if not isinstance(blob, dict):
            from akm.codes import Code

            raise ConfigError(
                f"--config must be one JSON object, not {type(blob).__name__}.", code=Code.INVALID_CONFIG_FILE
            )
    if not (args.yes or args.probe or args.config is not None or args.from_file is not None):
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            from akm.codes import Code

            raise UsageError(
                "akm setup asks questions, and there is no terminal to ask them on.",
                code=Code.NON_INTERACTIVE_REQUIRES_YES,
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


def _cmd_lint(args: argparse.Namespace) -> int:
    from akm import api
    from akm.cli.render import render_lint

    report = api.lint(args.paths)
    if args.format == "json":
        _emit_json(report.model_dump())
    else:
        _out(render_lint(report))
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
    from akm.cli.parser import split_run

    if any(t in ("-h", "--help") for t in tokens):
        return _run_help(tokens)
    target, ra = split_run(tokens)
    fmt = api.check_output_format(str(ra.controls.get("format", "text")), ("text", "json"))
    if ra.controls.get("plan"):
        if ra.controls.get("detach") or ra.controls.get("workers"):
            from akm.codes import Code

            raise UsageError(
                "--plan drives nothing (it writes nothing either); drop --detach and --workers.",
                code=Code.INVALID_ARGUMENT,
            )
        preview = api.plan_run(target, param_pairs=ra.params, new=bool(ra.controls.get("new")), from_run=_from_run(ra))
        for message in preview.warnings:
            _err(f"warning: {message}")
        if fmt == "json":
            _emit_json(preview.to_json())
        else:
            _out(render.preview_text(preview.to_json()))
        return 0

    if ra.controls.get("detach"):
        detached = api.detach_run(
            target,
            param_pairs=ra.params,
            max_steps=ra.controls.get("max-steps"),
            timeout=ra.controls.get("timeout"),
            new=bool(ra.controls.get("new")),
            from_run=_from_run(ra),
            workers=bool(ra.controls.get("workers")),
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
        from akm.codes import Code

        raise UsageError("--quiet and --verbose contradict each other; pass one.", code=Code.INVALID_ARGUMENT)
    # Progress lines go to a terminal by default; --verbose sends them anywhere (an agent's pipe, a log).
    show_progress = bool(ra.controls.get("verbose")) or sys.stderr.isatty() or os.environ.get("AKM_PROGRESS") == "1"
    if ra.controls.get("quiet"):
        show_progress = False

    reasons: dict[int, str] = {signal.SIGINT: "sigint", signal.SIGTERM: "sigterm", signal.SIGHUP: "sighup"}

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
        if show_progress and p.kind == "step_started" and p.note:
            _err(f"note: {p.note}")  # e.g. a loopback engine runs a map one unit at a time
        if not show_progress or p.kind == "step_started":
            return
        if p.kind == "unit_activity":  # what a running agent unit's CLI is doing
            from akm.report.live import activity_text
            from akm.report.timeline_svg import duration_text

            _err(f"[{p.step_id}] {p.attempt_id}: {activity_text(p)} ({duration_text(p.elapsed_s)})")
        elif p.kind == "step":
            _err(f"[{p.step_id}] step {p.status}")
        else:
            mark = "ok" if p.ok else f"FAILED ({p.failure_reason})"
            _err(f"[{p.step_id} {p.done}/{p.total}] {p.attempt_id} {mark}")

    def warning(w: Any) -> None:
        say = live.message if live is not None else _err
        say(f"warning: {w.message}")
        if w.code == "WORKFLOW_CHANGED":
            say(
                f"  hint: to run the edited file reusing every unit that did not change: akm workflow run {target} "
                f"--from {w.details['runId']} (and `akm workflow abandon {w.details['runId']}` to drop the old run)"
            )

    try:
        result = api.run_workflow(
            target,
            param_pairs=ra.params,
            max_steps=ra.controls.get("max-steps"),
            timeout=ra.controls.get("timeout"),
            new=bool(ra.controls.get("new")),
            from_run=_from_run(ra),
            workers=bool(ra.controls.get("workers")),
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


def _run_help(tokens: list[str]) -> int:
    """`workflow run --help`; with a workflow TARGET, that workflow's own params first (the catalog's
    description of it), then the run flags."""
    from akm import api
    from akm.api import split_run_args
    from akm.cli import render
    from akm.cli.parser import _RUN_HELP

    try:
        target = split_run_args(tokens).target
    except UsageError:  # half-typed params after the target: the target is still the first word
        target = tokens[0] if tokens and not tokens[0].startswith("-") else None
    entry = api.describe_workflow(target) if target is not None else None
    if entry is None or target is None:
        _out(_RUN_HELP)  # no workflow named, or a run (whose params are fixed)
        return 0
    _out(render.workflow_help(entry.to_json(), target))
    _out(_RUN_HELP[_RUN_HELP.index("Run flags:") :])  # the flags every run takes (TARGET's story is above)
    return 0


def _from_run(ra: Any) -> str | None:
    value = ra.controls.get("from")
    return None if value is None else str(value)


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
            code = follow(args.run_id, sys.stderr, api)
        except KeyboardInterrupt:
            return 130  # Ctrl-C ends a watch quietly; the run itself is not touched
    if args.format == "otlp-json":  # the run's trace, from the journal (`akm trace export RUN`)
        _emit_json(api.trace_export(args.run_id))
        return code
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
            _out(f"the run is active but nothing drives it: continue it with akm workflow run {result.run.run_id}")
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


def _cmd_rewind(args: argparse.Namespace) -> int:
    from akm import api
    from akm.cli import render

    redo: bool | list[str] = False if args.redo is None else (list(args.redo) or True)
    res = api.rewind(args.run_id, args.to_step, redo=redo).to_json()
    if args.format == "json":
        _emit_json(res)
    else:
        _out(render.rewind_text(res))
    return 0


def _cmd_trace(args: argparse.Namespace) -> int:
    """`akm trace export RUN`: OTLP/JSON of the run's trace on stdout."""
    from akm import api

    _emit_json(api.trace_export(args.run_id))
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
            from akm.codes import Code

            raise UsageError(
                f"{what} {_clip(value)}: {source} holds more than {MAX_PAYLOAD_BYTES} bytes (16 MiB), "
                "the most a report may carry; nothing was recorded. Report the path of a large output "
                "instead.",
                code=Code.RESULT_TOO_LARGE,
                details={"maxBytes": MAX_PAYLOAD_BYTES},
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        from akm.codes import Code

        raise UsageError(
            f"{what} {_clip(value)}: cannot read {_clip(source)}: {getattr(exc, 'strerror', None) or exc}.",
            code=Code.UNREADABLE_FILE,
        ) from None


def _clip(text: str) -> str:
    from akm.api import quoted

    return quoted(text)


def _cmd_report(args: argparse.Namespace) -> int:
    from akm import api
    from akm.api import MAX_UNIT_TOKENS as MAX_REPORT_TOKENS

    tokens = None
    if args.tokens is not None:
        digits = args.tokens
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 13 and int(digits) <= MAX_REPORT_TOKENS):
            from akm.api import quoted
            from akm.codes import Code

            raise UsageError(
                f"--tokens {quoted(args.tokens)}: expected a whole number from 0 to {MAX_REPORT_TOKENS}.",
                code=Code.INVALID_ARGUMENT,
            )
        tokens = int(args.tokens)
    status = args.status
    if status is None:  # what the other flags say: a failure reason is a failure, a result or verdict is done
        if args.failure_reason is not None:
            status = "failed"
        elif args.result is not None or args.verdict is not None:
            status = "completed"
        else:
            from akm.codes import Code

            raise UsageError(
                "--status is required (completed, failed or running) when neither --result, --verdict nor "
                "--failure-reason says it.",
                code=Code.INVALID_ARGUMENT,
                details={"argument": "status"},
            )
    res = api.report_unit(
        args.run_id,
        args.unit_id,
        status=status,
        attempt_id=args.attempt,
        result=_read_payload(args.result, "--result") if args.result is not None else None,
        verdict=_read_payload(args.verdict, "--verdict") if args.verdict is not None else None,
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
        elif res.get("recovery"):  # the report left the run failed or blocked: what moves it on
            from akm.cli.render import remedy_command

            _out(f"to go on: {remedy_command(res['recovery'], res['runId'])}")
            _out(f"  ({res['recovery'].get('why')})")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    import signal

    from akm import api

    cancel = api.Cancellation()
    reasons: dict[int, str] = {signal.SIGINT: "sigint", signal.SIGTERM: "sigterm", signal.SIGHUP: "sighup"}

    def on_signal(signum: int, _frame: Any) -> None:
        cancel.trip(reasons[signum])
        signal.signal(signum, signal.SIG_DFL)  # a second signal kills at once

    for signum in reasons:
        signal.signal(signum, on_signal)

    def event(e: Any) -> None:  # from unit threads too: one write per line
        if args.quiet and e.kind not in ("refused", "error"):
            return
        where = " ".join(x for x in (e.run_id, e.unit_id) if x)
        _err(f"[worker] {e.kind} {where}" + (f": {e.detail}" if e.detail else ""))

    summary = api.run_worker(
        kinds=args.kinds,
        concurrency=args.concurrency,
        project=args.project,
        idle_exit=args.idle_exit,
        poll=args.poll,
        cancel=cancel,
        on_event=event,
    )
    if args.format == "json":
        _emit_json(summary.to_json())
    else:
        _out(
            f"worker {summary.holder} on {summary.host}: {summary.claimed} claimed, {summary.finished} finished, "
            f"{summary.rejected} rejected, {summary.released} given back"
            + (f" (stopped: {summary.stop_reason})" if summary.stop_reason else "")
        )
    return api.signal_exit_status(summary.stop_reason, 0) if summary.stop_reason not in (None, "idle") else 0


def _cmd_mcp(rest: list[str]) -> int:
    """`akm mcp`: the MCP stdio server. Only this path imports `mcp` (it costs about a second)."""
    if rest in (["-h"], ["--help"]):
        from akm.cli.parser import MCP_HELP

        _out(MCP_HELP.rstrip("\n"))
        return 0
    if rest:
        _err(f"error[USAGE]: akm mcp takes no arguments (got {' '.join(rest)})")
        return EXIT_USAGE
    for fd, stream, name in ((0, sys.stdin, "stdin"), (1, sys.stdout, "stdout")):
        try:
            os.fstat(fd)
        except OSError:
            stream = None
        if stream is None:
            from akm.codes import Code

            raise UsageError(
                f"akm mcp speaks MCP over stdin and stdout, and its {name} is closed; start it from an MCP client "
                "(e.g. `claude mcp add akm -- /path/to/akm mcp`).",
                code=Code.MCP_NO_STDIO,
            )
    from akm.mcp import serve

    return serve()
