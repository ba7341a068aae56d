"""Several samples per seed: K episodes of a seed in one batch, replayed identically."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from rollouts import selectors
from rollouts.game.crafter_env import ACTIONS
from rollouts.models import Episode, RolloutBatch
from rollouts.rollout_settings import RolloutSettings, SettingsError
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db


def played(batch: RolloutBatch) -> dict[tuple[int, int], tuple[list, list]]:
    """(seed, sample) -> (actions per turn, frame sha256 per step)."""
    out = {}
    for episode in batch.episodes.order_by("seed", "sample"):
        actions = list(episode.turns.order_by("index").values_list("actions", flat=True))
        shas = list(episode.frames.order_by("step").values_list("sha256", flat=True))
        out[(episode.seed, episode.sample)] = (actions, shas)
    return out


def test_it_plays_k_samples_per_seed_and_replays_them_identically():
    options = {"policy": "random", "seeds": (4, 9), "samples_per_seed": 3, "steps": 25}
    first = record_batch(**options)
    again = record_batch(**options)
    assert first.episodes_total == 6
    assert sorted(first.episodes.values_list("seed", "sample")) == [
        (4, 0), (4, 1), (4, 2), (9, 0), (9, 1), (9, 2)
    ]  # fmt: skip
    a, b = played(first), played(again)
    assert a == b  # same settings, same samples: actions and pixels
    for seed in (4, 9):
        samples = [a[(seed, s)][0] for s in range(3)]
        assert samples[0] != samples[1] != samples[2] != samples[0]
        # Same world: every sample starts from the same first frame.
        assert len({a[(seed, s)][1][0] for s in range(3)}) == 1
    # Sample 0 is the random policy as it always was: numpy's generator on the episode seed.
    rng = np.random.default_rng(4)
    assert a[(4, 0)][0] == [[ACTIONS[int(rng.integers(17))]] for _ in range(25)]


def test_it_keeps_one_episode_per_batch_seed_and_sample():
    batch = record_batch(policy="scripted", seeds=(1,), samples_per_seed=2, steps=3)
    with pytest.raises(IntegrityError), transaction.atomic():
        Episode.objects.create(batch=batch, seed=1, sample=1)
    Episode.objects.create(batch=batch, seed=1, sample=2)  # a new sample is a new episode


def test_it_refuses_bad_sample_counts():
    with pytest.raises(SettingsError, match="samples-per-seed: 0 is not between 1 and 64"):
        RolloutSettings(policy="random", samples_per_seed=0)
    with pytest.raises(SettingsError, match="more than 10000 episodes"):
        RolloutSettings(policy="random", seeds=tuple(range(200)), samples_per_seed=64)


def test_it_sends_a_per_sample_seed_and_nothing_else_differs(chat_server):
    chat_server.default = replies.tool_call("noop")
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        base_url=chat_server.url,
        seeds=(3,),
        samples_per_seed=3,
        steps=2,
        temperature=1.0,
    )
    by_episode = {}
    for received in chat_server.requests:
        body = dict(received.body)
        by_episode.setdefault(body.pop("seed"), []).append(body)
    assert len(by_episode) == 3  # one seed per sample
    assert 3 in by_episode  # sample 0 keeps the world seed
    bodies = list(by_episode.values())
    assert bodies[0] == bodies[1] == bodies[2]  # everything else is the same request
    again = record_batch(
        policy="openai",
        model="test-vlm",
        base_url=chat_server.url,
        seeds=(3,),
        samples_per_seed=3,
        steps=2,
        temperature=1.0,
    )
    seeds_again = {r.body["seed"] for r in chat_server.requests[-6:]}
    assert seeds_again == set(by_episode)
    assert again.episodes.count() == batch.episodes.count() == 3


def test_the_command_takes_samples_per_seed_and_reports_per_seed_best(transactional_db):
    out = io.StringIO()
    call_command(
        "rollout",
        "--policy",
        "random",
        "--seeds",
        "0-1",
        "--samples-per-seed",
        "2",
        "--steps",
        "60",
        "--inline",
        stdout=out,
    )
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    assert summary["episodes"] == summary["finished"] == 4
    assert summary["samples_per_seed"] == 2
    groups = selectors.batch_seed_groups(batch_id=summary["batch_id"])
    counts = {
        (e.seed, e.sample): e.achievement_count
        for e in Episode.objects.filter(batch_id=summary["batch_id"])
    }
    for group in groups:
        seed = group["seed"]
        assert group["best_achievements"] == max(counts[(seed, 0)], counts[(seed, 1)])
    best = [max(counts[(s, 0)], counts[(s, 1)]) for s in (0, 1)]
    assert summary["mean_best_achievements"] == pytest.approx(sum(best) / 2, abs=1e-3)


def test_the_batch_form_takes_samples_per_seed_and_the_page_groups_them(editor_client):
    from django.urls import reverse

    response = editor_client.post(
        reverse("rollouts:batch_create"),
        {
            "policy": "random",
            "seeds": "5",
            "samples_per_seed": "3",
            "steps": "4",
            "image_size": "64",
            "history_frames": "0",
            "concurrency": "1",
        },
    )
    assert response.status_code == 302
    batch = RolloutBatch.objects.get()
    assert batch.episodes_total == 3 and batch.settings["samples_per_seed"] == 3
    assert sorted(batch.episodes.values_list("sample", flat=True)) == [0, 1, 2]
    page = editor_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert "Per seed (3 samples each)" in page and "sample 2" in page
