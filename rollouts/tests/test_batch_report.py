import json
import math
from decimal import Decimal

import pytest
from django.core.management import call_command

from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.game.scoring import crafter_score, score_percent, score_text, success_rates
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch
from studio.testing import manage, subprocess_env

# Hafner 2021 (arXiv 2109.06780), per-achievement success rates in percent averaged over the
# 5 seeds of crafter's score files, and the score of those mean rates: copied from
# shared/reference/crafter_reference_scores.json, not computed by the code under test.
PAPER_RANDOM_RATES = {
    "collect_coal": 0.0,
    "collect_diamond": 0.0,
    "collect_drink": 9.32,
    "collect_iron": 0.0,
    "collect_sapling": 50.19,
    "collect_stone": 0.01,
    "collect_wood": 24.38,
    "defeat_skeleton": 0.02,
    "defeat_zombie": 0.14,
    "eat_cow": 0.38,
    "eat_plant": 0.01,
    "make_iron_pickaxe": 0.0,
    "make_iron_sword": 0.0,
    "make_stone_pickaxe": 0.0,
    "make_stone_sword": 0.0,
    "make_wood_pickaxe": 0.32,
    "make_wood_sword": 0.32,
    "place_furnace": 0.0,
    "place_plant": 44.61,
    "place_stone": 0.01,
    "place_table": 4.36,
    "wake_up": 93.6,
}
PAPER_RANDOM_SCORE = 1.551
PAPER_HUMAN_RATES = {
    "collect_coal": 86.0,
    "collect_diamond": 12.0,
    "collect_drink": 92.0,
    "collect_iron": 53.0,
    "collect_sapling": 67.0,
    "collect_stone": 100.0,
    "collect_wood": 100.0,
    "defeat_skeleton": 31.0,
    "defeat_zombie": 84.0,
    "eat_cow": 89.0,
    "eat_plant": 8.0,
    "make_iron_pickaxe": 26.0,
    "make_iron_sword": 22.0,
    "make_stone_pickaxe": 78.0,
    "make_stone_sword": 78.0,
    "make_wood_pickaxe": 100.0,
    "make_wood_sword": 45.0,
    "place_furnace": 32.0,
    "place_plant": 24.0,
    "place_stone": 90.0,
    "place_table": 100.0,
    "wake_up": 73.0,
}
PAPER_HUMAN_SCORE = 52.05


def test_it_gives_the_papers_score_for_the_papers_success_rates():
    assert len(PAPER_RANDOM_RATES) == len(PAPER_HUMAN_RATES) == 22
    assert crafter_score(PAPER_RANDOM_RATES) == pytest.approx(PAPER_RANDOM_SCORE, abs=0.001)
    assert crafter_score(PAPER_HUMAN_RATES) == pytest.approx(PAPER_HUMAN_SCORE, abs=0.005)


def test_it_computes_the_crafter_score_of_the_paper():
    # Every achievement at 100%: exp(mean(ln 101)) - 1 = 100; none: 0.
    assert crafter_score(dict.fromkeys(ACHIEVEMENTS, 100.0)) == pytest.approx(100.0)
    assert crafter_score({}) == 0.0
    rates = success_rates([["collect_wood"], ["collect_wood", "place_table"], []])
    assert rates["collect_wood"] == pytest.approx(200 / 3)
    assert rates["place_table"] == pytest.approx(100 / 3)


def test_it_states_the_score_in_percent_with_two_decimals():
    # One achievement at 50%: exp(ln(51) / 22) - 1 = 0.19568... percent, worked out by hand.
    score = crafter_score({"collect_wood": 50.0})
    assert score_percent(score) == 0.2 and score_text(score) == "0.20%"
    assert score_text(None) == "—"


@pytest.mark.django_db(transaction=True)
def test_it_gives_one_number_on_the_page_the_report_and_the_rollout_summary(client, admin_user):
    from django.urls import reverse

    from rollouts import selectors

    batch = record_batch(policy="scripted", seeds=(0, 1, 2), steps=150)
    summary = selectors.batch_summary(batch=batch)
    result = manage("batch_report", str(batch.id), "--json", env=subprocess_env())
    report = json.loads(result.stdout)
    assert report["crafter_score"] == summary["crafter_score"]
    assert round(report["crafter_score"], 2) == report["crafter_score"]
    client.force_login(admin_user)
    page = client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert f"{summary['crafter_score']:.2f}%" in page
    table = manage("batch_report", str(batch.id), env=subprocess_env()).stdout
    assert f"{summary['crafter_score']:.2f}%" in table
    help_text = manage("batch_report", "--help", env=subprocess_env()).stdout
    assert "percent" in help_text and "0.23%" in help_text
    assert "percent" in manage("rollout", "--help", env=subprocess_env()).stdout


@pytest.mark.django_db
def test_it_reports_success_rates_as_json_and_as_a_table(capsys):
    batch = record_batch(policy="scripted", seeds=(0, 1), steps=120)
    call_command("batch_report", str(batch.id), "--json")
    report = json.loads(capsys.readouterr().out)
    unlocked = [set(e.achievements) for e in batch.episodes.all()]
    for name in ACHIEVEMENTS:
        assert report["success_rates"][name] == 50.0 * sum(name in u for u in unlocked)
    # Seeds 0 and 1 of the scripted policy at 120 steps: worked out from the recorded episodes
    # with the paper's formula, exp(mean over 22 of ln(1 + rate)) - 1, by hand (the report
    # rounds to 2 decimals).
    expected = (
        math.exp(
            sum(math.log(1 + 50.0 * sum(name in u for u in unlocked)) for name in ACHIEVEMENTS) / 22
        )
        - 1
    )
    assert report["crafter_score"] == pytest.approx(expected, abs=0.005)
    call_command("batch_report", str(batch.id))
    table = capsys.readouterr().out
    assert "Crafter score" in table and "collect_wood" in table


def test_it_refuses_an_unknown_batch(transactional_db):
    result = manage("batch_report", "999999", env=subprocess_env())
    assert result.returncode == 2
    assert result.stderr.strip() == "batch_report: error: there is no batch 999999"


@pytest.mark.django_db
def test_its_json_counts_every_call_its_tokens_and_spend(chat_server, chat_endpoint, capsys):
    chat_endpoint.input_price_per_million = Decimal("2.00")
    chat_endpoint.output_price_per_million = Decimal("10.00")
    chat_endpoint.save()
    # The first request fails (and is asked again); every answer bills 1,000 prompt and 50
    # completion tokens.
    chat_server.script(replies.status(500))
    chat_server.default = replies.Reply(
        tool_calls=[(replies.TOOL_NAME, '{"actions": ["noop"]}')], usage=(1_000, 50)
    )
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        seeds=(0, 1),
        steps=3,
    )
    assert len(chat_server.requests) == 7  # the server's own count: 6 turns, one asked twice
    call_command("batch_report", str(batch.id), "--json")
    report = json.loads(capsys.readouterr().out)
    # By hand: 6 turns called the model, one of them twice (a retry): 6 + 1 = 7 requests;
    # 6 answers x 1,000 and x 50 tokens; spend 6 x (1,000 x $2 + 50 x $10) / 1,000,000
    # = 6 x $0.0025 = $0.015.
    assert (report["model_calls"], report["model_retries"]) == (6, 1)
    assert (report["prompt_tokens"], report["completion_tokens"]) == (6_000, 300)
    assert report["spend"] == 0.015
    assert (report["model"], report["episodes"], report["finished"]) == ("test-vlm", 2, 2)
