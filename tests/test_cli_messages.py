"""error and failure messages that hide or misstate what is wrong."""

from __future__ import annotations

import shutil

from tests.helpers import ROOT

MISSING_BINARY = """\
---
steps:
  - id: a
    unit:
      exec: { command: [no-such-binary-xyz-123] }
    output: { type: integer }
---
## a
run a missing program
"""

BIG_INT = """\
---
params:
  k: { type: integer }
steps:
  - id: a
    unit:
      exec: { command: [python3, -c, "print(1)"] }
    output: { type: integer }
---
## a
a
"""


def test_text_output_shows_the_failure_cause_unclipped(akm, project):
    """The text view clips the step note at ~160 chars, mid-word: the user sees
    `could not start "no-su` and never learns which program was missing."""
    (project / "m.md").write_text(MISSING_BINARY)
    proc = akm("workflow", "run", "m.md", check=1)
    assert "no-such-binary-xyz-123" in proc.stdout + proc.stderr, proc.stdout
    status = akm("workflow", "status", akm.json("workflow", "list")["runs"][0]["runId"], check=0)
    assert "no-such-binary-xyz-123" in status.stdout, status.stdout


def test_integer_beyond_the_safe_range_is_not_called_a_non_integer(akm, project):
    """`--k 9007199254740993` said `--k must be integer; received "9007199254740993"` — it is an
    integer; the real (undocumented) problem is the 2^53 range."""
    (project / "b.md").write_text(BIG_INT)
    proc = akm("workflow", "run", "b.md", "--k", "9007199254740993", check=2)
    assert "must be integer" not in proc.stderr, proc.stderr
    assert "range" in proc.stderr.lower() or "maximum" in proc.stderr.lower() or "2^53" in proc.stderr, proc.stderr


def test_over_long_timeout_is_not_called_malformed(akm, project):
    """`--timeout 99999999999s` is a well-formed duration that is too long, but the message says
    `expected a duration like 500ms, 30s or 5m`."""
    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    proc = akm("workflow", "run", "hello.md", "--timeout", "99999999999s", check=2)
    assert "expected a duration like" not in proc.stderr, proc.stderr


def test_rerun_after_editing_the_file_warns_that_the_old_plan_is_used(akm, project):
    """README: re-running the same command continues the active run (its frozen plan). After editing the
    file, the re-run silently produced the OLD output with `warnings: []` — no hint the edit was ignored."""
    wf = project / "hello.md"
    shutil.copy(ROOT / "examples" / "hello.md", wf)
    akm("workflow", "run", "hello.md", "--max-steps", "1", check=4)
    wf.write_text(wf.read_text().replace("Tea for a few.", "Coffee for a few."))
    proc = akm("workflow", "run", "hello.md", "--format", "json", check=0)
    import json

    res = json.loads(proc.stdout)
    said = " ".join(res.get("warnings", [])) + proc.stderr
    assert "changed" in said.lower() or "frozen" in said.lower() or "differ" in said.lower(), said
