"""The command line's grammar: the argparse builders for every command but `workflow run`, and the
splitting of `workflow run` arguments (a workflow's params are its own flags, which argparse cannot know).

Only the standard library and `akm.errors` at top level; argparse itself is imported when a parser is built,
so `akm --version` and a run never pay for it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from akm.api import RunArgs

from akm import __version__
from akm.errors import UsageError

_RUN_HELP = """\
usage: akm workflow run TARGET [--<param> VALUE ...] [--new | --from RUN] [--plan] [--max-steps N]
                        [--timeout DUR] [--detach] [--workers] [--format text|json] [--quiet] [--verbose]

Start or continue a workflow run and drive it as far as it can go.

TARGET is a workflow file path, a workflows/<name> ref (.akm/workflows/ of the
project, then the user library) or an existing run id: whole, its first 6 or
more characters, or @last (the newest run of this project).

Which run: a workflow TARGET continues the active run of the same workflow in
this project with the same params (after defaults), with the plan it froze
even if the file was edited since (a warning says so); otherwise it starts a
new run. Runs with other params live side by side.

Params: every declared param is a flag after TARGET: --name value, --name=value,
a bare --name (true), repeat for arrays or pass JSON ([..], {..}).

Run flags:
  --new           always start a new run (e.g. to run an edited file)
  --from RUN      start a new run of the (edited) workflow that reuses every completed
                  unit of RUN whose identity (step definition and inputs) is unchanged:
                  no process, no model call, no tokens for them; the rest runs
  --plan          preview, writing nothing: per step the units reused, to run and for
                  the calling agent, engines and models, budgets, what would run first
  --max-steps N   finish at most N steps in this invocation (exit 4 if more remain)
  --timeout DUR   stop after DUR (500ms, 30s, 5m); the run stays active
  --detach        drive the run in the background: print the run id at once and
                  log to <data dir>/logs/RUN.log; `akm workflow wait RUN` waits
  --workers       coordinate only: queue exec, LLM and agent units for `akm worker`
                  processes (any host sharing the journal) and wait for their results
  --format F      text (default) or json
  --quiet, -q     no progress at all
  --verbose       a progress line per finished unit on stderr, terminal or not
                  (by default a terminal gets a board of steps redrawn in place)
  --help, -h      this help
These names are reserved: a param of the same name cannot be set on the CLI.

Exit status: 0 completed, 1 failed/blocked/timed out (or what was named does not
exist), 2 refused with nothing changed (bad input, or not possible now: another
driver holds the run, it is not active), 3 awaiting the calling agent (session
units), 4 stopped at --max-steps, 78 configuration or environment,
130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP.
"""


MCP_HELP = """\
usage: akm mcp

Serve akm's tools over the Model Context Protocol on stdin/stdout, e.g.
  claude mcp add akm -- /path/to/akm mcp
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
            from akm.codes import Code

            raise UsageError(f"{self.prog}: {message}", code=Code.USAGE, hint=f"See `{self.prog} --help`.")

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
    wf.set_defaults(workflow_parser=wf)  # what a bare `akm workflow` prints the help of
    # answered before parsing (`akm.cli.main`): the protocol owns the streams; listed here for `akm --help`
    sub.add_parser(
        "mcp",
        help="serve akm's tools to a coding agent over MCP on stdin/stdout",
        description=MCP_HELP.split("\n\n", 1)[1].strip(),
        add_help=False,
    )
    wsub = wf.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    run_id_help = "a run id (from `akm workflow list` or a run's output), its first 6+ characters, or @last"

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
    fmt(st, ("text", "json", "mermaid", "html", "otlp-json"))

    for name, text in (
        ("resume", "reopen a failed or blocked run (completed units are kept)"),
        ("abandon", "give up on a run for good: stops it at once; it can never be resumed"),
    ):
        sp = add(name, text)
        sp.add_argument("run_id", metavar="RUN", help=run_id_help)
        fmt(sp)

    rw = add(
        "rewind",
        "take a run back to a step: it and every later step are reopened (history is kept, unchanged units reused)",
    )
    rw.add_argument("run_id", metavar="RUN", help=run_id_help)
    rw.add_argument("--to", dest="to_step", metavar="STEP", required=True, help="the step to go back to")
    rw.add_argument(
        "--redo",
        nargs="*",
        metavar="UNIT",
        help="redo units instead of reusing them: every unit of the reopened steps, or only the UNITs named "
        "(the step's own session units are always asked for again)",
    )
    fmt(rw)
    rw.epilog = (
        "Works on a completed, failed, blocked or active run (not an abandoned one, nor one a driver holds). "
        "Then `akm workflow run RUN` goes on from STEP: units whose identity (step definition and inputs) is "
        "unchanged are restored instead of run."
    )

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
        help="completed (with --result), failed (with --failure-reason), or running (claim it); without "
        "it, --failure-reason means failed and --result or --verdict completed",
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

    wk = sub.add_parser(
        "worker",
        help="run queued units of active runs (`workflow run --workers`), on this or any host",
        description="Claim queued units of active runs that this host can run, run them and journal their "
        "results, until stopped (SIGINT/SIGTERM give unfinished units back to the queue). Share the journal "
        "between hosts with AKM_JOURNAL_URL (PostgreSQL).",
    )
    wk.add_argument("--kinds", metavar="K,K", help="unit kinds to take: exec, llm, agent (default: all three)")
    wk.add_argument("--concurrency", metavar="N", help="units at once (default: max(2, CPUs))")
    wk.add_argument("--project", metavar="DIR", help="the project checkout units run in (default: this directory)")
    wk.add_argument("--idle-exit", metavar="DUR", help="exit after DUR (30s, 5m) with nothing to do (default: never)")
    wk.add_argument("--poll", metavar="DUR", help="how often to look for queued units (default 1s)")
    wk.add_argument("--quiet", "-q", action="store_true", help="no line per claimed or finished unit on stderr")
    fmt(wk)

    tr = sub.add_parser(
        "trace",
        help="a run's trace for OpenTelemetry backends",
        description="`akm trace export RUN`: the run's trace as OTLP/JSON (an ExportTraceServiceRequest) on "
        "stdout, written from the journal — for runs that ran with no collector (spec/telemetry.md).",
    )
    tsub = tr.add_subparsers(dest="trace_action", metavar="ACTION", parser_class=type(tr))
    tx = tsub.add_parser(
        "export",
        help="write a run's trace as OTLP/JSON from the journal",
        description="Write the run's trace (its ended stretches: a root span per stretch, a span per step and "
        "per unit attempt) as one OTLP/JSON ExportTraceServiceRequest on stdout; post it to a collector's "
        "/v1/traces or load it into a backend.",
    )
    tx.add_argument("run_id", metavar="RUN", help="the run id: whole, a unique prefix, or @last")
    tx.add_argument(
        "--format",
        choices=("otlp-json", "json"),
        default="otlp-json",
        help="otlp-json (default; json is the same document)",
    )

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


def split_run(tokens: list[str]) -> "tuple[str, RunArgs]":
    """`workflow run` tokens (after the subcommand) split into TARGET, run flags and param flags; a run
    needs a TARGET, so it is returned apart (typed as present)."""
    from akm.api import split_run_args

    ra = split_run_args(tokens)
    if ra.target is None:
        from akm.codes import Code

        raise UsageError(
            "workflow run needs a TARGET (a workflow file, workflows/<name> or a run id).",
            code=Code.USAGE,
            hint="See `akm workflow run --help`.",
        )
    return ra.target, ra
