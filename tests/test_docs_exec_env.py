"""spec/engine.md "Exec units" promises which AKM_* context a command sees.

It says the AKM_* context is applied *last* and that `AKM_ITEM`/`AKM_ITEM_INDEX` are set for
map units and `AKM_INPUTS` only "when the step declares `inputs`". With `inherit_env: true`
a stale `AKM_ITEM`/`AKM_INPUTS` in akm's own environment (e.g. akm started from an exec unit
of an outer run) leaks into a solo unit with no inputs, so the unit cannot tell that it is
not a map item. These tests drive the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKFLOW = """---
steps:
  - id: solo
    unit:
      exec:
        inherit_env: true
        command:
          - python3
          - -c
          - |
            import json, os
            print(json.dumps(sorted(k for k in ("AKM_ITEM", "AKM_ITEM_INDEX", "AKM_INPUTS") if k in os.environ)))
    output: { type: array }
---
## solo

Report which per-item / input context variables are present.
"""


def _run(tmp_path: Path, extra_env: dict[str, str]) -> dict:
    wf = tmp_path / "solo.md"
    wf.write_text(WORKFLOW, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra_env)
    proc = subprocess.run(
        [sys.executable, "-m", "akm", "workflow", "run", str(wf), "--format", "json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_clean_parent_env_gives_a_solo_unit_no_item_or_inputs(tmp_path):
    # Control: the documented behaviour when akm's own environment is clean.
    data = _run(tmp_path, {})
    assert data["run"]["steps"][0]["output"] == []


def test_inherited_stale_item_and_inputs_do_not_reach_a_solo_unit(tmp_path):
    # akm launched from inside an outer run's map unit (nested workflow) carries its context.
    data = _run(tmp_path, {"AKM_ITEM": '"outer-item"', "AKM_ITEM_INDEX": "7", "AKM_INPUTS": '{"x":1}'})
    assert data["run"]["steps"][0]["output"] == [], (
        "spec/engine.md: AKM_ITEM/AKM_ITEM_INDEX are for map units and AKM_INPUTS only when the step "
        "declares inputs; inherit_env must not leak a parent's stale per-unit context"
    )
