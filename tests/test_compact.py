"""akm.mcp.compact: MCP answers stay under 64 KB; whatever is clipped says its size and how to fetch it whole."""

from __future__ import annotations

import json

from akm import api
from akm.mcp.compact import ANSWER_LIMIT, compact_brief, size_of
from tests.test_session import start


def test_a_wide_fan_out_brief_lists_what_fits_and_says_the_rest_follows(project):
    items = [f"file-{i:04d}.py " + "y" * 300 for i in range(600)]
    rid = start(
        project,
        "params:\n  xs: { type: array }\nsteps:\n  - id: m\n    map: { over: params.xs }",
        "## m\n\nReview it.",
        xs=items,
    )
    brief = api.next_brief(rid).to_json()
    assert size_of(brief) > ANSWER_LIMIT
    small = compact_brief(json.loads(json.dumps(brief)))
    assert size_of(small) <= ANSWER_LIMIT
    assert 0 < small["unitsListed"] == len(small["units"]) < 600
    assert small["unitCount"] == 600 and any("workflow_next" in w for w in small["warnings"])
    assert [u["unitId"] for u in small["units"]] == [u["unitId"] for u in brief["units"][: len(small["units"])]]
