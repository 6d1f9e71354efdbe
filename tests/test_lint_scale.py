"""Lint on big files: repeated warnings are folded, and the fast YAML path means the same thing (issue 6 item 16).

Speed itself is measured in bench/bench_lint.py (no test depends on a time window).
"""

from __future__ import annotations

import json

import pytest

from akm.cli import main
from akm.format import yaml12, yaml_stock
from akm.format.lint import lint_text
from akm.format.markdown import scan_body, split_lines
from tests.helpers import ROOT, corpus_files


def untyped_steps(n: int) -> str:
    front = "".join(f"  - id: s{i}\n    unit:\n      exec:\n        command: [echo, hi]\n" for i in range(n))
    body = "".join(f"## s{i}\n\nDo it.\n\n" for i in range(n))
    return "---\nsteps:\n" + front + "---\n\n" + body


def test_thousands_of_identical_warnings_are_folded(tmp_path, capsys):
    (tmp_path / "big.md").write_text(untyped_steps(200), encoding="utf-8")
    assert main(["workflow", "lint", str(tmp_path / "big.md")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) <= 8, out
    warnings = [line for line in out if "warning[missing_output_schema]" in line]
    assert len(warnings) == 4
    assert warnings[-1].endswith(
        "197 more missing_output_schema warnings like the ones above (lines 15, 19, 23, 27, 31, … 799)"
    )
    assert sum("hint:" in line for line in out) == 1  # the shared hint once
    assert out[-1] == "1 file checked: no errors, 200 warning(s)"

    assert main(["workflow", "lint", str(tmp_path / "big.md"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    entries = report["files"][0]["warnings"]
    assert [w.get("count") for w in entries] == [None, None, None, 197]
    assert sum(w.get("count", 1) for w in entries) == 200


def test_a_few_repeats_are_not_folded():
    report = lint_text(untyped_steps(4), "four.md")
    assert [w.code for w in report.warnings] == ["missing_output_schema"] * 4
    assert all(w.count is None for w in report.warnings)


def test_gate_sections_are_bound_in_a_big_body():
    """The gate lookup per section (once sections x headings) still finds each rubric."""
    lines = []
    for i in range(300):
        lines += [f"## s{i}", "do it", "### gate", f"- done {i}", ""] if i % 2 else [f"## s{i}", "do it", ""]
    body = scan_body(split_lines("\n".join(lines)), 1)
    gated = [s for s in body.sections if s.gate_line is not None]
    assert len(gated) == 150 and gated[0].rubric.text == "- done 1"
    assert body.sections[1].extra_gate_lines == []


FRONTMATTERS = [
    p.read_text(encoding="utf-8").split("\n---\n")[0][4:]
    for p in corpus_files("current") + [ROOT / "examples" / "hello.md"]
]


@pytest.mark.parametrize(
    "text",
    FRONTMATTERS
    + [
        "a: 1\nb: [x, 'y', \"z\"]\nc: {d: null, e: true, f: 0x1f, g: 1.5e3, h: .inf}\n",
        "k: &a [1, 2]\nl: *a\nm: |\n  block\n  text\n",
        "dup: 1\ndup: 2\n",
        "bad: [unclosed\n",
        "bad: key: here\n",
        "tag: !!timestamp 2026-01-01\n",
        "ctrl: \x07\n",
        'caf\u00e9: \u00fc\r\nk: \U0001f600\r\nl: "\\u00e9"\r\n',
        "a: \x80\n",
        "a: \ufffe\n",
        "\ufeffa: b\n",
        "x: 1\u2028y: 2\n",
        "a: b\nc: 'multi\n  line'\nd: >\n  folded\n  text\n",
        "a: b\rc: d\r",
        "",
        "# only a comment\n",
        "- 1\n- [2, {x: y}]\n",
    ],
)
@pytest.mark.parametrize("fast_path", ["libyaml", "light"])
def test_libyaml_and_pure_python_paths_agree(monkeypatch, text, fast_path):
    """libyaml (large text) and the light composer (akm.format.yaml_light) give what the stock loader gives."""
    with monkeypatch.context() as m:
        if fast_path == "libyaml":
            m.setattr(yaml12, "_LIGHT", False)
        else:
            m.setattr(yaml_stock, "_CComposer", None)
        fast = yaml12.load_yaml(text)
    monkeypatch.setattr(yaml12, "_LIGHT", False)
    monkeypatch.setattr(yaml_stock, "_CComposer", None)
    slow = yaml12.load_yaml(text)
    assert repr(fast.value) == repr(slow.value)
    assert fast.value_marks == slow.value_marks and fast.key_marks == slow.key_marks
    assert fast.value_end_lines == slow.value_end_lines
    assert [vars(p) for p in fast.problems] == [vars(p) for p in slow.problems]
