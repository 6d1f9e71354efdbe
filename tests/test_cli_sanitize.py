"""Unit output reaches a terminal inert; mermaid output is escaped and draws routes as branches (issue 6 item 13)."""

from __future__ import annotations

import json
import re
import shutil

from tests.helpers import ROOT

HOSTILE = """\
---
steps:
  - id: loud
    unit:
      exec:
        command: [python3, -c, "import json; print(json.dumps('\\\\x1b]0;pwned\\\\x07\\\\x1b[2J\\\\rover\\\\u202etxt.exe\\\\x9b31m'))"]
    output: { type: string }
  - id: bad
    unit:
      exec:
        command: [python3, -c, "import sys; sys.stderr.write('\\\\x1b[31mred alert\\\\x1b[0m'); sys.exit(4)"]
    output: { type: string }
---
## loud
l
## bad
b
"""

ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_text_output_never_carries_terminal_control_characters(cli, project):
    (project / "h.md").write_text(HOSTILE)
    proc = cli("workflow", "run", "h.md", check=1)
    for stream in (proc.stdout, proc.stderr):
        assert not ACTIVE.search(stream), repr(stream)
    assert "\\x1b]0;pwned" in proc.stdout and "\\u202etxt.exe" in proc.stdout  # shown, not acted on
    assert "\\x1b[31mred alert" in proc.stdout  # the failure diagnostic too
    run_id = proc.stdout.split()[1]
    status = cli("workflow", "status", run_id, check=0).stdout
    assert not ACTIVE.search(status) and "pwned" in status


def test_json_output_escapes_them_and_keeps_the_values(cli, project):
    (project / "h.md").write_text(HOSTILE)
    proc = cli("workflow", "run", "h.md", "--format", "json", check=1)
    assert not ACTIVE.search(proc.stdout), repr(proc.stdout)
    loud = next(s for s in json.loads(proc.stdout)["run"]["steps"] if s["id"] == "loud")
    assert loud["output"] == "\x1b]0;pwned\x07\x1b[2J\rover\u202etxt.exe\x9b31m"  # same value, safely spelled


ROUTES = """\
---
params:
  mode: { type: string }
steps:
  - id: pick
    route:
      input: params.mode
      when:
        - { match: 'say "hi"', step: quote }
        - { match: "<b>bold</b> & #1", step: html }
      default: other
  - id: quote
    unit: { exec: { command: [python3, -c, "print(1)"] } }
  - id: html
    unit: { exec: { command: [python3, -c, "print(2)"] } }
  - id: other
    unit: { exec: { command: [python3, -c, "print(3)"] } }
  - id: last
    unit: { exec: { command: [python3, -c, "print(4)"] } }
---
## quote
q
## html
h
## other
o
## last
l
"""


def _edges(mermaid: str) -> set[tuple[str, str]]:
    return {(m.group(1), m.group(2)) for m in re.finditer(r"^\s+(s\d+) .*?(s\d+)$", mermaid, re.M)}


def test_mermaid_escapes_labels_and_draws_route_targets_as_branches(cli, project):
    (project / "r.md").write_text(ROUTES)
    run_id = cli.json("workflow", "run", "r.md", "--mode", "x")["run"]["runId"]
    mer = cli("workflow", "status", run_id, "--format", "mermaid", check=0).stdout
    assert '"say #quot;hi#quot;"' in mer, mer
    assert "#lt;b#gt;bold#lt;/b#gt; #amp; #35;1" in mer and "<b>" not in mer
    edges = _edges(mer)
    # s0 pick, s1 quote, s2 html, s3 other, s4 last: each branch rejoins at `last`, none chains to a sibling
    assert {("s0", "s1"), ("s0", "s2"), ("s0", "s3")} <= edges
    assert {("s1", "s4"), ("s2", "s4"), ("s3", "s4")} <= edges
    assert not {("s1", "s2"), ("s2", "s3"), ("s1", "s3")} & edges, mer


def test_hello_branches_do_not_chain(cli, project):
    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    run_id = cli.json("workflow", "run", "hello.md")["run"]["runId"]
    mer = cli("workflow", "status", run_id, "--format", "mermaid", check=0).stdout
    assert ("s4", "s5") not in _edges(mer), mer  # small-party and big-party are alternatives


def test_mermaid_labels_stay_on_one_line():
    from akm.cli.render import _mermaid_text

    assert _mermaid_text('two\nlines\r"q"') == "two lines #quot;q#quot;"
