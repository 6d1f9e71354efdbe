"""The HTML report as headless Chromium lays it out and paints it (issue 39): long step ids fit their graph
boxes, a session unit's duration is not "0 ms", and the timeline's axis speaks one unit.

tests/test_report_html.py reads the DOM Chromium built; these read what it drew — element geometry from the
browser's own layout, and the pixels of a screenshot (tests/browser.py) — since markup can be right while
a label runs out of its box.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.browser import render
from tests.helpers import py, write_wf

LONG = "prepare_the_customer_release_notes_draft"  # 40 characters: the longest label shown whole
LONGER = "summarise_every_open_incident_for_the_weekly_review"  # 51: cut with an ellipsis


def page_of(cli, rid: str, tmp_path: Path, name: str) -> Path:
    page = tmp_path / f"{name}.html"
    page.write_text(cli("workflow", "status", rid, "--format", "html", check=0).stdout, encoding="utf-8")
    return page


# Each graph node: its box, and its first label's extent and text (the browser's own layout, page coords).
NODES = """JSON.stringify([...document.querySelectorAll('svg.graph g.node')].map(g => {
  const box = g.querySelector('rect:not(clipPath rect), polygon').getBoundingClientRect();
  const label = g.querySelector('text');
  const t = label.getBoundingClientRect();
  return {step: g.dataset.step, text: label.textContent,
          box: [box.left + scrollX, box.top + scrollY, box.right + scrollX, box.bottom + scrollY],
          label: [t.left + scrollX, t.top + scrollY, t.right + scrollX, t.bottom + scrollY]};
}))"""


def test_long_step_ids_fit_their_boxes_in_the_graph(cli, project, tmp_path):
    write_wf(
        project,
        "long.md",
        f"""
        steps:
          - id: {LONG}
            unit: {{ exec: {{ command: {py("print('notes')")} }} }}
          - id: {LONGER}
            unit: {{ exec: {{ command: {py("print('summary')")} }} }}
          - id: ok
            unit: {{ exec: {{ command: {py("print('done')")} }} }}
        """,
        f"## {LONG}\n\nWrite.\n\n## {LONGER}\n\nSum up.\n\n## ok\n\nEnd.",
    )
    rid = cli.json("workflow", "run", "long.md")["run"]["runId"]
    shown = render(page_of(cli, rid, tmp_path, "long"), NODES)
    nodes = {n["step"]: n for n in json.loads(shown.probe)}
    assert nodes[LONG]["text"] == LONG  # whole
    assert nodes[LONGER]["text"].endswith("…") and LONGER.startswith(nodes[LONGER]["text"][:-1])
    png = shown.screenshot
    for step, n in nodes.items():
        left, top, right, bottom = n["box"]
        t_left, t_top, t_right, t_bottom = n["label"]
        # layout: the label lies inside its box, with room to spare
        assert left + 2 <= t_left and t_right <= right - 2, (step, n)
        # paint: the label's ink is inside the box, none in the strips either side of it on its line
        assert png.dark_pixels(left, t_top, right, t_bottom) > 20, (step, "no label drawn")
        assert png.dark_pixels(left - 24, t_top, left - 2, t_bottom) == 0, (step, "ink left of the box")
        assert png.dark_pixels(right + 2, t_top, right + 24, t_bottom) == 0, (step, "ink right of the box")


UNITS = """JSON.stringify([...document.querySelectorAll('tr.unit')].map(tr => ({
  unit: tr.dataset.unit, cells: [...tr.cells].map(c => c.innerText.trim()),
  box: (r => [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY])(tr.cells[3].getBoundingClientRect())
})))"""


def test_a_session_units_duration_is_not_zero_ms(cli, project, tmp_path):
    write_wf(project, "s.md", "steps:\n  - id: draft\n  - id: polish", "## draft\n\nDraft.\n\n## polish\n\nPolish.")
    rid = cli.json("workflow", "run", "s.md", check=3)["run"]["runId"]
    cli("workflow", "report", rid, "draft:solo", "--result", "a draft", check=0)  # unclaimed: not timed
    cli("workflow", "run", rid, check=3)
    cli("workflow", "report", rid, "polish:solo", "--status", "running", check=0)  # claimed: timed from here
    time.sleep(0.01)  # the claim and the result at least this far apart: within one millisecond reads as untimed
    cli("workflow", "report", rid, "polish:solo", "--result", "polished", check=0)
    shown = render(page_of(cli, rid, tmp_path, "session"), UNITS)
    rows = {r["unit"]: r for r in json.loads(shown.probe)}
    took = {u: r["cells"][3] for u, r in rows.items()}
    assert took["draft:solo"] == "not timed (done in the agent's session)", took
    assert took["polish:solo"].endswith((" ms", " s")) and "not timed" not in took["polish:solo"], took
    assert "0 ms" != took["draft:solo"]
    cell = rows["draft:solo"]["box"]
    assert shown.screenshot.dark_pixels(*cell) > 50  # the words are drawn in their cell


AXIS = """JSON.stringify([...document.querySelectorAll('svg.timeline > text')].map(t => {
  const r = t.getBoundingClientRect();
  return {text: t.textContent, box: [r.left, r.right]};
}))"""


def test_the_timeline_axis_speaks_one_unit(cli, project, tmp_path):
    # A run of more than a second: the old axis read "0 ms, 240 ms, … 1.2 s" across its ticks.
    write_wf(
        project,
        "t.md",
        f"""
        steps:
          - id: wait
            unit: {{ exec: {{ command: {py("import time; time.sleep(1.2)")} }} }}
          - id: after
            unit: {{ exec: {{ command: {py("print(1)")} }} }}
        """,
        "## wait\n\nWait.\n\n## after\n\nAfter.",
    )
    rid = cli.json("workflow", "run", "t.md")["run"]["runId"]
    shown = render(page_of(cli, rid, tmp_path, "timeline"), AXIS)
    ticks = json.loads(shown.probe)
    labels = [t["text"] for t in ticks]
    assert len(labels) >= 3, labels
    units = {label.split()[-1] for label in labels}
    assert len(units) == 1 and units <= {"s", "min", "h"}, labels  # one unit, and not ms for a 1 s+ run
    values = [float(label.split()[0]) for label in labels]
    assert values[0] == 0 and values == sorted(values) and len(set(values)) == len(values), labels
    steps = {round(b - a, 6) for a, b in zip(values, values[1:], strict=False)}
    assert len(steps) == 1, labels  # evenly spaced, round
    boxes = [t["box"] for t in ticks]
    assert all(a[1] < b[0] for a, b in zip(boxes, boxes[1:], strict=False)), boxes  # laid out apart, none over another
