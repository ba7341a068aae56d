"""A served model that answers in text, not with a tool call: `serve_model` with a tiny
model whose every answer is the letter `A` (`served_models.answering_tiny_vlm`).

A probe question asks for a letter: each answer is read as the question's first choice, so
the run's right answers are the questions whose right answer (crafter's own state, stored
with the set) is their first choice. An episode asks for a tool call: each turn is recorded
as an answer without one, and the episode still plays to its step limit.
"""

from __future__ import annotations

import pytest

from probes.models import ProbeQuestion
from probes.services import probe_set_create
from rollouts.models import Episode, Turn
from rollouts.policies.endpoints import endpoint_settings
from rollouts.recording import services as rollout_services
from rollouts.review.turn_selection import TurnSelection
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import record_batch
from studio.testing import run_command
from training.tests import served_models

STEPS = 3


@pytest.fixture(scope="module")
def served(django_db_setup, django_db_blocker, tmp_path_factory):
    root = tmp_path_factory.mktemp("served-letter")
    with served_models.served_for_module(django_db_blocker, root, ["A"]) as server:
        yield server


@pytest.fixture
def ready(served, db):
    return served_models.ready(served)


def test_a_probe_run_reads_each_answer_letter(ready):
    recorded = record_batch(seeds=(4,), steps=4)
    probe_set = probe_set_create(filters=TurnSelection(batches=(recorded.id,)), seed=5)
    questions = list(ProbeQuestion.objects.filter(probe_set=probe_set))
    right = sum(question.answer == question.choices[0] for question in questions)
    assert 0 < right < len(questions), "a set where reading A as the first choice matters"
    asked = ["probe_run", str(probe_set.id), "--endpoint", ready.model, "--model", ready.model]
    outcome = run_command(*asked, "--inline")
    assert outcome.code == 0, outcome.stderr
    summary = outcome.summary
    assert (summary["questions"], summary["answered"], summary["errors"]) == (
        len(questions),
        len(questions),
        0,
    )
    # The JSON line gives four decimals.
    assert summary["accuracy"] == pytest.approx(right / len(questions), abs=5e-5)


def test_an_episode_records_each_text_answer_as_one_without_a_tool_call(ready):
    settings = RolloutSettings(
        policy="openai",
        model=ready.model,
        seeds=(1,),
        steps=STEPS,
        **endpoint_settings(ready.endpoint()),
    )
    batch = rollout_services.batch_run_inline(settings=settings)
    episode = Episode.objects.get(batch=batch)
    assert (episode.status, episode.steps) == ("finished", STEPS)
    assert (episode.model_calls, episode.bad_outputs, episode.tool_calls) == (STEPS, STEPS, 0)
    turns = Turn.objects.filter(episode=episode).order_by("index")
    assert [(t.model_text, t.error_kind, t.tool_calls) for t in turns] == [
        ("A", "no_tool_call", [])
    ] * STEPS
