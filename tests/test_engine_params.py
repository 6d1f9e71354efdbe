"""params given as a dict (the MCP/API path) are never validated at start."""

from __future__ import annotations

import pytest

from akm import api
from akm.errors import AkmError
from tests.helpers import py, run, write_wf


def test_api_params_dict_is_validated_before_the_run_is_created(project):
    wf = write_wf(
        project,
        "typed.md",
        f"""
        params:
          n: {{ type: integer }}
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("print(1)")} }} }}
        """,
        "## a\n\nx",
    )
    with pytest.raises(AkmError) as exc:
        run(wf, project, params={"n": "not-a-number"})
    # A bad param is the caller's usage error, not a "corrupt run" ...
    assert (exc.value.code, exc.value.exit_status) == ("INVALID_PARAMS", 2)
    assert exc.value.message == "Invalid param value: params.n: expected type integer, got string"
    # ... and no half-born active run may be left behind blocking the workflow.
    assert api.list_runs(active_only=True, cwd=str(project)).runs == []


def test_api_params_dict_rejects_undeclared_names(project):
    wf = write_wf(
        project,
        "typed2.md",
        f"""
        params:
          n: {{ type: integer }}
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("print(1)")} }} }}
        """,
        "## a\n\nx",
    )
    with pytest.raises(AkmError) as exc:
        run(wf, project, params={"typo_n": 3})
    assert (exc.value.code, exc.value.exit_status) == ("INVALID_PARAMS", 2)
    assert "Unknown param(s) 'typo_n'" in exc.value.message
