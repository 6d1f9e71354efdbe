"""Text output stays readable with huge values (issue 23 item 8): long params and outputs are summarised."""

from __future__ import annotations

import json

from akm import api
from akm.cli import main

WF = """\
---
params:
  items: { type: array }
  who: { type: string }
steps:
  - id: a
    unit:
      exec:
        command: ["python3", "-c", "print('x' * 200000)"]
---

## a

x
"""


def test_status_text_summarises_a_10000_item_param_and_a_long_output(tmp_path, monkeypatch, capsys):
    project = tmp_path / "p"
    project.mkdir()
    (project / "wf.md").write_text(WF, encoding="utf-8")
    monkeypatch.chdir(project)
    run_id = api.run_workflow("wf.md", params={"items": list(range(10_000)), "who": "ann"}, cwd=str(project)).run.run_id
    assert main(["workflow", "status", run_id]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 4100  # the run's result keeps its 4000 characters
    params = next(line for line in out.splitlines() if line.startswith("params: "))
    assert len(params) < 300
    assert params.startswith("params: items=[0, 1, 2,") and "… (10000 items)" in params
    assert 'who="ann"' in params
    assert f"all of them: akm workflow status {run_id} --format json" in out
    assert main(["workflow", "status", run_id, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"]["items"] == list(range(10_000))  # whole in JSON


def test_short_params_are_shown_whole(tmp_path, monkeypatch, capsys):
    project = tmp_path / "p"
    project.mkdir()
    (project / "wf.md").write_text(WF.replace("print('x' * 200000)", "print(1)"), encoding="utf-8")
    monkeypatch.chdir(project)
    run_id = api.run_workflow("wf.md", params={"items": [1, 2], "who": "ann"}, cwd=str(project)).run.run_id
    assert main(["workflow", "status", run_id]) == 0
    out = capsys.readouterr().out
    assert 'params: {"items": [1, 2], "who": "ann"}' in out and "clipped" not in out
