"""`akm setup`: detection, verification, upserts, `--yes`, `--config`/`--from`, preflight, MCP.

Real parts only: loopback model servers (tests/fake_openai.py) shaped like
Ollama, LM Studio and a plain OpenAI-compatible server, one answering 401
without its key, one that accepts connections and never answers; fake `claude`,
`codex`, `opencode` executables on PATH; harness config files in a temp HOME.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from akm import cli, paths
from akm.setup import detect as det
from akm.setup.verify import verify_endpoint
from tests import fake_harness
from tests.fake_openai import FakeOpenAI, Silent

KEY = "zz-setup-secret-5c1e0d"
SIGNAL_VARS = [name for name, _, _ in det.ENV_SIGNALS] + [det.PROBE_URLS_ENV]


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def env(tmp_path, monkeypatch, project):
    """A clean machine: temp HOME, an empty bin dir as the whole PATH, no key variables, cwd = project."""
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", str(bin_dir))
    for name in SIGNAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(det.PROBE_URLS_ENV, closed_port_url())
    monkeypatch.chdir(project)

    class Env:
        pass

    e = Env()
    e.home, e.bin, e.project, e.mp = home, bin_dir, project, monkeypatch
    e.probe = lambda *bases: monkeypatch.setenv(det.PROBE_URLS_ENV, ",".join(bases))
    e.clis = lambda *names: fake_harness.install(str(bin_dir), list(names))
    return e


@pytest.fixture
def servers():
    made = []

    def make(**kw):
        s = FakeOpenAI(**kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture
def silent():
    s = Silent()
    yield s
    s.close()


def setup_cli(capsys, *args: str) -> tuple[int, dict | None, str, str]:
    code = cli.main(["setup", *args])
    out, err = capsys.readouterr()
    try:
        doc = json.loads(out) if out.strip() else None
    except ValueError:
        doc = None
    return code, doc, out, err


def config_file() -> Path:
    return paths.config_dir() / "config.json"


def config() -> dict:
    return json.loads(config_file().read_text())


def ollama(servers, model: str = "qwen2.5:7b", behaviour: str = "smart", **kw) -> FakeOpenAI:
    return servers(shape="ollama", models=[model, "nomic-embed-text"], behaviour={model: behaviour}, **kw)


# ------------------------------------------------------------------ --yes


def test_yes_writes_llm_and_agent_engines_then_a_second_run_is_byte_identical(env, servers, silent, capsys):
    locked = servers(shape="openai", models=["m"], require_key=KEY)
    oll = ollama(servers)
    lms = servers(
        shape="lmstudio",
        models=["llama-3.2-3b-instruct", "text-embedding-nomic"],
        behaviour={"llama-3.2-3b-instruct": "smart"},
    )
    env.probe(silent.base, locked.base, oll.base, lms.base)
    env.clis("claude", "codex", "opencode")

    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert config() == {
        "engines": {
            "ollama": {
                "kind": "llm",
                "provider": "ollama",
                "endpoint": f"{oll.base}/v1/chat/completions",
                "model": "qwen2.5:7b",
            },
            "opencode": {"kind": "agent", "platform": "opencode"},
        },
        "defaults": {"llmEngine": "ollama", "agentEngine": "opencode"},
        "workflow": {"judgeEngine": "ollama"},
    }
    # the verification request: exactly this body, no credential
    (req,) = oll.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["body"] == {
        "model": "qwen2.5:7b",
        "messages": [{"role": "user", "content": "Reply OK"}],
        "max_tokens": 1,
        "stream": False,
    }
    assert "Authorization" not in req["headers"]
    assert not lms.requests and not locked.requests  # the first server that verifies wins; nothing else is asked
    servers_seen = {s["base"]: s for s in doc["detected"]["servers"]}
    assert servers_seen[locked.base]["error"] == "HTTP 401" and not servers_seen[locked.base]["answered"]
    assert servers_seen[silent.base]["answered"] is False
    assert servers_seen[lms.base]["label"] == "LM Studio"
    assert servers_seen[lms.base]["chatModels"] == ["llama-3.2-3b-instruct"]
    assert servers_seen[oll.base]["chatModels"] == ["qwen2.5:7b"]  # the embedding model is not a chat model
    assert [c["platform"] for c in doc["detected"]["agentClis"]] == ["opencode", "claude", "codex"]
    assert doc["shape"] == "setup" and doc["written"] is True
    assert {"engine": "ollama", "kind": "llm", "action": "added"}.items() <= doc["engines"][0].items()
    assert any("LLM units on qwen2.5:7b via Ollama" in line for line in doc["canRun"])

    first = config_file().read_bytes()
    mtime = config_file().stat().st_mtime_ns
    code, doc2, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert config_file().read_bytes() == first and config_file().stat().st_mtime_ns == mtime
    assert doc2["written"] is False
    assert not (config_file().parent / "config-backups").exists()
    assert len(oll.requests) == 1  # defaults are set: nothing is verified again


def test_yes_probe_records_json_schema_support(env, servers, capsys):
    good = ollama(servers)
    env.probe(good.base)
    code, doc, _, err = setup_cli(capsys, "--yes", "--probe")
    assert code == 0, err
    assert config()["engines"]["ollama"]["supportsJsonSchema"] is True
    probe = good.requests[-1]["body"]
    assert probe["max_tokens"] == 64 and probe["temperature"] == 0
    assert probe["response_format"]["json_schema"]["name"] == "akm_response"
    assert doc["jsonSchema"] == {"engine": "ollama", "reachable": True, "supported": True, "reason": None}
    # a second probe run in the same environment changes nothing
    before = config_file().read_bytes()
    assert setup_cli(capsys, "--yes", "--probe")[0] == 0
    assert config_file().read_bytes() == before


def test_probe_records_false_when_the_answer_ignores_the_schema(env, servers, capsys):
    plain = servers(shape="openai", models=["chatty"], behaviour={"chatty": "plain"})
    env.probe(plain.base)
    code, _, _, err = setup_cli(capsys, "--yes", "--probe")
    assert code == 0, err
    assert config()["engines"]["local"] == {
        "kind": "llm",
        "provider": "local",
        "endpoint": f"{plain.base}/v1/chat/completions",
        "model": "chatty",
        "supportsJsonSchema": False,
    }


def test_servers_that_fail_verification_are_skipped_with_the_reason(env, servers, capsys):
    broken = servers(shape="openai", models=["m"], behaviour={"m": "fail-500"})
    empty = servers(shape="openai", models=["m"], behaviour={"m": "no-content"})
    good = servers(
        shape="lmstudio",
        models=["qwen-7b-instruct", "qwen-14b-instruct", "llama3"],
        behaviour={"qwen-14b-instruct": "smart"},
    )
    env.probe(broken.base, empty.base, good.base)
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert "HTTP 500" in err and "response did not contain choices[0].message.content" in err
    assert [(v["ok"], v["reason"]) for v in doc["verifications"]] == [
        (False, "HTTP 500"),
        (False, "response did not contain choices[0].message.content"),
        (True, None),
    ]
    assert config()["engines"] == {
        "lmstudio": {
            "kind": "llm",
            "provider": "lmstudio",
            "endpoint": f"{good.base}/v1/chat/completions",
            "model": "qwen-14b-instruct",
        }
    }
    assert len(broken.requests) == 1  # verification never retries


def test_a_server_that_never_answers_costs_one_short_timeout(env, silent, capsys):
    env.probe(silent.base)
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert not config_file().exists()
    assert silent.peak == 3  # the three questions to it are asked at once: one timeout, not three in a row
    assert "no answer within" in doc["detected"]["servers"][0]["error"]


def test_nothing_detected_exits_0_and_says_what_can_still_run(env, capsys):
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert "exec units" in doc["message"] and "session units" in doc["message"]
    assert doc["canRun"][0].startswith("exec units") and doc["written"] is False
    assert not config_file().exists()
    assert not config_file().parent.exists()  # no directory, no lock file: nothing at all
    code = cli.main(["setup", "--yes", "--format", "text"])
    out, _ = capsys.readouterr()
    assert code == 0 and "Nothing to set up was found" in out and "session units" in out


def test_existing_engines_are_reused_by_fingerprint_and_never_retuned(env, servers, capsys):
    oll = ollama(servers)
    env.probe(oll.base)
    env.clis("claude")
    mine = {"kind": "llm", "endpoint": f"{oll.base}/v1/chat/completions", "model": "llama3", "temperature": 0.1}
    reviewer = {"kind": "agent", "platform": "claude", "model": "opus"}
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(json.dumps({"engines": {"mine": mine, "reviewer": reviewer}}))
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    c = config()
    assert c["engines"] == {"mine": mine, "reviewer": reviewer}  # nothing added, nothing changed
    assert c["defaults"] == {"llmEngine": "mine", "agentEngine": "reviewer"}
    assert {(a["engine"], a["action"]) for a in doc["engines"]} == {("mine", "kept"), ("reviewer", "kept")}


def test_a_name_taken_by_another_kind_gets_a_suffix(env, capsys):
    env.clis("claude")
    other = {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"}
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(json.dumps({"engines": {"claude": other}, "defaults": {"llmEngine": "claude"}}))
    assert setup_cli(capsys, "--yes")[0] == 0
    c = config()
    assert c["engines"]["claude-2"] == {"kind": "agent", "platform": "claude"} and c["engines"]["claude"] == other
    assert c["defaults"] == {"llmEngine": "claude", "agentEngine": "claude-2"}
    assert c["workflow"] == {"judgeEngine": "claude"}


def test_set_defaults_are_left_alone_and_nothing_is_verified(env, servers, capsys):
    oll = ollama(servers)
    env.probe(oll.base)
    env.clis("codex")
    config_file().parent.mkdir(parents=True, exist_ok=True)
    existing = {
        "engines": {"fast": {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"}},
        "defaults": {"llmEngine": "fast"},
        "workflow": {"judgeEngine": "session"},
    }
    config_file().write_text(json.dumps(existing))
    assert setup_cli(capsys, "--yes")[0] == 0
    assert not oll.requests
    assert config() == {
        **existing,
        "engines": {**existing["engines"], "codex": {"kind": "agent", "platform": "codex"}},
        "defaults": {"llmEngine": "fast", "agentEngine": "codex"},
    }


def test_project_flag_writes_the_project_file(env, servers, capsys):
    oll = ollama(servers)
    env.probe(oll.base)
    (env.project / ".akm").mkdir()
    assert setup_cli(capsys, "--yes", "--project")[0] == 0
    data = json.loads((env.project / ".akm" / "config.json").read_text())
    assert data["defaults"] == {"llmEngine": "ollama"}
    assert not config_file().exists()


# ------------------------------------------------------------------ secrets


def test_a_harness_key_variable_is_used_by_name_and_its_value_never_written(env, servers, capsys):
    lab = servers(shape="openai", models=["coder", "other"], behaviour={"coder": "smart"}, require_key=KEY)
    oc = env.home / ".config" / "opencode"
    oc.mkdir(parents=True)
    (oc / "opencode.json").write_text(
        json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "model": "lab/coder",
                "provider": {
                    "lab": {
                        "npm": "@ai-sdk/openai-compatible",
                        "options": {"baseURL": f"{lab.base}/v1", "apiKey": "{env:LAB_KEY}"},
                    }
                },
            }
        )
    )
    # without the variable the server refuses and nothing is written
    code, doc, out, err = setup_cli(capsys, "--yes")
    assert code == 0 and not config_file().exists()
    assert {s["base"]: s["error"] for s in doc["detected"]["servers"]}[lab.base] == "HTTP 401"
    assert any("required credential LAB_KEY is unavailable" in w for w in doc["warnings"]), doc["warnings"]
    env.mp.setenv("LAB_KEY", KEY)
    code, doc, out, err = setup_cli(capsys, "--yes", "--probe")
    assert code == 0, err
    assert config()["engines"]["lab"] == {
        "kind": "llm",
        "provider": "lab",
        "model": "coder",
        "apiKey": "${LAB_KEY}",
        "endpoint": f"{lab.base}/v1/chat/completions",
        "supportsJsonSchema": True,
    }
    assert lab.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert doc["detected"]["harnessConfigs"][0]["apiKeyEnv"] == "LAB_KEY"
    _assert_nowhere(KEY, out + err)


def test_a_harness_config_naming_a_probed_address_lends_it_its_key_variable(env, servers, capsys):
    """The harness names a server setup probes anyway (a keyed llama.cpp on :8080): the key variable still applies."""
    lab = servers(shape="openai", models=["coder", "other"], behaviour={"coder": "smart"}, require_key=KEY)
    env.probe(lab.base)
    env.mp.setenv("LAB_KEY", KEY)
    (env.home / ".opencode").mkdir()
    (env.home / ".opencode" / "config.json").write_text(
        json.dumps(
            {"model": "coder", "providers": [{"id": "lab", "baseUrl": f"{lab.base}/v1/", "apiKey": "${LAB_KEY}"}]}
        )
    )
    code, doc, out, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    (server,) = doc["detected"]["servers"]
    assert server["answered"] and server["apiKeyEnv"] == "LAB_KEY"
    (engine,) = config()["engines"].values()
    assert engine["apiKey"] == "${LAB_KEY}" and engine["model"] == "coder"
    assert config()["defaults"]["llmEngine"] in config()["engines"]
    _assert_nowhere(KEY, out + err)


def test_a_literal_key_in_a_harness_config_is_not_imported(env, servers, capsys):
    literal = "sk-literal-" + KEY
    oc = env.home / ".opencode"
    oc.mkdir()
    (oc / "config.json").write_text(
        json.dumps({"providers": [{"id": "x", "baseUrl": "http://127.0.0.1:9/v1", "apiKey": literal}], "model": "m"})
    )
    code, doc, out, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    (h,) = [h for h in doc["detected"]["harnessConfigs"] if h["harness"] == "opencode"]
    assert h["apiKeyEnv"] is None and "did not import" in h["note"]
    _assert_nowhere(literal, out + err)


def test_a_literal_key_in_config_is_refused_before_any_probe_or_write(env, servers, capsys):
    oll = ollama(servers)
    env.probe(oll.base)
    literal = "sk-abcdef" + KEY
    blob = {
        "engines": {
            "fast": {"kind": "llm", "endpoint": f"{oll.base}/v1/chat/completions", "model": "m", "apiKey": literal}
        }
    }
    code, _, out, err = setup_cli(capsys, "--yes", "--config", json.dumps(blob))
    assert code == 78 and "apiKey" in err
    assert not config_file().parent.exists() and not oll.requests and not oll.gets
    config_file().parent.mkdir(parents=True)
    config_file().write_text('{"defaults": {}}\n')
    before = config_file().read_bytes()
    code, _, out, err = setup_cli(capsys, "--config", json.dumps(blob), "--format", "json")
    assert code == 78 and json.loads(err)["code"] == "INVALID_CONFIG_FILE"
    assert config_file().read_bytes() == before
    _assert_nowhere(literal, out + err)


def _assert_nowhere(secret: str, output: str) -> None:
    assert secret not in output
    for root in (paths.config_dir(), paths.data_dir()):
        for dirpath, _, files in os.walk(root):
            for f in files:
                assert secret.encode() not in Path(dirpath, f).read_bytes(), f


# ------------------------------------------------------------------ --config / --from


def test_config_blob_is_deep_merged_and_unknown_keys_are_dropped(env, capsys, monkeypatch):
    monkeypatch.setenv("FAST_KEY", KEY)
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(
        json.dumps(
            {
                "engines": {
                    "fast": {
                        "kind": "llm",
                        "endpoint": "http://127.0.0.1:9/v1/chat/completions",
                        "model": "m",
                        "temperature": 0.2,
                    }
                }
            }
        )
    )
    blob = {
        "profiles": {"llm": {}},
        "engines": {"fast": {"model": "m2", "apiKey": "${FAST_KEY}"}},
        "defaults": {"llmEngine": "fast"},
    }
    code, doc, out, err = setup_cli(capsys, "--config", json.dumps(blob))
    assert code == 0, err
    assert "profiles" in err and doc["fields"] == ["engines", "defaults"]
    assert config() == {
        "engines": {
            "fast": {
                "kind": "llm",
                "endpoint": "http://127.0.0.1:9/v1/chat/completions",
                "model": "m2",
                "temperature": 0.2,
                "apiKey": "${FAST_KEY}",
            }
        },
        "defaults": {"llmEngine": "fast"},
    }
    assert doc["detected"] is None  # no --yes: nothing is probed
    _assert_nowhere(KEY, out + err)


def test_from_reads_json_and_yaml_and_refuses_bad_input(env, capsys, tmp_path):
    y = tmp_path / "engines.yaml"
    y.write_text(
        "engines:\n  fast:\n    kind: llm\n    endpoint: http://127.0.0.1:9/v1/chat/completions\n"
        "    model: m\ndefaults:\n  llmEngine: fast\n"
    )
    assert setup_cli(capsys, "--from", str(y))[0] == 0
    assert config()["defaults"] == {"llmEngine": "fast"}
    assert setup_cli(capsys, "--from", str(tmp_path / "missing.json"))[0] == 78
    assert setup_cli(capsys, "--config", "not json")[0] == 2
    code, _, _, err = setup_cli(capsys, "--config", "{}", "--from", str(y))
    assert code == 2 and "INVALID_ARGUMENT" in err
    bad_endpoint = {
        "engines": {"x": {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completionz", "model": "m"}}
    }
    before = config_file().read_bytes()
    assert setup_cli(capsys, "--config", json.dumps(bad_endpoint))[0] == 78
    assert config_file().read_bytes() == before
    assert setup_cli(capsys, "--config", "[1, 2]")[0] == 78


def test_config_with_yes_fills_what_the_blob_leaves_unset(env, servers, capsys):
    env.clis("claude")
    oll = ollama(servers)
    env.probe(oll.base)
    blob = {
        "engines": {"fast": {"kind": "llm", "endpoint": f"{oll.base}/v1/chat/completions", "model": "x"}},
        "defaults": {"llmEngine": "fast"},
    }
    assert setup_cli(capsys, "--yes", "--config", json.dumps(blob))[0] == 0
    c = config()
    assert c["defaults"] == {"llmEngine": "fast", "agentEngine": "claude"}
    assert set(c["engines"]) == {"fast", "claude"} and c["workflow"] == {"judgeEngine": "fast"}
    assert not oll.requests


# ------------------------------------------------------------------ preflight and the terminal guard


@pytest.mark.parametrize(
    "content",
    [
        '{"engines": {"x": {"kind": "bogus"}}}',
        '{"profiles": {"llm": {}}}',
        '{"engines": ',
    ],
)
def test_an_invalid_existing_config_aborts_setup_untouched(env, servers, capsys, content):
    oll = ollama(servers)
    env.probe(oll.base)
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(content)
    for args in (["--yes"], ["--config", "{}"]):
        code, _, _, err = setup_cli(capsys, *args)
        assert code == 78 and "left untouched" in err, err
        assert config_file().read_text() == content
    assert not oll.gets  # aborted before looking around
    assert sorted(p.name for p in config_file().parent.iterdir()) == ["config.json"]


def test_setup_without_a_terminal_refuses_and_names_yes(env, capsys):
    code = cli.main(["setup"])
    _, err = capsys.readouterr()
    assert code == 2 and "NON_INTERACTIVE_REQUIRES_YES" in err
    assert "--yes" in err and "--config" in err and "--from" in err


# ------------------------------------------------------------------ right after setup, a workflow runs


def test_a_workflow_with_an_llm_unit_and_a_gate_completes_right_after_setup_yes(env, servers, capsys):
    from tests.helpers import run, steps_of, write_wf

    oll = ollama(servers)
    env.probe(oll.base)
    env.clis("claude")
    assert setup_cli(capsys, "--yes")[0] == 0
    wf = write_wf(
        env.project,
        "ask.md",
        """
        steps:
          - id: ask
            unit: { llm: { temperature: 0 } }
          - id: review
        """,
        "## ask\n\nSay hello.\n\n### gate\n\nThe answer greets.\n\n## review\n\nReview it.",
    )
    res = run(wf, env.project)
    assert res.run.status == "completed", steps_of(res)
    bodies = [r["body"] for r in oll.requests]
    assert any("Say hello." in json.dumps(b) for b in bodies)  # the LLM unit ran on the detected server
    assert any("Return only the JSON verdict" in json.dumps(b) for b in bodies)  # and so did its judge
    assert [c["platform"] for c in fake_harness.calls(str(env.bin))] == ["claude"]  # review: the agent engine


# ------------------------------------------------------------------ MCP


def test_mcp_setup_previews_without_arguments_and_writes_with_yes(env, servers, project):
    from tests.test_mcp import call, err

    oll = ollama(servers)
    env.probe(oll.base)

    seen = {}

    async def script(c):
        seen["preview"] = await c.call_tool("setup", {})
        seen["exists_after_preview"] = config_file().exists()
        seen["yes"] = await c.call_tool("setup", {"yes": True, "probe": True})
        seen["literal"] = await c.call_tool(
            "setup",
            {"config": {"engines": {"k": {"kind": "llm", "model": "m", "endpoint": oll.url, "apiKey": "sk-x1234567"}}}},
        )

    call(project, script)
    res = seen["preview"]
    assert not res.is_error and res.structured_content["dryRun"] is True
    assert res.structured_content["engines"][0]["engine"] == "ollama" and not seen["exists_after_preview"]
    assert not seen["yes"].is_error, seen["yes"].content
    assert config()["engines"]["ollama"]["supportsJsonSchema"] is True
    res = seen["literal"]
    assert err(res)["code"] == "INVALID_CONFIG_FILE"
    assert "sk-x1234567" not in json.dumps([c.text for c in res.content])


# ------------------------------------------------------------------ units: verification, detection


@pytest.mark.parametrize(
    "given, normalized",
    [
        ("http://localhost:11434", "http://localhost:11434/v1/chat/completions"),
        ("http://localhost:11434/", "http://localhost:11434/v1/chat/completions"),
        ("http://127.0.0.1:1234/v1", "http://127.0.0.1:1234/v1/chat/completions"),
        ("http://127.0.0.1:1234/v1/chat/completions/", "http://127.0.0.1:1234/v1/chat/completions"),
        ("https://api.groq.com/openai/v1", "https://api.groq.com/openai/v1/chat/completions"),
        (
            "https://generativelanguage.googleapis.com/v1beta/openai",
            "https://generativelanguage.googleapis.com/v1beta/openai/chat/completions",
        ),
        ("HTTP://Example.COM:8080/v1", "http://example.com:8080/v1/chat/completions"),
        # a WHATWG URL (the reference's parser) serializes without a default or empty port
        ("http://localhost:80/v1", "http://localhost/v1/chat/completions"),
        ("https://[::1]:443", "https://[::1]/v1/chat/completions"),
        ("http://h:/openai", "http://h/openai/chat/completions"),
        ("https://h:80/v1", "https://h:80/v1/chat/completions"),
    ],
)
def test_endpoint_normalization(given, normalized):
    from akm.config import normalize_chat_endpoint

    assert normalize_chat_endpoint(given) == normalized


@pytest.mark.parametrize("bad", ["ftp://x/v1", "http://u:p@host/v1", "http://h/v1?x=1", "http://h/v1#f", "nope", ""])
def test_unusable_urls_are_reasons_not_requests(bad):
    v = verify_endpoint(bad, "m")
    assert not v.ok and v.reason and v.endpoint is None


def test_verification_reasons(servers, monkeypatch):
    srv = servers(shape="openai", models=["m"], behaviour={"m": "echo-auth", "x": "unauthorized"})
    assert verify_endpoint(srv.base, " ").reason == "no detected model"
    monkeypatch.delenv("NOPE", raising=False)
    v = verify_endpoint(srv.base, "m", "NOPE")
    assert v.reason == "required credential NOPE is unavailable" and not srv.requests
    monkeypatch.setenv("NOPE", KEY)
    v = verify_endpoint(srv.base, "m", "NOPE")
    assert v.ok and v.endpoint == srv.url and srv.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(v)
    assert verify_endpoint(srv.base, "x").reason == "HTTP 401"
    assert verify_endpoint(srv.base, "no-choices").reason == "response did not contain choices[0].message.content"
    assert "not JSON" in verify_endpoint(srv.base, "malformed").reason
    assert "refused" in verify_endpoint(closed_port_url(), "m").reason.lower()


def test_default_model_pick():
    assert det.pick_default_model(["llama3", "qwen-7b-instruct", "qwen-14b-instruct"]) == "qwen-14b-instruct"
    assert det.pick_default_model(["a", "bb"]) == "bb"
    assert det.pick_default_model(["ab", "aa"]) == "aa"
    assert det.pick_default_model([]) is None and det.pick_default_model(["", " "]) is None


def test_env_names_from_harness_configs_lose_their_braces():
    assert det.env_name_of("${X_KEY}") == "X_KEY"
    assert det.env_name_of("$OPENAI_API_KEY") == "OPENAI_API_KEY"
    assert det.env_name_of("{env:LAB}") == "LAB"
    assert det.env_name_of("sk-123") is None and det.env_name_of("${1BAD}") is None


def test_harness_importers(tmp_path):
    home = tmp_path / "h"
    (home / ".claude").mkdir(parents=True)
    c = det.import_claude_code(home)
    assert (c.model, c.api_key_env, c.base_url, c.provider) == (
        "claude-sonnet-4-5",
        "ANTHROPIC_API_KEY",
        None,
        "anthropic",
    )
    (home / ".claude" / "settings.json").write_text(
        json.dumps({"env": {"ANTHROPIC_MODEL": "opus", "ANTHROPIC_API_KEY": KEY}})
    )
    c = det.import_claude_code(home)
    assert c.model == "opus" and KEY not in json.dumps(c.__dict__)
    (home / ".opencode").mkdir()
    (home / ".opencode" / "config.json").write_text(
        json.dumps({"model": "m", "providers": [{"id": "x", "base_url": "http://h:1/v1", "apiKey": "$OPENAI_API_KEY"}]})
    )
    o = det.import_opencode(home, tmp_path, {})
    assert (o.provider, o.base_url, o.api_key_env, o.model) == ("x", "http://h:1/v1", "OPENAI_API_KEY", "m")
    assert det.import_opencode(tmp_path / "nobody", tmp_path, {}) is None


def test_env_scan_records_names_only(monkeypatch):
    found = det.scan_env({"OPENAI_API_KEY": KEY, "GROQ_API_KEY": "  ", "OLLAMA_HOST": "0.0.0.0:11434"})
    assert [(e.name, e.provider, e.kind) for e in found] == [
        ("OPENAI_API_KEY", "openai", "apiKey"),
        ("OLLAMA_HOST", "ollama", "endpoint"),
    ]
    assert KEY not in repr(found)
    servers_ = det.probe_list({"OLLAMA_HOST": "0.0.0.0", det.PROBE_URLS_ENV: "http://127.0.0.1:5/v1/"}, [])
    assert [s.base for s in servers_] == ["http://127.0.0.1:5", "http://127.0.0.1:11434"]
    # as Ollama reads OLLAMA_HOST: a scheme brings its own default port
    for value, base in [
        ("ollama.lan", "http://ollama.lan:11434"),
        ("http://box", "http://box"),
        ("https://ollama.example.com", "https://ollama.example.com"),
        ("http://box:9000/", "http://box:9000"),
    ]:
        found = det.probe_list({"OLLAMA_HOST": value, det.PROBE_URLS_ENV: "http://127.0.0.1:5"}, [])
        assert [s.base for s in found][1:] == [base], value


def test_probe_alone_records_support_on_the_existing_default(env, servers, capsys):
    srv = servers(shape="openai", models=["smart"])
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(
        json.dumps(
            {
                "engines": {"fast": {"kind": "llm", "endpoint": srv.url, "model": "smart"}},
                "defaults": {"llmEngine": "fast"},
            }
        )
    )
    code, doc, _, err = setup_cli(capsys, "--probe")
    assert code == 0, err
    assert config()["engines"]["fast"]["supportsJsonSchema"] is True and doc["detected"] is None
    assert setup_cli(capsys, "--config", "null")[0] == 78


def test_a_configured_platform_is_preferred_over_the_default_order(env, capsys):
    env.clis("opencode", "codex")
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(json.dumps({"engines": {"fixer": {"kind": "agent", "platform": "codex"}}}))
    assert setup_cli(capsys, "--yes")[0] == 0
    assert config() == {
        "engines": {"fixer": {"kind": "agent", "platform": "codex"}},
        "defaults": {"agentEngine": "fixer"},
        "workflow": {"judgeEngine": "fixer"},
    }


def test_ollama_list_names_installed_models_when_its_server_is_silent(env, capsys):
    exe = env.bin / "ollama"
    exe.write_text(
        "#!/bin/sh\necho 'NAME             ID              SIZE      MODIFIED'\n"
        "echo 'qwen2.5:7b       845dbda0ea48    4.7 GB    2 days ago'\n"
        "echo 'llama3:latest    365c0bd3c000    4.7 GB    3 weeks ago'\n"
    )
    exe.chmod(0o755)
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert doc["detected"]["ollamaCliModels"] == ["llama3", "qwen2.5:7b"]
    assert not config_file().exists()  # installed models are not a server that answers


def test_a_configured_engine_of_the_preferred_platform_is_reused_even_on_an_llm_engine(env, servers, capsys):
    """`--yes` prefers a platform the user configured, and then uses THAT engine (no second opencode engine)."""
    env.clis("claude", "opencode")
    mine = {
        "engines": {
            "fast": {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"},
            "oc": {"kind": "agent", "platform": "opencode", "llmEngine": "fast", "model": "big"},
        },
        "defaults": {"llmEngine": "fast"},
    }
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(json.dumps(mine))
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert config()["engines"] == mine["engines"]
    assert config()["defaults"] == {"llmEngine": "fast", "agentEngine": "oc"}
    assert [(a["engine"], a["action"]) for a in doc["engines"]] == [("oc", "kept")]


def test_the_yes_summary_keeps_its_documented_shape(env, servers, capsys):
    """spec/setup.md §7: the key sets of the JSON summary are a contract (schemaVersion 1)."""
    oll = ollama(servers)
    env.probe(oll.base)
    env.clis("claude")
    env.mp.setenv("OPENAI_API_KEY", KEY)
    (env.home / ".claude").mkdir()
    (env.home / ".opencode").mkdir()
    (env.home / ".opencode" / "config.json").write_text(
        json.dumps(
            {"model": "m", "providers": [{"id": "x", "baseUrl": closed_port_url(), "apiKey": "$OPENAI_API_KEY"}]}
        )
    )
    code, doc, out, err = setup_cli(capsys, "--yes", "--probe")
    assert code == 0, err
    assert list(doc) == [
        "shape",
        "schemaVersion",
        "configPath",
        "written",
        "dryRun",
        "fields",
        "engines",
        "defaults",
        "judgeEngine",
        "detected",
        "verifications",
        "jsonSchema",
        "warnings",
        "canRun",
        "message",
    ]
    assert (doc["shape"], doc["schemaVersion"], doc["written"], doc["dryRun"]) == ("setup", 1, True, False)
    assert list(doc["detected"]) == ["servers", "agentClis", "harnessConfigs", "envVars", "ollamaCliModels", "seconds"]
    assert {tuple(e) for e in doc["engines"]} == {("engine", "kind", "action", "detail")}
    assert {tuple(s) for s in doc["detected"]["servers"]} == {
        (
            "base",
            "endpoint",
            "label",
            "source",
            "provider",
            "answered",
            "models",
            "chatModels",
            "defaultModel",
            "apiKeyEnv",
            "error",
        )
    }
    assert [tuple(a) for a in doc["detected"]["agentClis"]] == [("platform", "path", "version", "testedVersion")]
    assert [h["harness"] for h in doc["detected"]["harnessConfigs"]] == ["claude-code", "opencode"]
    assert {tuple(h) for h in doc["detected"]["harnessConfigs"]} == {
        ("harness", "file", "provider", "model", "baseUrl", "apiKeyEnv", "note")
    }
    assert [tuple(e) for e in doc["detected"]["envVars"]] == [("name", "provider", "kind")]
    assert {tuple(v) for v in doc["verifications"]} == {("ok", "endpoint", "model", "reason", "apiKeyEnv")}
    assert list(doc["jsonSchema"]) == ["engine", "reachable", "supported", "reason"]
    _assert_nowhere(KEY, out + err)
    code, again, out, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert list(again) == list(doc) and again["written"] is False
    assert again["engines"] == [] and again["verifications"] == [] and again["defaults"] == doc["defaults"]


def test_agent_clis_are_found_in_the_documented_order(env, capsys):
    env.clis(*reversed(list(fake_harness.PLATFORMS)))
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert [(c["platform"], Path(c["path"]).name) for c in doc["detected"]["agentClis"]] == [
        ("opencode", "opencode"),
        ("claude", "claude"),
        ("codex", "codex"),
        ("copilot", "copilot"),
        ("pi", "pi"),
        ("gemini", "gemini"),
        ("aider", "aider"),
        ("amazonq", "q"),
        ("openhands", "openhands"),
    ]
    assert config()["engines"] == {"opencode": {"kind": "agent", "platform": "opencode"}}
    # each CLI's own `--version`, and the version akm's CI runs for real (none: driven by its documented output)
    versions = {c["platform"]: (c["version"], c["testedVersion"]) for c in doc["detected"]["agentClis"]}
    assert versions["claude"] == ("2.1.332", "2.1.332") and versions["gemini"] == ("0.61.0", "0.61.0")
    assert versions["aider"] == ("1.0.0", None) and versions["amazonq"] == ("1.0.0", None)
    from akm.cli.render import agent_cli_text

    assert agent_cli_text(doc["detected"]["agentClis"][1]).startswith("claude 2.1.332 (the version akm is tested with)")
    assert "(not tested by akm: driven by its documented output)" in agent_cli_text(doc["detected"]["agentClis"][6])


def test_the_versions_akm_is_tested_with_are_the_ones_its_ci_installs():
    from akm.dispatch.harnesses import TESTED_VERSIONS
    from tests import real_clis

    pinned = json.loads((real_clis.HERE / "package.json").read_text())["dependencies"]
    packages = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai"}
    packages["gemini"] = "@google/gemini-cli"
    assert {p: pinned[pkg] for p, pkg in packages.items()} == TESTED_VERSIONS
    assert fake_harness.FAKE_VERSIONS == TESTED_VERSIONS


def test_verification_accepts_an_empty_answer_and_names_every_other_failure(servers):
    """spec-setup §4.7 step 5: content must be a string (empty is fine); anything else is a reason, not a crash."""
    srv = servers(shape="openai", models=["m"])
    assert verify_endpoint(srv.base, "filtered").ok  # "" is a string
    assert verify_endpoint(srv.base, "no-content").reason == "response did not contain choices[0].message.content"
    for model, words in [
        ("html-200", "HTML"),
        ("stream", "event stream"),
        ("fail-500", None),
        ("rate-limit", None),
        ("html-502", None),
    ]:
        v = verify_endpoint(srv.base, model)
        assert not v.ok and v.reason, model
        if words is None:
            assert v.reason.startswith("HTTP ") and v.reason[5:].isdigit(), (model, v.reason)
        else:
            assert words in v.reason and srv.url not in v.reason, (model, v.reason)
    assert len([r for r in srv.requests if r["body"]["model"] == "rate-limit"]) == 1  # one request, no retry


@pytest.mark.parametrize(
    "url",
    [
        "http://me:{K}@127.0.0.1:9/v1",
        "http://127.0.0.1:9/v1?key={K}",
        "http://127.0.0.1:9/v1#{K}",
        "http://127.0.0.1:x{K}/v1",
    ],
)
def test_a_harness_base_url_carrying_a_secret_is_neither_imported_nor_shown(env, capsys, url):
    secret = "sk-in-url-" + KEY
    oc = env.home / ".config" / "opencode"
    oc.mkdir(parents=True)
    (oc / "opencode.json").write_text(
        json.dumps({"model": "lab/m", "provider": {"lab": {"options": {"baseURL": url.format(K=secret)}}}})
    )
    code, doc, out, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    (h,) = doc["detected"]["harnessConfigs"]
    assert h["baseUrl"] is None and "did not import" in h["note"]
    assert [s["source"] for s in doc["detected"]["servers"]] == ["probe"]
    _assert_nowhere(secret, out + err)


def test_with_the_project_file_complete_the_user_file_is_not_created(env, servers, capsys):
    env.clis("codex")
    oll = ollama(servers)
    env.probe(oll.base)
    assert setup_cli(capsys, "--yes", "--project")[0] == 0
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert doc["written"] is False and doc["engines"] == [] and "was not created" in doc["message"]
    assert not config_file().parent.exists()


def test_the_json_schema_probe_reads_the_answer_leniently(servers):
    """spec-setup §5.6: structuredOutput by the lenient parse (§5.7): a think block and a fence are fine."""
    from akm.setup.verify import probe_json_schema

    srv = servers(shape="openai", models=["probe-fenced"])
    engine = {"kind": "llm", "endpoint": srv.url, "model": "probe-fenced"}
    assert probe_json_schema("fast", engine, default_llm="fast", environ={}).supported is True
    assert probe_json_schema("fast", {**engine, "model": "plain"}, default_llm="fast", environ={}).supported is False
    body = srv.requests[0]["body"]
    assert (body["max_tokens"], body["temperature"], body["response_format"]["type"]) == (64, 0, "json_schema")


def test_a_localhost_engine_is_the_same_server_as_the_probed_loopback_address(env, servers, capsys):
    oll = ollama(servers)
    env.probe(oll.base)  # http://127.0.0.1:<port>
    mine = {
        "kind": "llm",
        "endpoint": oll.base.replace("127.0.0.1", "localhost") + "/v1/chat/completions",
        "model": "qwen2.5:7b",
    }
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(json.dumps({"engines": {"mine": mine}}))
    code, doc, _, err = setup_cli(capsys, "--yes")
    assert code == 0, err
    assert config() == {
        "engines": {"mine": mine},
        "defaults": {"llmEngine": "mine"},
        "workflow": {"judgeEngine": "mine"},
    }
    assert [(a["engine"], a["action"]) for a in doc["engines"]] == [("mine", "kept")]


def test_the_summary_says_which_steps_go_where():
    """With a chat model and no agent CLI, the summary does not promise that the model does everything: steps that
    need a workspace and tools go to the calling agent (spec/config.md §5)."""
    from akm.setup.core import can_run

    fast = {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"}
    llm_only = can_run({"engines": {"fast": fast}, "defaults": {"llmEngine": "fast"}})
    where = [line for line in llm_only if line.startswith("where steps go: ")]
    assert where[0].startswith("where steps go: plain steps") and "LLM engine fast" in where[0]
    assert "a shell block to run" in where[1] and "the calling agent" in where[1]
    both = can_run(
        {
            "engines": {"fast": fast, "cc": {"kind": "agent", "platform": "claude"}},
            "defaults": {"llmEngine": "fast", "agentEngine": "cc"},
        }
    )
    assert any("tools" in line and "agent engine cc" in line for line in both)
    assert (
        can_run({})[-1] == "where steps go: every step (exec units aside): the calling agent — no engine is configured"
    )


def test_an_npm_clis_version_is_read_from_its_package_without_starting_it(tmp_path):
    """`node_modules/.bin/gemini` links into @google/gemini-cli: its package.json says the version `--version`
    would print, without the seconds a node CLI takes to start."""
    from akm.setup.detect import agent_clis, npm_package_version

    pkg = tmp_path / "node_modules" / "@google" / "gemini-cli"
    (pkg / "bundle").mkdir(parents=True)
    (pkg / "package.json").write_text(
        json.dumps({"name": "@google/gemini-cli", "version": "9.8.7", "bin": {"gemini": "x"}})
    )
    script = pkg / "bundle" / "gemini.js"
    script.write_text("#!/bin/sh\nexit 3\n")  # it is never run: --version would fail
    script.chmod(0o755)
    bin_dir = tmp_path / "node_modules" / ".bin"
    bin_dir.mkdir()
    (bin_dir / "gemini").symlink_to(script)
    assert npm_package_version(str(bin_dir / "gemini")) == "9.8.7"
    [cli] = agent_clis(str(bin_dir))
    assert (cli.platform, cli.version, cli.tested_version) == ("gemini", "9.8.7", "0.61.0")
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "package.json").write_text(json.dumps({"name": "my-app", "version": "1.0.0", "bin": "cli.js"}))
    (other / "gemini").write_text("#!/bin/sh\necho 'gemini 0.1.2'\n")
    (other / "gemini").chmod(0o755)
    assert npm_package_version(str(other / "gemini")) is None  # a package.json that is not the CLI's
    [asked] = agent_clis(str(other))
    assert asked.version == "0.1.2"  # then its --version is asked
