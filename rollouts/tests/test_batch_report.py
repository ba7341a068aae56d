import json

import pytest
from django.core.management import call_command

from rollouts.crafter_env import ACHIEVEMENTS
from rollouts.scoring import crafter_score, score_percent, score_text, success_rates
from rollouts.tests.helpers import manage, record_batch, subprocess_env


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
    assert report["crafter_score"] == round(crafter_score(report["success_rates"]), 2)
    call_command("batch_report", str(batch.id))
    table = capsys.readouterr().out
    assert "Crafter score" in table and "collect_wood" in table


def test_it_refuses_an_unknown_batch(transactional_db):
    result = manage("batch_report", "999999", env=subprocess_env())
    assert result.returncode == 2
    assert result.stderr.strip() == "CommandError: there is no batch 999999"
