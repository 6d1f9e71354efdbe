"""Budgets in money (issue 38): engine prices in config, `budget.max_cost`, `budget.unknown`, `limits.maxCostPerDay`.

Real runs against the loopback OpenAI-compatible server (tests/fake_openai.py): the `plain` model answers with
12 prompt + 5 completion tokens, `echo` with no usage at all. At $1000 / $2000 per million input / output
tokens a `plain` call costs (12 * 1000 + 5 * 2000) / 1e6 = $0.022.
"""

from __future__ import annotations

import json

import pytest

from akm import api, cli
from akm.engine.cost import unit_cost
from akm.store.report_guards import ReportPlan, check_budget
from tests.helpers import journal_sql, steps_of, write_wf

PRICES = {"input": 1000, "output": 2000}
PLAIN = 0.022


def _config(capsys, *args: str) -> None:
    code = cli.main(["config", *args])
    _, err = capsys.readouterr()
    assert code == 0, err


def _engine(capsys, fake_openai, model: str = "plain", prices: dict | None = PRICES) -> None:
    engine = {"kind": "llm", "endpoint": fake_openai.url, "model": model}
    if prices is not None:
        engine["prices"] = prices
    _config(capsys, "set", "engines.fast", json.dumps(engine))
    _config(capsys, "set", "defaults.llmEngine", "fast")


def _fan_out(project, budget: str, name: str = "fan.md", concurrency: int = 1):
    return write_wf(
        project,
        name,
        f"""
        params: {{ items: {{ type: array }} }}
        budget: {budget}
        steps:
          - id: each
            map: {{ over: params.items, concurrency: {concurrency} }}
        """,
        "## each\n\nHandle the item.",
    )


def _items(n: int) -> dict:
    return {"items": [f"item-{i}" for i in range(n)]}


def test_a_priced_fan_out_stops_at_the_money_ceiling(project, fake_openai, capsys):
    _engine(capsys, fake_openai)
    wf = _fan_out(project, "{ max_cost: 0.05 }")
    res = api.run_workflow(str(wf), cwd=str(project), params=_items(10))
    assert res.run.status == "failed"
    notes = json.dumps(steps_of(res))
    assert "max_cost" in notes and "$0.0660 of $0.0500" in notes, notes
    # the third call crossed $0.05; nothing was asked after it
    assert len(fake_openai.bodies("plain")) == 3
    status = api.run_status(res.run.run_id, units=True)
    assert status.spend is not None
    assert status.spend.cost == pytest.approx(3 * PLAIN) and status.spend.max_cost == 0.05
    assert status.spend.text == "$0.0660 of $0.0500"
    costs = sorted(u.cost for u in status.units or [] if u.cost is not None)
    assert costs == pytest.approx([PLAIN] * 3)
    con = journal_sql()
    try:
        finished = [
            json.loads(m)
            for (m,) in con.execute("SELECT metadata_json FROM events WHERE event_type = 'workflow_unit_finished'")
        ]
    finally:
        con.close()
    assert all(f["cost"] == pytest.approx(PLAIN) and f["usage"] == {"input": 12, "output": 5} for f in finished)
    html = api.run_report_html(res.run.run_id)
    assert "money budget" in html and "$0.0660 of $0.0500" in html and "· $0.0220" in html


def test_the_money_ceiling_holds_across_workers(project, fake_openai, capsys):
    import threading

    _engine(capsys, fake_openai)
    wf = _fan_out(project, "{ max_cost: 0.05 }", concurrency=1)
    box: dict = {}
    coord = threading.Thread(
        target=lambda: box.update(res=api.run_workflow(str(wf), cwd=str(project), params=_items(8), workers=True)),
        daemon=True,
    )
    coord.start()
    summary = api.run_worker(project=str(project), concurrency=2, poll="50ms", idle_exit="2s")
    coord.join(120)
    assert not coord.is_alive()
    res = box["res"]
    assert res.run.status == "failed"
    assert "max_cost" in json.dumps(steps_of(res))
    assert len(fake_openai.bodies("plain")) == 3 and summary.finished == 3  # none past the ceiling
    spend = api.run_status(res.run.run_id).spend
    assert spend is not None and spend.cost == pytest.approx(3 * PLAIN)


def test_the_status_text_and_json_show_the_cost(project, fake_openai, capsys):
    _engine(capsys, fake_openai)
    wf = _fan_out(project, "{ max_cost: 1 }")
    res = api.run_workflow(str(wf), cwd=str(project), params=_items(2))
    assert res.run.status == "completed", steps_of(res)
    code = cli.main(["workflow", "status", res.run.run_id])
    out, _ = capsys.readouterr()
    assert code == 0 and "$0.0440 of $1.00" in out, out
    cli.main(["workflow", "status", res.run.run_id, "--format", "json"])
    doc = json.loads(capsys.readouterr()[0])
    assert doc["spend"]["cost"] == pytest.approx(2 * PLAIN) and doc["spend"]["unknown"] == "refuse"


def test_unknown_usage_refuses_further_dispatch_under_a_money_ceiling(project, fake_openai, capsys):
    _engine(capsys, fake_openai, model="echo")  # answers with no usage
    wf = _fan_out(project, "{ max_cost: 5 }")
    res = api.run_workflow(str(wf), cwd=str(project), params=_items(4))
    assert res.run.status == "failed"
    notes = json.dumps(steps_of(res))
    assert "usage is unknown" in notes and "budget.unknown: allow" in notes, notes
    assert len(fake_openai.bodies("echo")) == 1
    assert api.run_status(res.run.run_id).spend.text == "≥ $0.00 of $5.00, 1 unit unknown"


def test_budget_unknown_allow_counts_what_is_known(project, fake_openai, capsys):
    _engine(capsys, fake_openai, model="echo")
    wf = _fan_out(project, "{ max_cost: 5, unknown: allow }")
    res = api.run_workflow(str(wf), cwd=str(project), params=_items(3))
    assert res.run.status == "completed", steps_of(res)
    spend = api.run_status(res.run.run_id).spend
    assert spend.unknown_units == 3 and spend.text == "≥ $0.00 of $5.00, 3 units unknown"


def test_an_engine_without_prices_is_refused_before_anything_is_sent(project, fake_openai, capsys):
    _engine(capsys, fake_openai, prices=None)
    wf = _fan_out(project, "{ max_cost: 5 }")
    res = api.run_workflow(str(wf), cwd=str(project), params=_items(3))
    assert res.run.status == "failed"
    notes = json.dumps(steps_of(res))
    assert "no prices" in notes and "engines.fast.prices" in notes, notes
    assert fake_openai.bodies("plain") == []


def test_the_daily_limit_counts_every_run_of_the_project(project, fake_openai, capsys):
    _engine(capsys, fake_openai)
    _config(capsys, "set", "limits.maxCostPerDay", "0.03")
    first = _fan_out(project, "{ max_units: 100 }", name="one.md")
    res = api.run_workflow(str(first), cwd=str(project), params=_items(1))
    assert res.run.status == "completed", steps_of(res)
    second = _fan_out(project, "{ max_units: 100 }", name="two.md")
    res = api.run_workflow(str(second), cwd=str(project), params=_items(5))
    assert res.run.status == "failed"
    notes = json.dumps(steps_of(res))
    assert "limits.maxCostPerDay" in notes and "$0.0440 of $0.0300" in notes, notes
    assert len(fake_openai.bodies("plain")) == 2  # one before, then one more reached the limit


def test_plan_preview_shows_the_ceiling_and_the_spend(project, fake_openai, capsys):
    _engine(capsys, fake_openai)
    wf = _fan_out(project, "{ max_cost: 0.05 }")
    res = api.run_workflow(str(wf), cwd=str(project), params=_items(10))
    code = cli.main(["workflow", "run", res.run.run_id, "--plan", "--format", "json"])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 0 and doc["budget"]["maxCost"] == 0.05
    assert doc["budget"]["usedCost"] == pytest.approx(3 * PLAIN)
    cli.main(["workflow", "run", res.run.run_id, "--plan"])
    out = capsys.readouterr()[0]
    assert "max_cost $0.0500" in out and "$0.0660 spent" in out, out


@pytest.mark.parametrize(
    ("engine", "usage", "expected"),
    [
        # OpenAI-compatible: prompt_tokens holds the cached ones, billed at the cached price instead
        ({"kind": "llm"}, {"input": 1000, "output": 100, "cacheRead": 400}, (600 * 2 + 400 * 0.5 + 100 * 8) / 1e6),
        # claude: input excludes cache reads; cache writes billed as input
        (
            {"kind": "agent", "platform": "claude"},
            {"input": 10, "output": 100, "cacheRead": 400, "cacheWrite": 50},
            (60 * 2 + 400 * 0.5 + 100 * 8) / 1e6,
        ),
        # gemini: thoughts apart from the candidates, billed as output
        (
            {"kind": "agent", "platform": "gemini"},
            {"input": 100, "output": 10, "reasoning": 5},
            (100 * 2 + 15 * 8) / 1e6,
        ),
        # per-model figures: every model is priced
        (
            {"kind": "agent", "platform": "opencode"},
            {"input": 1, "output": 1, "models": {"a": {"input": 100, "output": 0}, "b": {"input": 0, "output": 10}}},
            (100 * 2 + 10 * 8) / 1e6,
        ),
        ({"kind": "llm"}, {"reasoning": 5}, None),  # no input, no output: unknown, not 0
        ({"kind": "llm"}, None, None),
    ],
)
def test_unit_cost_per_usage_convention(engine, usage, expected):
    cost = unit_cost(engine, {"input": 2, "output": 8, "cached": 0.5}, usage)
    assert cost == (pytest.approx(expected) if expected is not None else None)


def test_a_session_report_is_refused_once_the_money_ceiling_is_reached():
    plan = ReportPlan("write")
    kwargs = dict(other_attempts=1, other_tokens=0, max_units=None, max_tokens=None)
    assert check_budget(plan, None, other_cost=0.01, max_cost=0.05, **kwargs) == 0
    from akm.errors import UsageError

    with pytest.raises(UsageError, match=r"max_cost ceiling\): \$0.0500 of \$0.0500") as exc:
        check_budget(plan, None, other_cost=0.05, max_cost=0.05, **kwargs)
    assert exc.value.code == "BUDGET_EXCEEDED"
    with pytest.raises(UsageError, match="usage is unknown"):
        check_budget(plan, None, other_cost=0.0, unknown_cost=1, max_cost=0.05, **kwargs)
    assert check_budget(plan, None, other_cost=0.0, unknown_cost=1, max_cost=0.05, allow_unknown=True, **kwargs) == 0


def test_a_session_report_is_held_to_the_money_ceiling_on_the_real_path(project, fake_openai, capsys):
    """An engine unit with no usage, then a step for the calling agent: its report is refused (unknown usage)."""
    from akm.errors import AkmError

    engine = {"kind": "llm", "endpoint": fake_openai.url, "model": "echo", "prices": PRICES}
    _config(capsys, "set", "engines.fast", json.dumps(engine))
    wf = write_wf(
        project,
        "mixed.md",
        """
        budget: { max_cost: 5 }
        steps:
          - id: ask
            unit: { engine: fast }
          - id: write
        """,
        "## ask\n\nAsk.\n\n## write\n\nWrite it yourself.",
    )
    res = api.run_workflow(str(wf), cwd=str(project))
    assert res.run.status == "awaiting_session", steps_of(res)
    unit = api.next_brief(res.run.run_id).to_json()["units"][0]["unitId"]
    with pytest.raises(AkmError) as exc:
        api.report_unit(res.run.run_id, unit, cwd=str(project), status="completed", result="done")
    assert exc.value.code == "BUDGET_EXCEEDED" and "usage is unknown" in exc.value.message
    assert api.run_status(res.run.run_id).status == "failed"


def test_prices_and_limits_are_set_and_checked_by_config_set(project, capsys):
    _config(
        capsys,
        "set",
        "engines.cloud",
        json.dumps({"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"}),
    )
    _config(capsys, "set", "engines.cloud.prices", '{"input": 0.4, "output": 1.6}')
    _config(capsys, "set", "engines.cloud.prices.cached", "0.1")
    _config(capsys, "set", "limits.maxCostPerDay", "20")
    cli.main(["config", "get", "engines.cloud.prices"])
    assert json.loads(capsys.readouterr()[0]) == {"input": 0.4, "output": 1.6, "cached": 0.1}
    for key, value, words in [
        ("engines.cloud.prices", '{"input": -1, "output": 1}', "must be from 0"),
        ("engines.cloud.prices", '{"input": 1, "output": 1, "cache": 1}', "'cache' is not a price"),
        ("limits.maxCostPerDay", "0", "must be above 0"),
    ]:
        code = cli.main(["config", "set", key, value])
        err = capsys.readouterr()[1]
        assert code == 78 and words in err, err
