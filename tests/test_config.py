"""Config: the user file under the project file, validation as one coded error, locked atomic saves, `akm config`."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from akm import cli, config, paths
from akm.errors import ConfigError

FAST = {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "qwen3"}


@pytest.fixture
def user_file():
    path = paths.config_dir() / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def akm(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def err_json(capsys, *args: str) -> tuple[int, dict]:
    code = cli.main([*args, "--format", "json"])
    _, err = capsys.readouterr()
    return code, json.loads(err)


# --------------------------------------------------------------------------- locations and layers


def test_locations_honour_overrides(tmp_path, monkeypatch):
    assert paths.config_dir() == tmp_path / "xdg-config" / "akm"  # conftest's XDG_CONFIG_HOME
    monkeypatch.setenv("AKM_CONFIG_DIR", str(tmp_path / "elsewhere"))
    assert config.user_config_path() == tmp_path / "elsewhere" / "config.json"


def test_no_file_is_an_empty_config_and_nothing_is_created(project, capsys):
    assert config.load_config_if_any(project) is None
    code, out, _ = akm(capsys, "config", "list")
    assert code == 0 and json.loads(out) == {}
    assert not paths.config_dir().exists()


def test_project_file_is_merged_over_the_user_file(project, user_file):
    user_file.write_text(
        json.dumps(
            {
                "engines": {"fast": {**FAST, "temperature": 0.2}},
                "workflow": {"maxConcurrency": 4, "defaultMapConcurrency": 2},
                "modelAliases": {"big": {"*": "a", "fast": "b"}},
            }
        )
    )
    (project / ".akm").mkdir()
    (project / ".akm" / "config.json").write_text(
        json.dumps(
            {
                "engines": {"fast": {"model": "llama"}},
                "workflow": {"maxConcurrency": 8},
                "modelAliases": {"big": {"*": "c"}},
            }
        )
    )
    loaded = config.load_config(project)
    fast = loaded.config.engines["fast"]
    assert (fast.model, fast.temperature, fast.endpoint) == ("llama", 0.2, FAST["endpoint"])  # objects merge
    assert loaded.config.workflow.max_concurrency == 8 and loaded.config.workflow.default_map_concurrency == 2
    assert loaded.merged["modelAliases"] == {"big": {"*": "c", "fast": "b"}}
    assert loaded.files == [user_file, project / ".akm" / "config.json"]


def test_arrays_replace_and_unknown_keys_round_trip(project, user_file, capsys):
    user_file.write_text(
        json.dumps(
            {
                "engines": {"cc": {"kind": "agent", "platform": "claude", "args": ["-a", "-b"], "futureKey": 1}},
                "futureTop": {"x": 1},
            }
        )
    )
    assert akm(capsys, "config", "set", "engines.cc.args", '["-c"]')[0] == 0
    data = json.loads(user_file.read_text())
    assert data["engines"]["cc"]["args"] == ["-c"] and data["engines"]["cc"]["futureKey"] == 1
    assert data["futureTop"] == {"x": 1}


def test_comments_are_allowed_trailing_commas_are_not(project, user_file):
    user_file.write_text(
        '{\n  // the fast one\n  "engines": {"fast": /* inline */ %s}, "x": "a // not a comment"\n}' % json.dumps(FAST)
    )
    loaded = config.load_config(project)
    assert loaded.merged["x"] == "a // not a comment" and loaded.config.engines["fast"].model == "qwen3"
    user_file.write_text('{"engines": {},}')
    with pytest.raises(ConfigError) as info:
        config.load_config(project)
    assert info.value.code == "INVALID_CONFIG_FILE" and str(user_file) in info.value.message
    assert "trailing commas" in info.value.hint and info.value.exit_status == 78
    user_file.write_text("[]")
    with pytest.raises(ConfigError, match="JSON object"):
        config.load_config(project)


def test_every_problem_in_one_error_naming_file_and_key_path(project, user_file, capsys):
    user_file.write_text(
        json.dumps(
            {
                "engines": {
                    "Fast": FAST,
                    "nosuffix": {**FAST, "endpoint": "http://h/v1"},
                    "userinfo": {**FAST, "endpoint": "http://u:p@h/v1/chat/completions"},
                    "literal": {**FAST, "apiKey": "sk-live-123456"},
                    "agentish": {**FAST, "platform": "claude"},
                    "llmish": {"kind": "agent", "platform": "claude", "endpoint": "http://x/v1/chat/completions"},
                    "claudellm": {"kind": "agent", "platform": "claude", "llmEngine": "fast"},
                    "nokind": {"model": "x"},
                    "protected": {**FAST, "extraParams": {"stream": True}},
                    "creds": {**FAST, "extraParams": {"nested": {"Authorization": "x"}}},
                },
                "workflow": {"maxConcurrency": 0},
            }
        )
    )
    code, err = err_json(capsys, "config", "list")
    assert code == 78 and err["code"] == "INVALID_CONFIG_FILE"
    paths_ = {i["path"]: i["message"] for i in err["details"]["issues"]}
    assert "engines.Fast" in paths_
    assert "/chat/completions" in paths_["engines.nosuffix.endpoint"]
    assert "user name or password" in paths_["engines.userinfo.endpoint"]
    assert "${NAME}" in paths_["engines.literal.apiKey"]
    assert paths_["engines.agentish"] == "platform is not valid on an LLM engine"
    assert paths_["engines.llmish"] == "endpoint is not valid on an agent engine"
    assert "llmEngine is not supported on platform claude" in paths_["engines.claudellm"]
    assert "kind" in paths_["engines.nokind"]
    assert "protected" in paths_["engines.protected.extraParams"]
    assert "credentials" in paths_["engines.creds.extraParams"]
    assert "workflow.maxConcurrency" in paths_
    assert "sk-live-123456" not in json.dumps(err)
    assert akm(capsys, "config", "path")[1].strip() == str(user_file)  # path works on a broken file


def test_cross_field_rules_name_the_file_that_sets_the_key(project, user_file):
    user_file.write_text(json.dumps({"engines": {"fast": FAST, "cc": {"kind": "agent", "platform": "claude"}}}))
    (project / ".akm").mkdir()
    proj = project / ".akm" / "config.json"
    proj.write_text(
        json.dumps({"defaults": {"llmEngine": "cc", "agentEngine": "fast"}, "workflow": {"judgeEngine": "nope"}})
    )
    with pytest.raises(ConfigError) as info:
        config.load_config(project)
    issues = {i["path"]: i for i in info.value.details["issues"]}
    assert (
        issues["defaults.llmEngine"]["file"] == str(proj) and "agent engine" in issues["defaults.llmEngine"]["message"]
    )
    assert "llm engine" in issues["defaults.agentEngine"]["message"]
    assert "not configured" in issues["workflow.judgeEngine"]["message"]
    proj.write_text(json.dumps({"workflow": {"judgeEngine": "session"}}))
    assert config.load_config(project).config.workflow.judge_engine == "session"


def test_retired_upstream_keys_are_named(project, user_file):
    for data, word in (
        ({"profiles": {}}, "profiles"),
        ({"llm": {}}, "'llm'"),
        ({"defaults": {"engine": "x"}}, "defaults.engine"),
    ):
        user_file.write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=word):
            config.load_config(project)


# --------------------------------------------------------------------------- akm config set / get / unset


def test_set_get_unset_round_trip(project, user_file, capsys):
    code, out, _ = akm(capsys, "config", "set", "engines.fast", json.dumps(FAST))
    assert code == 0 and "engines.fast" in out
    code, out, _ = akm(capsys, "config", "get", "engines.fast")
    assert json.loads(out) == FAST
    assert akm(capsys, "config", "set", "engines.fast", '{"temperature": 0.1}')[0] == 0  # deep merge
    assert json.loads(akm(capsys, "config", "get", "engines.fast")[1]) == {**FAST, "temperature": 0.1}
    assert akm(capsys, "config", "set", "engines.fast.supportsJsonSchema", "true")[0] == 0
    assert akm(capsys, "config", "set", "engines.fast.timeoutMs", "10m")[0] == 0
    assert akm(capsys, "config", "set", "engines.fast.maxTokens", "512")[0] == 0
    got = json.loads(akm(capsys, "config", "get", "engines.fast")[1])
    assert got["supportsJsonSchema"] is True and got["timeoutMs"] == 600_000 and got["maxTokens"] == 512
    assert akm(capsys, "config", "set", "engines.fast.timeoutMs", "none")[0] == 0
    assert json.loads(akm(capsys, "config", "get", "engines.fast.timeoutMs")[1]) is None
    assert config.load_config(project).config.engines["fast"].declared("timeout_ms")
    assert json.loads(akm(capsys, "config", "get", "engines.missing")[1]) is None
    assert akm(capsys, "config", "unset", "engines.fast")[0] == 0
    assert json.loads(user_file.read_text()) == {}  # emptied parents pruned


def test_set_refuses_literal_secrets_with_a_hint(project, user_file, capsys):
    akm(capsys, "config", "set", "engines.fast", json.dumps(FAST))
    for value in ("${FAST_KEY}", "$FAST_KEY"):
        assert akm(capsys, "config", "set", "engines.fast.apiKey", value)[0] == 0
        assert json.loads(user_file.read_text())["engines"]["fast"]["apiKey"] == value
    code, err = err_json(capsys, "config", "set", "engines.fast.apiKey", "sk-live-123")
    assert code == 2 and err["code"] == "INVALID_ARGUMENT" and "AKM_ENGINE_FAST_API_KEY" in err["hint"]
    code, err = err_json(capsys, "config", "set", "engines.other", json.dumps({**FAST, "apiKey": "sk-live-123"}))
    assert code == 2 and "sk-live-123" not in json.dumps(err)
    assert "sk-live-123" not in user_file.read_text()


@pytest.mark.parametrize(
    "key,value,code",
    [
        ("engines.fast.endpoint", "http://h/v1", 2),  # leaf values are checked as typed (spec-setup §2.8, test 6)
        ("engines.fast.endpoint", "ftp://h/chat/completions", 2),
        ("engines.fast.endpoint", "http://h/v1/chat/completions?x=1", 2),
        ("engines.fast.endpoint", "http://u:p@h/v1/chat/completions", 2),
        ("engines.fast.endpoint", "http://h:99999/v1/chat/completions", 2),  # no such port
        ("engines.fast.endpoint", "http://h:abc/v1/chat/completions", 2),
        ("engines.fast.endpoint", "http://h /v1/chat/completions", 2),
        ("engines.slow", json.dumps({**FAST, "endpoint": "http://h/v1"}), 2),
        ("engines.fast.maxTokens", "0", 2),
        ("engines.fast.concurrency", "-3", 2),
        ("engines.fast.temperature", "warm", 2),
        ("engines.fast.supportsJsonSchema", "yes", 2),
        ("engines.fast.kind", "robot", 2),
        ("engines.Fast", json.dumps(FAST), 78),
        ("defaults.llmEngine", "nope", 78),
        ("no.such.key", "1", 2),
        ("engines.fast.nope", "1", 2),
        ("workflow.maxConcurrency", "1.5", 2),
    ],
)
def test_set_refusals_leave_the_file_untouched(project, user_file, capsys, key, value, code):
    akm(capsys, "config", "set", "engines.fast", json.dumps(FAST))
    before = user_file.read_bytes()
    got, err = err_json(capsys, "config", "set", key, value)
    assert got == code, err
    assert user_file.read_bytes() == before


def test_an_endpoint_refused_for_its_password_is_not_echoed(project, capsys):
    code, err = err_json(capsys, "config", "set", "engines.fast.endpoint", "http://me:hunter2pw@h/v1/chat/completions")
    assert code == 2 and "password" in err["error"] and "hunter2pw" not in json.dumps(err)


def test_https_endpoint_with_a_path_prefix_is_fine(project, capsys):
    assert (
        akm(
            capsys,
            "config",
            "set",
            "engines.h",
            json.dumps({**FAST, "endpoint": "https://h/openai/v1/chat/completions"}),
        )[0]
        == 0
    )


def test_project_flag_writes_the_project_file(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    (project / ".git").mkdir()
    assert akm(capsys, "config", "set", "--project", "workflow.maxConcurrency", "3")[0] == 0
    assert json.loads((project / ".akm" / "config.json").read_text()) == {"workflow": {"maxConcurrency": 3}}
    assert akm(capsys, "config", "path", "--project")[1].strip() == str(project / ".akm" / "config.json")
    assert json.loads(akm(capsys, "config", "get", "workflow.maxConcurrency")[1]) == 3


def test_bare_config_is_a_usage_error(capsys):
    assert akm(capsys, "config")[0] == 2


# --------------------------------------------------------------------------- saving


def test_saves_are_private_atomic_and_backed_up(project, user_file, capsys):
    akm(capsys, "config", "set", "engines.fast", json.dumps(FAST))
    assert stat.S_IMODE(user_file.stat().st_mode) == 0o600
    for i in range(7):
        akm(capsys, "config", "set", "engines.fast.temperature", f"0.{i + 1}")
    backups = sorted((user_file.parent / "config-backups").glob("config-*.json"))
    assert len(backups) == config.BACKUPS_KEPT
    assert all(stat.S_IMODE(b.stat().st_mode) == 0o600 for b in backups)
    assert stat.S_IMODE((user_file.parent / "config-backups").stat().st_mode) == 0o700
    assert json.loads(backups[-1].read_text())["engines"]["fast"]["temperature"] == 0.6
    mtime = user_file.stat().st_mtime_ns
    code, out, _ = akm(capsys, "config", "set", "engines.fast.temperature", "0.7")
    assert "unchanged" in out and user_file.stat().st_mtime_ns == mtime  # idempotent: no write, no backup
    assert not [p for p in user_file.parent.iterdir() if p.name.endswith(".tmp")]


def test_concurrent_writers_do_not_lose_updates(project, user_file):
    def add(i: int) -> None:
        config.update_config_file(
            lambda d: {**d, "engines": {**d.get("engines", {}), f"e{i}": {**FAST, "model": f"m{i}"}}}, cwd=project
        )

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(json.loads(user_file.read_text())["engines"]) == [f"e{i}" for i in range(8)]


def test_setup_helpers_upsert_without_duplicates(project):
    data: dict = {}
    name, added = config.upsert_engine(data, FAST, name_hint="Local")
    assert (name, added) == ("local", True)
    again, added = config.upsert_engine(data, {**FAST, "endpoint": FAST["endpoint"] + "/"}, name_hint="local")
    assert (again, added) == ("local", False)
    same_server, added = config.upsert_engine(data, {**FAST, "model": "other"}, name_hint="local")
    assert (same_server, added) == ("local", False)  # one server is one engine, whatever its model
    other, added = config.upsert_engine(
        data, {**FAST, "endpoint": "http://127.0.0.1:10/v1/chat/completions"}, name_hint="local"
    )
    assert (other, added) == ("local-2", True)
    assert config.set_default_if_unset(data, "llmEngine", "local") is True
    assert config.set_default_if_unset(data, "llmEngine", "local-2") is False
    assert config.slug_engine_name("LM Studio!") == "lm-studio" and config.slug_engine_name("akm-x") == "x"
    assert config.slug_engine_name("session") == "engine"
    # spec-setup §4.8: a slug must start with a letter, else the engine is `local`
    assert config.slug_engine_name("302ai") == "local" and config.slug_engine_name("--") == "local"
    assert config.slug_engine_name("akm-9x") == "local" and config.slug_engine_name("akm-akm-x") == "x"
    assert config.unique_engine_name({"local": {}}, "1x") == "local-2"


def test_exec_only_runs_do_not_build_config_models(project, monkeypatch):
    """No config file: freezing a plan reads nothing and builds no pydantic config model."""
    from akm.config import _schema  # where the built models are kept

    monkeypatch.setattr(_schema, "_MODELS", None)
    from tests.helpers import py, run, write_wf

    wf = write_wf(
        project, "e.md", f"steps:\n  - id: a\n    unit: {{ exec: {{ command: {py('print(1)')} }} }}\n", "## a\n\nrun"
    )
    assert run(wf, project).run.status == "completed"
    assert _schema._MODELS is None
    assert os.environ.get("AKM_CONFIG_DIR") is None


def test_journal_url_password_must_be_a_braced_reference_the_connection_can_read(project, user_file, capsys):
    """`$NAME` is an env reference elsewhere in config, but the journal connection reads only `${NAME}`:
    a URL it would send as the literal text `$NAME` is refused where it is stored."""
    code, _, err = akm(capsys, "config", "set", "journal.url", "postgresql://akm:$AKM_PW@db.internal/akm")
    assert code == 2 and "INVALID_ARGUMENT" in err and "${NAME}" in err
    code, _, err = akm(capsys, "config", "set", "journal.url", "postgresql://akm:${AKM_PW}@db.internal/akm")
    assert code == 0, err
