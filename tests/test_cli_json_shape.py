"""`workflow run --format json` against the shape spec/engine.md §6 documents."""

from __future__ import annotations

import shutil

from tests.helpers import ROOT


def test_run_result_has_every_documented_top_level_key(akm, project):
    """engine.md §6 lists `aborted`, `timedOut`, `abortReason` in the one result object; on a normal
    run they are absent, so `res["timedOut"]` raises KeyError in a client written from the doc."""
    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    res = akm.json("workflow", "run", "hello.md", "--count", "1")
    documented = {
        "run",
        "executed",
        "stepsProcessed",
        "done",
        "started",
        "aborted",
        "timedOut",
        "abortReason",
        "warnings",
    }
    assert documented <= set(res), f"missing: {sorted(documented - set(res))}"
