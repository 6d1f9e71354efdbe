"""The step graph of a run as inline SVG, laid out by akm itself (no graph library, no browser script).

Input: `api.run_graph(...).to_json()` — nodes in plan order, edges from
`akm.plan.flow`. Steps run top to bottom, one row each, except that the
targets of one route are alternatives and share a row side by side (the
branches). An edge to the next row is a short curve; an edge that skips rows
(past a branch it does not take) runs down the right-hand side, right of
every row, so it never crosses a node. Uncertain edges (the target runs only if a route picks it) are
dashed; route edges carry their match value. Skipped steps are greyed out.
Each node links to its step's section of the report (`#step-<index>`).
"""

from __future__ import annotations

from typing import Any

from akm.report.escape import esc, short

NODE_W, NODE_H = 190, 46
GAP_X, GAP_Y = 28, 54
MARGIN = 16
# A node is as wide as its step id needs (13 px bold sans-serif: at most ~8.6 px a character, measured on
# DejaVu Sans Bold, the widest common face) up to LABEL_MAX characters; a longer id is cut with an ellipsis
# (its whole id is in the node's tooltip and the step's section). Issue 39: long ids overflowed the boxes.
CHAR_W = 8.6
LABEL_MAX = 40
NODE_PAD = 24

FILL = {
    "completed": "#c8e6c9",
    "running": "#bbdefb",
    "failed": "#ffcdd2",
    "blocked": "#ffe0b2",
    "skipped": "#eeeeee",
    "pending": "#ffffff",
    "awaiting_session": "#fff9c4",
}


def _rows(graph: dict[str, Any]) -> list[list[str]]:
    """Node ids by row: plan order, except that one route's targets share a row."""
    known = {n["id"] for n in graph["nodes"]}
    groups: dict[str, list[str]] = {}
    for e in graph["edges"]:
        if e.get("label") is not None and e["target"] in known:
            targets = groups.setdefault(e["source"], [])
            if e["target"] not in targets:
                targets.append(e["target"])
    order = {n["id"]: i for i, n in enumerate(graph["nodes"])}
    rows: list[list[str]] = []
    placed: set[str] = set()
    for n in graph["nodes"]:
        if n["id"] in placed:
            continue
        group = next((ts for ts in groups.values() if n["id"] in ts), None)
        row = sorted((t for t in group if t not in placed), key=order.__getitem__) if group else [n["id"]]
        rows.append(row)
        placed.update(row)
    return rows


def _node_width(graph: dict[str, Any]) -> int:
    """One width for every node (rows stay aligned): the widest label's, at least NODE_W."""
    longest = max((len(short(n["id"], LABEL_MAX)) for n in graph["nodes"]), default=0)
    return max(NODE_W, int(longest * CHAR_W + NODE_PAD + 0.5))


def graph_svg(graph: dict[str, Any], anchors: dict[str, str] | None = None) -> str:
    """The SVG element (a string) for `graph`; `anchors` maps a step id to its section's fragment id."""
    anchors = anchors or {}
    nodes = {n["id"]: n for n in graph["nodes"]}
    rows = _rows(graph)
    node_w = _node_width(graph)
    widest = max((len(r) for r in rows), default=1)
    content_w = widest * node_w + (widest - 1) * GAP_X
    pos: dict[str, tuple[float, float, int]] = {}  # id -> (left x, top y, row)
    for r, row in enumerate(rows):
        row_w = len(row) * node_w + (len(row) - 1) * GAP_X
        left = MARGIN + (content_w - row_w) / 2
        for c, node_id in enumerate(row):
            pos[node_id] = (left + c * (node_w + GAP_X), MARGIN + r * (NODE_H + GAP_Y), r)
    long_edges = [
        e
        for e in graph["edges"]
        if e["source"] in pos and e["target"] in pos and pos[e["target"]][2] - pos[e["source"]][2] > 1
    ]
    side = MARGIN + content_w + 24
    width = side + 14 * len(long_edges) + 40
    height = MARGIN * 2 + len(rows) * NODE_H + max(0, len(rows) - 1) * GAP_Y
    out = [
        f'<svg class="graph" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="step graph">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#555"/></marker></defs>',
    ]
    labels: list[str] = []
    k = 0
    x: float  # a column (int) on a back edge, a centre (float) elsewhere
    lx: float
    for e in graph["edges"]:
        if e["source"] not in pos or e["target"] not in pos:
            continue
        sx, sy, sr = pos[e["source"]]
        tx, ty, tr = pos[e["target"]]
        dash = "" if e.get("certain", True) else ' stroke-dasharray="5,4"'
        if tr - sr > 1:
            x = side + 14 * k
            k += 1
            ay, by, r = sy + NODE_H / 2, ty + NODE_H / 2, 10
            # Out to the right of every row, down, and back in: straight runs with rounded corners.
            d = (
                f"M{sx + node_w:.0f},{ay:.0f} H{x - r:.0f} Q{x:.0f},{ay:.0f} {x:.0f},{ay + r:.0f} "
                f"V{by - r:.0f} Q{x:.0f},{by:.0f} {x - r:.0f},{by:.0f} H{tx + node_w + 2:.0f}"
            )
            lx, ly = x, (ay + by) / 2
        else:
            ax, ay = sx + node_w / 2, sy + NODE_H
            bx, by = tx + node_w / 2, ty - 2
            mid = (ay + by) / 2
            d = f"M{ax:.0f},{ay:.0f} C{ax:.0f},{mid:.0f} {bx:.0f},{mid:.0f} {bx:.0f},{by:.0f}"
            lx, ly = (ax + bx) / 2, mid
        out.append(
            f'<path class="edge" d="{d}" fill="none" stroke="#555" stroke-width="1.4"{dash} marker-end="url(#arrow)"/>'
        )
        if e.get("label") is not None:
            text = esc(short(e["label"], 18))
            w = 8 + 6.6 * min(len(short(e["label"], 18)), 18)
            labels.append(
                f'<g class="edge-label"><rect x="{lx - w / 2:.0f}" y="{ly - 9:.0f}" width="{w:.0f}" '
                f'height="16" rx="3" fill="#fff" stroke="#bbb"/><text x="{lx:.0f}" y="{ly + 3:.0f}" '
                f'text-anchor="middle" font-size="11">{text}</text></g>'
            )
    for i, (node_id, (x, y, _r)) in enumerate(pos.items()):
        n = nodes[node_id]
        status = str(n.get("status"))
        skipped = status == "skipped"
        fill = FILL.get(status, "#ffffff")
        shape = (
            f'<polygon points="{x + 12:.0f},{y:.0f} {x + node_w - 12:.0f},{y:.0f} {x + node_w:.0f},'
            f"{y + NODE_H / 2:.0f} {x + node_w - 12:.0f},{y + NODE_H:.0f} {x + 12:.0f},{y + NODE_H:.0f} "
            f'{x:.0f},{y + NODE_H / 2:.0f}"'
            if n.get("kind") == "route"
            else f'<rect x="{x:.0f}" y="{y:.0f}" width="{node_w}" height="{NODE_H}" rx="6"'
        )
        stroke = ' stroke="#999" stroke-dasharray="4,3"' if skipped else ' stroke="#555"'
        color = "#888" if skipped else "#111"
        # The labels are clipped to the box: should a face be wider than CHAR_W allows, a label is cut at the
        # box's edge instead of running over its neighbours.
        clip = f"node-clip-{i}"
        body = (
            f'{shape} fill="{fill}"{stroke}/>'
            f'<clipPath id="{clip}"><rect x="{x + 4:.0f}" y="{y:.0f}" width="{node_w - 8}" height="{NODE_H}"/>'
            f'</clipPath><g clip-path="url(#{clip})">'
            f'<text x="{x + node_w / 2:.0f}" y="{y + 19:.0f}" text-anchor="middle" font-size="13" '
            f'font-weight="600" fill="{color}">{esc(short(node_id, LABEL_MAX))}</text>'
            f'<text x="{x + node_w / 2:.0f}" y="{y + 36:.0f}" text-anchor="middle" font-size="11" '
            f'fill="{color}">{esc(n.get("kind"))} · {esc(status)}</text></g>'
        )
        title = f"<title>{esc(node_id)}: {esc(n.get('kind'))}, {esc(status)}</title>"
        group = f'<g class="node status-{esc(status)}" data-step="{esc(node_id)}">{title}{body}</g>'
        anchor = anchors.get(node_id)
        out.append(f'<a href="#{esc(anchor)}">{group}</a>' if anchor else group)
    out.extend(labels)
    out.append("</svg>")
    return "".join(out)
