""".env files for `env: [env/<name>]` follow python-dotenv's rules (issue 6 item 15)."""

from __future__ import annotations

import json
import sys

import pytest

from akm import api
from akm.engine.env_bindings import EnvBindingError, parse_dotenv

RICH_ENV = r"""# a comment line
export EXPORTED=exp-value
PLAIN=plain-value # an inline comment is not part of the value
HASH_IN_QUOTES="keep # this"
SINGLE='literal \n stays ${PLAIN}'
ESCAPES="tab\there \"quoted\" back\\slash"
MULTI="first line
second line"
SPACED = spaced-value   
EMPTY=
NO_EXPANSION=${PLAIN}-x
URL=https://user:pa55word@example.com/db?sslmode=require
"""

EXPECTED = {
    "EXPORTED": "exp-value",
    "PLAIN": "plain-value",
    "HASH_IN_QUOTES": "keep # this",
    "SINGLE": r"literal \n stays ${PLAIN}",
    "ESCAPES": 'tab\there "quoted" back\\slash',
    "MULTI": "first line\nsecond line",
    "SPACED": "spaced-value",
    "EMPTY": "",
    "NO_EXPANSION": "${PLAIN}-x",
    "URL": "https://user:pa55word@example.com/db?sslmode=require",
}


def test_dotenv_rules():
    assert parse_dotenv(RICH_ENV, "ci.env") == EXPECTED


def test_a_bare_name_binds_nothing_and_a_bom_is_ignored():
    assert parse_dotenv("\ufeffA=1\nJUST_A_NAME\n", "x.env") == {"A": "1"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("A=1\nthis is not a binding\n", "x.env:2: cannot read this line; expected NAME=value"),
        ("A=1\nB='unterminated\n", "x.env:2: cannot read this line"),
        ("my-key=1\n", "x.env:1: this line does not start with an environment variable name"),
        ("hunter2:TopSecretPassphrase-77\n", "x.env:1: this line is not NAME=value"),
    ],
)
def test_unreadable_lines_are_errors_naming_file_and_line(text, fragment):
    with pytest.raises(EnvBindingError) as info:
        parse_dotenv(text, "x.env")
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "line",
    ["hunter2:TopSecretPassphrase-77", "TopSecret-77 = x", "root:x:0:0:root:/root:/bin/bash", "'TopSecret-77'"],
)
def test_a_malformed_line_is_never_quoted(line):
    """issue 35: the error goes to step notes, the journal and the terminal; the line may be a secret."""
    with pytest.raises(EnvBindingError) as info:
        parse_dotenv(f"A=1\n{line}\n", "x.env")
    assert "x.env:2:" in str(info.value)
    assert "TopSecret" not in str(info.value) and "root:x" not in str(info.value)


def test_a_unit_sees_the_values_and_its_output_is_redacted(tmp_path):
    project = tmp_path / "p"
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "ci.env").write_text(RICH_ENV + "SHORT=abc\n", encoding="utf-8")
    seen = project / "seen.json"
    code = (
        f"import json,os; names={sorted(EXPECTED) + ['SHORT']!r}; "
        f"open({str(seen)!r},'w').write(json.dumps({{n: os.environ.get(n) for n in names}})); "
        "print(os.environ['MULTI'], os.environ['PLAIN'], os.environ['SHORT'])"
    )
    (project / "w.md").write_text(
        "---\nsteps:\n  - id: a\n    unit:\n      env: [env/ci]\n      exec:\n        command: "
        + json.dumps([sys.executable, "-c", code])
        + "\n---\n\n## a\n\nx\n",
        encoding="utf-8",
    )
    res = api.run_workflow("w.md", cwd=str(project))
    assert res.run.status == "completed"
    assert json.loads(seen.read_text()) == {**EXPECTED, "SHORT": "abc"}
    output = res.run.steps[0].output
    # both lines of the multi-line value and the plain value are secrets; "abc" is under the
    # 4-character redaction floor (documented in spec/engine.md) and stays visible
    assert output == "[REDACTED] [REDACTED] abc"
