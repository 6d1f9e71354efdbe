"""The CLI reference spec/cli.md is generated from the parser and kept equal to it (issue 36 item 7), as
spec/errors.md is from `akm.codes`; `akm --help` lists every command, `mcp` included."""

from __future__ import annotations

import argparse

from akm.cli import reference
from akm.cli.parser import _build_parser
from tests.helpers import ROOT


def test_spec_cli_md_is_generated_from_the_parser():
    assert (ROOT / "spec" / "cli.md").read_text(encoding="utf-8") == reference.render_cli_md(), (
        "spec/cli.md is stale: python -m akm.cli.reference > spec/cli.md"
    )


def test_the_reference_has_every_command_and_every_flag():
    text = reference.render_cli_md()

    def walk(prog: str, parser: argparse.ArgumentParser) -> None:
        assert f"## `{prog}`" in text, prog
        if prog not in reference._OWN_HELP:
            for action in parser._actions:
                for flag in action.option_strings:
                    assert flag in text, (prog, flag)
        for name, _, sub in reference._subcommands(parser):
            walk(f"{prog} {name}", sub)

    walk("akm", _build_parser())
    for flag in ("--from RUN", "--plan", "--max-steps N", "--detach", "--workers"):
        assert flag in text  # `workflow run`, answered before argparse, is quoted whole


def test_akm_help_lists_mcp(akm):
    out = akm("--help", check=0).stdout
    commands = out[out.index("COMMAND") :]
    for name in ("workflow", "mcp", "config", "setup", "worker", "log"):
        assert f"\n    {name} " in commands or f"\n    {name}\n" in commands, (name, out)
    assert "MCP" in out
    assert akm("mcp", "--help", check=0).stdout.startswith("usage: akm mcp")
