"""`akm workflow status RUN --format html`, rendered by a real browser (headless Debian chromium).

Real runs (exec units, a session gate reported from the shell) make real journals; the CLI writes
the page; chromium loads it from a file and dumps the DOM it built, which is what these tests read.
`.ci/run` installs chromium; in CI (CI=1) a missing chromium fails instead of skipping.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.helpers import ROOT, py, running_in_ci, write_wf

HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)><a href="https://evil.example/x">x</a>'
MAX_BYTES = 2_000_000


def chromium_bin() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if running_in_ci():
        pytest.fail("chromium is not installed; .ci/run installs Debian's chromium (apt-get install -y chromium)")
    pytest.skip("chromium is not installed (apt-get install -y chromium); in CI (CI=1) this is a failure")


# Headless, no sandbox (CI runs as root), and every fetch-capable feature off: a page gets no network.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def dump_dom(page: Path) -> str:
    """The DOM chromium built from `page`, serialised (no network: every fetch-capable feature is off)."""
    with tempfile.TemporaryDirectory(prefix="akm-chromium-") as profile:
        proc = subprocess.run(
            [
                chromium_bin(),
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--dump-dom",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


class Dom(HTMLParser):
    """Elements of a dumped DOM: tag counts, attributes, text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: dict[str, int] = {}
        self.attrs: list[tuple[str, str, str]] = []  # (tag, name, value)
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.attrs.extend((tag, k, v or "") for k, v in attrs)

    def handle_data(self, data):
        self.text.append(data)

    def values(self, name: str) -> list[str]:
        return [v for _t, k, v in self.attrs if k == name]

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def check_self_contained(dom: Dom, raw: str) -> None:
    """No script element, no external reference of any kind (links are fragments only)."""
    assert dom.tags.get("script", 0) == 0
    assert dom.tags.get("img", 0) == 0 and dom.tags.get("iframe", 0) == 0 and dom.tags.get("link", 0) == 0
    for tag, name, value in dom.attrs:
        if name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
            assert value.startswith("#"), (tag, name, value)
        assert not name.startswith("on"), (tag, name, value)
    assert "http://" not in raw and "https://" not in raw.replace(HOSTILE_URL_ESCAPED, "")
    assert "url(" not in raw.split("</style>")[0] and "@import" not in raw


HOSTILE_URL_ESCAPED = "https://evil.example/x"  # only ever present as escaped text from unit output


def report(cli, rid: str, tmp_path: Path, name: str) -> tuple[Path, str, Dom]:
    out = cli("workflow", "status", rid, "--format", "html", check=0).stdout
    page = tmp_path / f"{name}.html"
    page.write_text(out, encoding="utf-8")
    dom_text = dump_dom(page)
    return page, out, Dom(dom_text)


def step_ids_shown(dom: Dom) -> set[str]:
    return set(dom.values("data-step"))


def test_a_completed_run_shows_every_step_its_graph_and_timeline(cli, project, tmp_path):
    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    res = cli.json("workflow", "run", "hello.md", "--count", "7")
    rid = res["run"]["runId"]
    page, raw, dom = report(cli, rid, tmp_path, "completed")
    check_self_contained(dom, raw)
    ids = {s["id"] for s in res["run"]["steps"]}
    assert step_ids_shown(dom) == ids
    assert dom.tags.get("svg", 0) == 2  # the step graph and the timeline
    classes = " ".join(dom.values("class"))
    assert "status-skipped" in classes and "status-completed" in classes  # small-party greyed, the rest not
    text = dom.all_text
    assert "Hello, friend-7!" in text and "Book the hall!" in text
    assert len([v for v in dom.values("class") if v.startswith("bar ")]) == 10  # one bar per attempt
    assert "none declared" in text  # hello.md has no budget
    assert f"akm workflow status {rid} --units --format json" in text


def test_a_failed_run_shows_reasons_and_diagnostics_and_unit_output_cannot_inject(cli, project, tmp_path):
    (project / "hostile.py").write_text(
        "import os, sys\n"
        f"print({HOSTILE!r})\n"
        f"sys.stderr.write('diagnostic for ' + os.environ['AKM_ITEM'] + ' ' + {HOSTILE!r} + '\\n')\n"
        "sys.exit(3 if 'b' in os.environ['AKM_ITEM'] else 0)\n",
        encoding="utf-8",
    )
    write_wf(
        project,
        "fail.md",
        """
        budget: { max_units: 50, max_tokens: 1000 }
        steps:
          - id: items
            unit: { exec: { command: %s } }
            output: { type: array }
          - id: each
            map:
              over: steps.items.output
              unit:
                exec: { command: %s }
                retry: { max: 1, on: [non_zero_exit] }
            output: { type: array }
        """
        % (py('import json; print(json.dumps(["a", "b", "c"]))'), json.dumps([sys.executable, "hostile.py"])),
        "## items\n\nList.\n\n## each\n\nEach.",
    )
    res = cli.json("workflow", "run", "fail.md", check=1)
    rid = res["run"]["runId"]
    page, raw, dom = report(cli, rid, tmp_path, "failed")
    check_self_contained(dom, raw)
    assert step_ids_shown(dom) == {"items", "each"}
    text = dom.all_text
    assert "non_zero_exit" in text and "Failures" in text
    assert 'diagnostic for "b"' in text  # the failed unit's stderr, as text
    assert HOSTILE in text  # unit output shows as the characters it printed, never as markup
    assert dom.tags.get("a", 0) == len([v for v in dom.values("href")])  # every link is ours (fragments)
    assert "of 50 attempts" in text and "of 1,000 tokens" in text  # the budget meters
    failed_bars = [v for v in dom.values("class") if v == "bar bar-failed"]
    assert len(failed_bars) == 2  # item b and its retry


def test_a_gated_run_shows_each_loop_with_its_verdict_and_feedback(cli, project, tmp_path):
    write_wf(
        project,
        "gate.md",
        """
        steps:
          - id: write
            gate: { max_loops: 3 }
            unit: { exec: { command: %s } }
            output: { type: object }
        """
        % py('import json; print(json.dumps({"text": "hi"}))'),
        "## write\n\nWrite a sentence.\n\n### gate\n\n- It says hello",
    )
    cli("workflow", "run", "gate.md", check=3)
    rid = cli.json("workflow", "list")["runs"][0]["runId"]
    cli(
        "workflow",
        "report",
        rid,
        "write.gate:l1",
        "--status",
        "completed",
        "--verdict",
        json.dumps({"complete": False, "missing": ["a greeting <b>bold</b>"], "feedback": "Say hello, please"}),
        check=0,
    )
    cli("workflow", "run", rid, check=3)
    cli(
        "workflow",
        "report",
        rid,
        "write.gate:l2",
        "--status",
        "completed",
        "--verdict",
        '{"complete": true, "missing": [], "feedback": "Good now"}',
        check=0,
    )
    assert cli.json("workflow", "run", rid)["run"]["status"] == "completed"
    page, raw, dom = report(cli, rid, tmp_path, "gated")
    check_self_contained(dom, raw)
    text = dom.all_text
    assert "Gate loops" in text and "loop 1" in text and "loop 2" in text
    assert "rejected" in text and "passed" in text
    assert "Say hello, please" in text  # the rejection's feedback (a passing verdict keeps none)
    assert "a greeting <b>bold</b>" in text and dom.tags.get("b", 0) == 0
    assert len(dom.values("data-step")) >= 2 and step_ids_shown(dom) == {"write"}


def test_a_thousand_unit_run_stays_under_two_megabytes_even_with_large_hostile_outputs(cli, project, tmp_path):
    # Each unit prints 3000 '<' (4 bytes each once escaped): unclipped that would be 12 MB of page.
    write_wf(
        project,
        "big.md",
        """
        params:
          n: { type: integer, default: 1000 }
        steps:
          - id: items
            unit: { exec: { command: %s } }
            output: { type: array }
          - id: each
            map:
              over: steps.items.output
              concurrency: 8
              unit: { exec: { command: [sh, -c, "printf '%%3000s' '' | tr ' ' '<'"] } }
            output: { type: array }
        """
        % py('import json, os; print(json.dumps(list(range(json.loads(os.environ["AKM_PARAMS"])["n"]))))'),
        "## items\n\nList.\n\n## each\n\nEach.",
    )
    res = cli.json("workflow", "run", "big.md", check=0)
    rid = res["run"]["runId"]
    page, raw, dom = report(cli, rid, tmp_path, "big")
    assert page.stat().st_size <= MAX_BYTES, page.stat().st_size
    check_self_contained(dom, raw)
    assert step_ids_shown(dom) == {"items", "each"}
    assert len(set(dom.values("data-unit"))) == 1001  # every unit has its row
    assert len([v for v in dom.values("class") if v.startswith("bar ")]) == 1001
    assert "clipped" in dom.all_text


def test_mcp_workflow_status_html_links_the_page_as_a_resource(cli, project):
    """The report grows with the run, so it is a resource to read (a link in the answer), never inlined."""

    import anyio
    from mcp import Client

    from akm.mcp import build_server

    shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
    rid = cli.json("workflow", "run", "hello.md")["run"]["runId"]

    async def main():
        async with Client(build_server(cwd=str(project))) as client:
            html = await client.call_tool("workflow_status", {"run_id": rid[:8], "format": "html"})
            plain = await client.call_tool("workflow_status", {"run_id": rid})
            page = await client.read_resource(html.content[-1].uri)
            return html, plain, page

    html, plain, page = anyio.run(main)
    assert not html.is_error and html.structured_content["runId"] == rid  # the JSON view is still there
    link = html.content[-1]
    assert link.type == "resource_link" and link.mime_type == "text/html"
    assert str(link.uri) == f"akm://runs/{rid}/report.html"  # the resolved run id
    resource = page.contents[0]
    assert resource.mime_type == "text/html" and resource.text.startswith("<!DOCTYPE html>")
    assert "big-party" in resource.text
    assert len(plain.content) == 1  # json (the default) adds nothing


def test_the_size_guard_holds_for_ten_thousand_units_of_hostile_output():
    """The renderer alone (no browser): 10 000 units (the lifetime cap), each 5000 characters that all
    need escaping, still make a page of at most 2 MB that says it left rows out."""
    from akm.report.html import render_report

    n = 10_000
    units = [
        {
            "unitId": f"each.unit:{i:012x}",
            "stepId": "each",
            "status": "failed" if i % 3 else "completed",
            "attempts": 1,
            "failureReason": "non_zero_exit" if i % 3 else None,
            "result": '<"&' * 1700,
            "tokens": 5,
            "startedAt": "2026-01-01T00:00:00.000Z",
            "finishedAt": "2026-01-01T00:00:01.000Z",
            "truncated": False,
        }
        for i in range(n)
    ]
    events = []
    for i, u in enumerate(units):
        meta = {"stepId": "each", "unitId": u["unitId"]}
        events.append(
            {
                "eventType": "workflow_unit_started",
                "ts": f"2026-01-01T00:{i // 600:02d}:{i % 60:02d}.000Z",
                "metadata": meta,
            }
        )
        events.append(
            {
                "eventType": "workflow_unit_finished",
                "ts": f"2026-01-01T00:{i // 600:02d}:{i % 60:02d}.500Z",
                "metadata": {**meta, "status": u["status"], "failureReason": u["failureReason"]},
            }
        )
    view = {
        "runId": "r",
        "status": "failed",
        "workflow": "w",
        "title": "t",
        "planHash": "0" * 64,
        "createdAt": "2026-01-01T00:00:00.000Z",
        "updatedAt": "2026-01-01T01:00:00.000Z",
        "steps": [
            {
                "id": "each",
                "status": "failed",
                "output": ['<"&' * 1700] * 50,
                "notes": "<b>" * 5000,
                "unitCount": n,
                "attempts": n,
            }
        ],
        "units": units,
    }
    graph = {"nodes": [{"id": "each", "kind": "map", "status": "failed"}], "edges": []}
    page = render_report(view, graph, events, {"maxUnits": 10_000, "maxTokens": None})
    assert len(page.encode("utf-8")) <= MAX_BYTES
    assert "unit row(s) were left out" in page and "<b>" not in page


def test_a_report_of_an_unknown_run_is_a_coded_error_and_prints_no_page(cli):
    out = cli("workflow", "status", "00000000-0000-4000-8000-000000000000", "--format", "html", check=1)
    assert out.stdout == "" and "error[RUN_NOT_FOUND]" in out.stderr and "Traceback" not in out.stderr
