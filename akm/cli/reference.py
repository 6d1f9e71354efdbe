"""spec/cli.md, generated from the argparse parser: every command, its arguments and their help.

Why generated: a hand-written reference drifts from the parser the day a flag is added; this one is rendered
from `_build_parser` itself (`python -m akm.cli.reference > spec/cli.md`) and tests/test_cli_reference.py
checks the file matches. `workflow run` and `mcp` are answered before argparse sees them (a workflow's params
are its own flags; the protocol owns the streams), so their help texts are quoted as the commands print them.
"""

from __future__ import annotations

import argparse

from akm.cli.parser import _RUN_HELP, MCP_HELP, _build_parser

# Commands whose help is their own text, not argparse's (see the module docstring).
_OWN_HELP = {"akm workflow run": _RUN_HELP, "akm mcp": MCP_HELP}


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order `--help` lists them."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sp) for name, sp in action.choices.items()]
    return out


def _argument(action: argparse.Action) -> str:
    """How an argument is typed: `RUN`, `--format {text,json}`, `--redo [UNIT ...]`, `--yes, -y`."""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        value = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    if action.nargs in ("*", "?"):
        value = f"[{value} ...]" if action.nargs == "*" else f"[{value}]"
    elif action.nargs == "+":
        value = f"{value} [{value} ...]"
    if not action.option_strings:
        return value
    flags = ", ".join(action.option_strings)
    return flags if action.nargs == 0 else f"{flags} {value}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _description(parser: argparse.ArgumentParser, summary: str) -> list[str]:
    """The command's description (else its summary): as written when the parser keeps its layout, else joined."""
    description = parser.description or summary
    if not description:
        return []
    if parser.formatter_class is argparse.RawDescriptionHelpFormatter:
        return ["```text", description.rstrip("\n"), "```", ""]
    return [" ".join(description.split()), ""]


def _argument_table(parser: argparse.ArgumentParser) -> list[str]:
    """A row per argument the help shows (a required option says so), or nothing when it takes none."""
    rows = [
        (a, a.help or "")
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS
    ]
    if not rows:
        return []
    lines = ["| argument | meaning |", "|---|---|"]
    for action, text in rows:
        if action.required and action.option_strings:
            text += " (required)"
        lines.append(f"| `{_cell(_argument(action))}` | {_cell(text)} |")
    return lines + [""]


def _section(prog: str, summary: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"## `{prog}`", ""]
    own = _OWN_HELP.get(prog)
    if own is not None:
        return lines + ["```text", own.rstrip("\n"), "```", ""]
    lines += _description(parser, summary)
    lines += _argument_table(parser)
    subs = _subcommands(parser)
    if subs:
        lines += ["| command | what it does |", "|---|---|"]
        lines += [f"| [`{prog} {name}`](#{_anchor(f'{prog} {name}')}) | {_cell(text)} |" for name, text, _ in subs]
        lines.append("")
    if parser.epilog:
        lines += [" ".join(parser.epilog.split()), ""]
    return lines


def _anchor(prog: str) -> str:
    """GitHub's anchor of a `## \\`prog\\`` heading."""
    return prog.replace(" ", "-")


def _walk(prog: str, summary: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = _section(prog, summary, parser)
    for name, text, sub in _subcommands(parser):
        lines += _walk(f"{prog} {name}", text, sub)
    return lines


def render_cli_md() -> str:
    """spec/cli.md: the parser's commands and arguments as markdown (tests/test_cli_reference.py checks it)."""
    lines = [
        "# The command line",
        "",
        "Generated from the argparse parser (`akm/cli/parser.py`) by `python -m akm.cli.reference > spec/cli.md`;",
        "a test keeps them equal. Every command prints the same with `--help`. Exit statuses and error codes:",
        "[errors.md](errors.md); the long guide: [usage.md](usage.md).",
        "",
    ]
    lines += _walk("akm", "", _build_parser())
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_cli_md())
