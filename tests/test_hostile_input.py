"""Hostile input gets a coded error (exit 2, or the documented code), never `error[INTERNAL]` (issue 6 item 9).

Undecodable bytes in argv and file names, over-long paths and refs, a damaged run row, bad `env:`
refs, NUL bytes in commands, and a property test that throws odd argv at the whole CLI.
"""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akm import api, paths
from akm.cli import main
from akm.errors import AkmError

WF = """\
---
params:
  who: { type: string }
  n: { type: integer }
steps:
  - id: a
    unit:
      exec:
        command: ["true"]
---

## a

Say hi.
"""


@pytest.fixture
def in_project(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "wf.md").write_text(WF, encoding="utf-8")
    monkeypatch.chdir(project)
    return project


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _bad_bytes(name: bytes) -> str:
    """A str as Python hands an undecodable argv entry or file name over (surrogateescape)."""
    return os.fsdecode(name)


# ------------------------------------------------------------------ non-UTF-8 text


def test_non_utf8_param_value_is_not_utf8_exit_2(in_project, capsys):
    code, _, err = cli(capsys, "workflow", "run", "wf.md", "--who", _bad_bytes(b"\xff\xfe"))
    assert code == 2, err
    assert "error[NOT_UTF8]: argument 5 (after --who) is not valid UTF-8 text (byte 0xff at character 1)" in err
    assert "INTERNAL" not in err


def test_non_utf8_file_name_is_not_utf8_exit_2(in_project, capsys):
    name = _bad_bytes(b"b\xff.md")
    (in_project / name).write_text(WF, encoding="utf-8")
    for argv in (("workflow", "run", name), ("workflow", "lint", name), ("workflow", "status", name)):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and "error[NOT_UTF8]" in err and "byte 0xff at character 2" in err, (argv, err)


def test_project_directory_with_non_utf8_name(tmp_path, monkeypatch, capsys):
    odd = tmp_path / _bad_bytes(b"p\xff")
    odd.mkdir()
    (odd / "wf.md").write_text(WF, encoding="utf-8")
    monkeypatch.chdir(odd)
    code, _, err = cli(capsys, "workflow", "run", "wf.md")
    assert code == 2, err
    assert "error[NOT_UTF8]: the workflow file's path is not valid UTF-8 text (byte 0xff" in err
    code, out, err = cli(capsys, "workflow", "list")  # the scope of such a directory is still computable
    assert (code, out.strip()) == (0, "no runs"), err
    code, out, err = cli(capsys, "workflow", "lint", "wf.md")
    assert code == 0 and "no errors" in out, err


def test_relative_target_from_a_non_utf8_subdirectory_runs(in_project, monkeypatch, capsys):
    """`../wf.md` from a directory whose name is not UTF-8 names a UTF-8 file: it runs (no INTERNAL)."""
    (in_project / ".akm").mkdir()  # the project root, above the odd directory
    odd = in_project / _bad_bytes(b"d\xfe")
    odd.mkdir()
    monkeypatch.chdir(odd)
    code, out, err = cli(capsys, "workflow", "run", "../wf.md", "--who", "x", "--n", "1")
    assert code == 0 and "completed" in out, err
    (run,) = api.list_runs(cwd=str(in_project)).runs
    assert api.run_status(run.run_id).workflow == str((in_project / "wf.md").resolve())


def test_api_params_with_lone_surrogates_are_refused(in_project):
    with pytest.raises(AkmError) as info:
        api.run_workflow("wf.md", params={"who": "x\ud800"}, cwd=str(in_project))
    assert (info.value.code, info.value.exit_status) == ("NOT_UTF8", 2)
    assert "params.who is not valid UTF-8 text (a lone surrogate U+D800 at character 2)" in info.value.message
    assert api.list_runs(cwd=str(in_project)).runs == []


# ------------------------------------------------------------------ long paths and refs


@pytest.mark.parametrize(
    "target",
    ["a" * 300 + ".md", "workflows/" + "b" * 300, "workflows/" + "c" * 5000, "d/" * 3000 + "x.md"],
    ids=["file-name-300", "ref-300", "ref-5000", "path-6000"],
)
def test_over_long_paths_and_refs_are_invalid_path(in_project, capsys, target):
    (in_project / ".akm" / "workflows").mkdir(parents=True)  # so a ref's lookup reaches the OS
    code, _, err = cli(capsys, "workflow", "run", target)
    assert code == 2, err
    assert "error[INVALID_PATH]" in err
    assert len(err) < 600  # the message quotes a clipped target, not thousands of characters


def test_over_long_run_id_is_clipped_in_the_message(in_project, capsys):
    code, _, err = cli(capsys, "workflow", "status", "r" * 5000)
    assert code == 1 and "error[RUN_NOT_FOUND]" in err
    assert "(5000 characters)" in err and len(err) < 600


# ------------------------------------------------------------------ a damaged run row


def test_one_run_with_non_object_params_does_not_break_list(in_project, capsys):
    good = api.run_workflow("wf.md", param_pairs=[("who", "ann")], cwd=str(in_project)).run.run_id
    con = sqlite3.connect(paths.journal_path())
    con.execute("UPDATE runs SET params_json = '[1, 2]' WHERE id = ?", (good,))
    con.commit()
    con.close()
    second = api.run_workflow("wf.md", param_pairs=[("who", "bob")], cwd=str(in_project)).run.run_id

    code, out, err = cli(capsys, "workflow", "list", "--format", "json")
    assert code == 0, err
    params = {r["runId"]: r["params"] for r in json.loads(out)["runs"]}
    assert params == {good: None, second: {"who": "bob"}}
    code, out, err = cli(capsys, "workflow", "status", good, "--format", "json")
    assert code == 0 and json.loads(out)["params"] is None, err


def test_driving_a_run_with_non_object_params_is_corrupt_run(in_project, capsys):
    run_id = api.run_workflow("wf.md", cwd=str(in_project), max_steps=0).run.run_id
    con = sqlite3.connect(paths.journal_path())
    con.execute("UPDATE runs SET params_json = '\"text\"' WHERE id = ?", (run_id,))
    con.commit()
    con.close()
    code, _, err = cli(capsys, "workflow", "run", run_id)
    assert code == 2 and "error[CORRUPT_RUN]" in err and "params record" in err, err
    # The same workflow with params: a corrupt row matches no params, so it cannot block the workflow
    # (issue 6 item 4: an active run is continued only with the same params); a new run starts.
    code, out, err = cli(capsys, "workflow", "run", "wf.md", "--who", "x", "--format", "json")
    assert code == 0 and json.loads(out)["run"]["runId"] != run_id, err
    code, _, err = cli(capsys, "workflow", "run", run_id)  # the corrupt run itself still refuses, coded
    assert code == 2 and "error[CORRUPT_RUN]" in err, err


# ------------------------------------------------------------------ lint catches what used to fail at run time


def _wf_with_unit(unit_yaml: str) -> str:
    return "---\nsteps:\n  - id: a\n    unit:\n" + unit_yaml + "---\n\n## a\n\nx\n"


@pytest.mark.parametrize("ref", ["ci", "env/", "env/../secrets", "env/.hidden", "env/a/b", "secrets/ci"])
def test_env_refs_not_of_the_form_env_name_are_lint_errors(in_project, capsys, ref):
    (in_project / "e.md").write_text(
        _wf_with_unit(f'      env: [{json.dumps(ref)}]\n      exec: {{ command: ["true"] }}\n'), encoding="utf-8"
    )
    code, out, err = cli(capsys, "workflow", "lint", "e.md", "--format", "json")
    assert code == 1, err
    (diag,) = json.loads(out)["files"][0]["errors"]
    assert diag["code"] == "invalid_env_ref" and diag["line"] == 5
    assert "not an env ref of the form env/<name>" in diag["message"]
    code, _, err = cli(capsys, "workflow", "run", "e.md")
    assert code == 2 and "error[WORKFLOW_INVALID]" in err and "[invalid_env_ref]" in err


def test_env_ref_names_that_are_fine(in_project, capsys):
    (in_project / "e.md").write_text(
        _wf_with_unit(
            '      env: [env/ci, env/npm-readonly, env/integration.tests_2]\n      exec: { command: ["true"] }\n'
        ),
        encoding="utf-8",
    )
    code, out, err = cli(capsys, "workflow", "lint", "e.md")
    assert code == 0, out + err


def test_nul_in_exec_command_is_a_lint_error(in_project, capsys):
    (in_project / "n.md").write_text(_wf_with_unit('      exec: { command: ["echo", "a\\0b"] }\n'), encoding="utf-8")
    code, out, err = cli(capsys, "workflow", "lint", "n.md", "--format", "json")
    assert code == 1, err
    (diag,) = json.loads(out)["files"][0]["errors"]
    assert diag["code"] == "exec_invalid_command"
    assert (
        diag["message"] == 'Step "a": unit.exec.command[1] contains a NUL character, which no program argument can hold'
    )


# ------------------------------------------------------------------ the class: odd argv never crashes

_TOKENS = st.sampled_from(
    [
        "workflow",
        "run",
        "lint",
        "list",
        "status",
        "resume",
        "abandon",
        "upgrade",
        "log",
        "--format",
        "json",
        "text",
        "mermaid",
        "--since",
        "--run",
        "--ref",
        "--all",
        "--active",
        "--units",
        "--write",
        "--max-steps",
        "--timeout",
        "--who",
        "--n",
        "--quiet",
        "-h",
        "-q",
        "--",
        "-",
        "wf.md",
        "workflows/x",
        "workflows/..",
        "workflows/",
        "@offset:3",
        "@offset:99999999999999999999999",
        "2026-01-01",
        "1e999",
        "-1",
        "0",
        "0x10",
        "\udcff",
        "a\udcffb",
        "\ud800",
        "x" * 300,
        "y" * 5000,
        "/",
        ".",
        "..",
        "/dev/null",
        "--who=",
        "--n=1.5",
        "--n=9007199254740993",
        "--=x",
        "---",
        "\n",
        "\t",
        " ",
        "é",
        "\u202e",
        "NaN",
        "[]",
        "{}",
        '{"a":',
        "null",
        "true",
        "wf.md/",
        "00000000-0000-4000-8000-000000000000",
        "--format=json",
        "--format=yaml",
    ]
)


@settings(
    max_examples=int(os.environ.get("AKM_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argv=st.lists(_TOKENS, max_size=6), prefix=st.booleans())
def test_odd_argv_never_reaches_internal_error(in_project, capsys, argv, prefix):
    full = (["workflow"] if prefix else []) + argv
    try:
        code = main(full)
    except SystemExit as exc:  # argparse's own --help exits 0
        code = exc.code
    _, err = capsys.readouterr()
    assert code != 70 and "error[INTERNAL]" not in err, (full, err)


# ------------------------------------------------------------------ token counts from outside


def test_a_huge_reported_token_count_is_a_coded_error_and_records_nothing(in_project, capsys):
    (in_project / "s.md").write_text(
        "---\nsteps:\n  - id: s\n    output: { type: object }\n---\n\n## s\n\nDo s.\n", encoding="utf-8"
    )
    code, out, err = cli(capsys, "workflow", "run", "s.md", "--format", "json")
    assert code == 3, err
    run_id = json.loads(out)["run"]["runId"]
    report = ("workflow", "report", run_id, "s:solo", "--status", "completed", "--result", "{}", "--tokens")
    for tokens in ("99999999999999999999999", str(10**12 + 1)):
        code, _, err = cli(capsys, *report, tokens)
        assert code == 2 and "whole number from 0 to 1000000000000" in err and "INTERNAL" not in err, err
    assert api.run_status(run_id).status == "awaiting_session"  # nothing recorded
    code, _, err = cli(capsys, *report, str(10**12))
    assert code == 0, err


@pytest.mark.parametrize(
    "usage,expected",
    [
        ("1e999", 10**12),
        ("100000000000000000000000000000", 10**12),
        ("-1", None),
        ("NaN", None),
        ('"12"', None),
        ("true", None),
        ("17", 17),
    ],
)
def test_server_usage_figures_are_bounded_not_a_crash(usage, expected):
    """A server's usage (infinity from `1e999`, a 30-digit integer) must not crash the dispatcher
    (int(inf) raised OverflowError) nor overflow the journal's 64-bit integers."""
    from akm.dispatch.harnesses import token_count  # what every harness reads its usage figures with
    from akm.dispatch.llm import _parse_response
    from akm.dispatch.types import MAX_TOKENS, DispatchResult
    from akm.engine.budget import MAX_UNIT_TOKENS

    assert MAX_TOKENS == MAX_UNIT_TOKENS  # a dispatcher's figure and a report's share one bound

    body = ('{"choices": [{"message": {"content": "hi"}}], "usage": {"total_tokens": %s}}' % usage).encode()
    assert _parse_response("srv", 200, body, None, []).total_tokens == expected
    value = json.loads(usage)
    assert token_count(value) == expected
    assert DispatchResult(ok=True, tokens=value).tokens == expected


# ------------------------------------------------------------------ JSON the journal cannot hold

DEEP_WF = """\
---
params:
  m: { type: array }
steps:
  - id: a
    unit:
      exec:
        command: ["true"]
---

## a

x
"""


@pytest.mark.parametrize(
    "value,why",
    [
        ("[" * 900 + "]" * 900, "params.m cannot be recorded as JSON: value nests deeper than 64 levels"),
        ("[" * 65 + "]" * 65, "params.m cannot be recorded as JSON: value nests deeper than 64 levels"),
        ("[1e999]", "--m must contain valid JSON: the number 1e999 is out of range"),
    ],
)
def test_param_json_that_cannot_be_recorded_is_invalid_flag_value(in_project, capsys, value, why):
    (in_project / "deep.md").write_text(DEEP_WF, encoding="utf-8")
    code, _, err = cli(capsys, "workflow", "run", "deep.md", "--m", value)
    assert code == 2 and f"error[INVALID_ARGUMENT]: {why}" in err, err
    assert api.list_runs(cwd=str(in_project)).runs == []


def test_api_params_that_cannot_be_recorded_are_invalid_params(in_project):
    (in_project / "deep.md").write_text(DEEP_WF, encoding="utf-8")
    for bad in ([float("inf")], [float("nan")]):
        with pytest.raises(AkmError) as info:
            api.run_workflow("deep.md", params={"m": bad}, cwd=str(in_project))
        assert (info.value.code, info.value.exit_status) == ("INVALID_PARAMS", 2)
        assert "params.m cannot be recorded as JSON: non-finite number" in info.value.message


def test_a_unit_answer_nesting_deeper_than_the_journal_holds_is_a_parse_error(in_project, capsys):
    """On main the 900-deep artifact was accepted, and every later `status` of the run was INTERNAL."""
    deep = "[" * 900 + "]" * 900
    (in_project / "out.md").write_text(
        "---\nsteps:\n  - id: a\n    unit:\n      exec:\n        command: "
        + json.dumps(["python3", "-c", f"print({deep!r})"])
        + "\n    output: { type: array }\n---\n\n## a\n\nx\n",
        encoding="utf-8",
    )
    code, out, err = cli(capsys, "workflow", "run", "out.md")
    assert code == 1 and "error[" not in err, err
    assert "(parse_error)" in out and "nests deeper than 200 levels" in out
    run_id = api.list_runs(cwd=str(in_project)).runs[0].run_id
    code, _, err = cli(capsys, "workflow", "status", run_id, "--format", "json")
    assert code == 0, err


def test_a_structured_session_result_that_cannot_be_recorded_is_result_invalid(in_project, capsys):
    (in_project / "s.md").write_text("---\nsteps:\n  - id: s\n---\n\n## s\n\nDo s.\n", encoding="utf-8")
    code, out, err = cli(capsys, "workflow", "run", "s.md", "--format", "json")
    assert code == 3, err
    run_id = json.loads(out)["run"]["runId"]
    deep: list = []
    for _ in range(300):
        deep = [deep]
    for bad in (deep, {"x": float("inf")}):
        with pytest.raises(AkmError) as info:
            api.report_unit(run_id, "s:solo", status="completed", result=bad, cwd=str(in_project))
        assert info.value.code == "RESULT_INVALID" and "cannot be recorded as JSON" in info.value.message
    assert api.run_status(run_id).status == "awaiting_session"


# ------------------------------------------------------------------ numbers of thousands of digits

BIG = "9" * 5000  # int() refuses > 4300 digits with a ValueError (advice for programmers, not users)


@pytest.mark.parametrize(
    "argv,why",
    [
        (("config", "set", "workflow.maxConcurrency", BIG), "workflow.maxConcurrency: expected a whole number"),
        (("config", "set", "engines.x", "[" * 60000 + "]" * 60000), "engines.x: expected an object as JSON"),
        (("log", "--since", "@offset:" + BIG), "the offset must be a whole number"),
        (("workflow", "run", "wf.md", "--max-steps", BIG), 'max_steps "99'),
        (("workflow", "run", "wf.md", "--timeout", BIG + "s"), "is too long"),
        (
            (
                "workflow",
                "report",
                "00000000-0000-4000-8000-000000000000",
                "u",
                "--status",
                "completed",
                "--tokens",
                BIG,
            ),
            "--tokens",
        ),
    ],
)
def test_numbers_of_thousands_of_digits_are_coded_errors(in_project, capsys, argv, why):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and why in err and "INTERNAL" not in err and "set_int_max_str_digits" not in err, err
    assert len(err) < 1000  # the number is clipped in the message


def test_a_json_number_of_thousands_of_digits_is_named_not_a_python_limit(in_project, capsys):
    from akm.dispatch.answer import AnswerError, parse_command_json

    (in_project / "deep.md").write_text(DEEP_WF, encoding="utf-8")
    code, _, err = cli(capsys, "workflow", "run", "deep.md", "--m", f"[{BIG}]")
    assert code == 2 and "--m must contain valid JSON: a number of 5000 digits is out of range" in err, err
    with pytest.raises(AnswerError) as info:
        parse_command_json(f"[1, {BIG}]")
    assert (
        str(info.value) == "invalid JSON at line 1 column 5: the number 999999999999… has 5000 digits, too many to read"
    )


def test_offset_zero_and_small_offsets_still_read(in_project, capsys):
    for since in ("@offset:0", "@offset:00", "@offset:1"):
        code, _, err = cli(capsys, "log", "--since", since)
        assert code == 0, (since, err)


@pytest.mark.parametrize("temperature", ["1" + "0" * 400, "-" + "9" * 330, ".nan", ".inf", "true", "'0.5'"])
def test_an_impossible_temperature_is_a_lint_error_not_a_crash(temperature):
    """A YAML integer too large for a float used to escape as `internal_error` (OverflowError)."""
    from akm.format.parse import parse_workflow

    source = (
        "---\nsteps:\n  - id: a\n    unit:\n      engine: x\n      llm: { temperature: "
        + temperature
        + " }\n    output: { type: string }\n---\n\n## a\n\nx\n"
    )
    errors = parse_workflow(source, "wf.md").errors
    assert [(e.code, e.line) for e in errors] == [("invalid_type", 6)], errors
    assert "temperature must be a finite number" in errors[0].message


def test_a_whole_temperature_is_a_float_in_the_document():
    from akm.format.parse import parse_workflow

    source = (
        "---\nsteps:\n  - id: a\n    unit:\n      engine: x\n      llm: { temperature: 1 }\n"
        "    output: { type: string }\n---\n\n## a\n\nx\n"
    )
    llm = parse_workflow(source, "wf.md").document.steps[0].unit.llm
    assert llm.temperature == 1.0 and isinstance(llm.temperature, float)


# ------------------------------------------------------------------ issue 23 item 3: paths the OS cannot take


@pytest.mark.parametrize("ref", ["a" * 300, "workflows/" + "c" * 5000, "x\x00y"], ids=["name-300", "ref-5000", "nul"])
def test_list_with_a_ref_the_os_cannot_look_up_is_invalid_path(in_project, capsys, ref):
    """`workflow list --ref <300 chars>` was an OSError (INTERNAL, exit 70)."""
    code, _, err = cli(capsys, "workflow", "list", "--ref", ref)
    assert code == 2 and "error[INVALID_PATH]" in err and len(err) < 600, err


def test_api_cwd_with_a_nul_is_invalid_path(in_project):
    for call in (lambda: api.run_workflow("wf.md", cwd="/tmp\x00x"), lambda: api.list_runs(cwd="/tmp\x00x")):
        with pytest.raises(AkmError) as info:
            call()
        assert info.value.code == "INVALID_PATH" and "NUL character" in info.value.message
