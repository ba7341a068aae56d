"""A GRPO job trained for real on a `celery -A studio worker -Q train` process: the tiny
Qwen2-VL plays Crafter, every episode recorded by the studio as any batch's (frames in
storage, turns, tool calls), each iteration a batch with its `GrpoIteration`; the rewards
and advantages written back; Cancel; a killed worker resumed by the next. The workers are
real processes; nothing of ours is replaced.

The helpers (the config, the job, the rows an iteration left) serve test_grpo_resume.py and
test_grpo_cancel.py.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from django.core.files.storage import default_storage
from django.utils import timezone
from safetensors.torch import load_file

from rollouts.models import Episode, Frame, Turn
from rollouts.recording.frame_store import frame_name
from studio.testing import run_command
from training import model_store
from training.config import config_load
from training.local_runs import local_run_create, local_run_start
from training.models import GrpoIteration, LocalRun, LocalRunEvent, TrainingJob
from training.open_models.rewards import episode_reward, parse_reward
from training.tests.test_submit import wait_for
from training.tests.test_trl_train import logs, worker_env, workers

pytestmark = pytest.mark.django_db(transaction=True)

ITERATIONS, SEEDS, GROUP, STEPS = 2, 2, 2, 8
FIRST_SEED = 11
# The share of executed actions that were noop: the tiny model's random answers name an
# action now and then (read by the text fallback), noop otherwise, so a group's episodes
# differ and their advantages are not all zero.
REWARD = "action:noop"


def grpo_toml(model: Path, *, iterations: int = ITERATIONS, seeds: int = SEEDS) -> str:
    return f"""
[job]
model = "{model}"
modalities = ["text", "image"]
seed = 42

[training]
mode = "grpo"

[training.grpo]
group_size = {GROUP}
seeds_per_iteration = {seeds}
steps_per_episode = {STEPS}
iterations = {iterations}
reward = "{REWARD}"
first_seed = {FIRST_SEED}
max_answer_tokens = 12
temperature = 1.0

[hyperparameters]
n_epochs = 1
train_kind = "fft"
learning_rate = 1e-2
"""


def grpo_job(text: str) -> TrainingJob:
    """A GRPO job submitted to the trl provider: its run made and sent to the train queue,
    as the submission task does for any trl job (a GRPO job has no dataset to note)."""
    config = config_load(text)
    job = TrainingJob.objects.create(
        provider="trl",
        base_url="queue:train",
        model=config.model,
        config_toml=text,
        effective_config=config.to_json(),
        idempotency_key=uuid.uuid4().hex,
    )
    remote = local_run_create(job_id=job.id)
    TrainingJob.objects.filter(id=job.id).update(
        remote_job_id=remote, status=TrainingJob.Status.SUBMITTED, submitted_at=timezone.now()
    )
    local_run_start(remote_job_id=remote)
    job.refresh_from_db()
    return job


def job_episodes(job: TrainingJob):
    return Episode.objects.filter(batch__grpo_iteration__job=job)


def played(job: TrainingJob) -> dict[tuple[int, int, int], tuple]:
    """(iteration, seed, member) -> (rl_reward, each turn's actions) of every episode."""
    found = {}
    for episode in job_episodes(job).select_related("batch__grpo_iteration"):
        actions = Turn.objects.filter(episode=episode).order_by("index")
        key = (episode.batch.grpo_iteration.number, int(episode.seed), episode.sample)
        found[key] = (
            episode.rl_reward,
            [tuple(a) for a in actions.values_list("actions", flat=True)],
        )
    return found


def test_a_grpo_job_records_every_episode_and_trains_the_model(
    settings, fast_training, tmp_path, tiny_model, client, django_user_model
):
    env = worker_env(settings, tmp_path)
    with workers(env, tmp_path):
        job = grpo_job(grpo_toml(tiny_model))
        job = wait_for(job, "succeeded", "failed", "canceled", timeout=300)
    assert job.status == "succeeded", (job.error, logs(tmp_path))
    run = LocalRun.objects.get(job=job)
    assert (run.status, run.step, run.total_steps) == ("done", ITERATIONS, ITERATIONS)

    iterations = list(GrpoIteration.objects.filter(job=job).order_by("number"))
    assert [i.number for i in iterations] == [1, 2]
    assert [i.checkpoint_step for i in iterations] == [0, 1]
    # Iteration k plays the k-th seeds_per_iteration seeds after first_seed.
    assert [i.seeds for i in iterations] == [[11, 12], [13, 14]]
    spec = parse_reward(REWARD)
    for iteration in iterations:
        assert iteration.status == "complete" and iteration.loss is not None
        assert (iteration.group_size, iteration.reward, iteration.episodes) == (GROUP, REWARD, 4)
        batch = iteration.batch
        assert (batch.policy, batch.status, batch.episodes_finished) == ("grpo", "finished", 4)
        episodes = list(Episode.objects.filter(batch=batch))
        assert len(episodes) == SEEDS * GROUP
        by_seed = defaultdict(float)
        rewards = []
        for episode in episodes:
            turns = list(Turn.objects.filter(episode=episode).order_by("index"))
            # A turn is one answer: up to 8 actions, the game's steps are the episode's.
            assert 1 <= len(turns) <= STEPS and episode.steps == STEPS
            assert sum(len(t.actions) for t in turns) == STEPS
            assert {t.advantage for t in turns} != {None} and len({t.advantage for t in turns}) == 1
            by_seed[episode.seed] += turns[0].advantage
            # The reward, recomputed by hand from the rows: noop's share of the actions.
            executed = [a for t in turns for a in t.actions]
            assert episode.rl_reward == pytest.approx(executed.count("noop") / len(executed))
            assert episode.rl_reward == pytest.approx(
                episode_reward(
                    spec,
                    crafter_reward=episode.total_reward,
                    achievements=episode.achievements,
                    actions=[t.actions for t in turns],
                )
            )
            rewards.append(episode.rl_reward)
            for frame in Frame.objects.filter(episode=episode):
                assert default_storage.exists(frame_name(frame.sha256))
        # GRPO's advantages are centred per group.
        assert all(abs(total) < 1e-6 for total in by_seed.values()), by_seed
        assert iteration.reward_mean == pytest.approx(sum(rewards) / len(rewards))
    # Some group's episodes differed: the update had something to learn from.
    assert Turn.objects.filter(episode__in=job_episodes(job)).exclude(advantage=0).exists()
    train = LocalRunEvent.objects.filter(run=run, kind="metric", name="train")
    assert sorted(train.values_list("step", flat=True)) == [1, 2]

    # The stored model learned: its weights are not the base model's.
    settings.STUDIO_MODEL_CACHE_DIR = tmp_path / "fetched"
    base = load_file(str(Path(tiny_model) / "model.safetensors"))
    after = load_file(str(model_store.model_fetch(job.id) / "model.safetensors"))
    assert base.keys() == after.keys()
    assert any(not torch.equal(base[name], after[name]) for name in base)

    # An iteration's batch exports as any batch does.
    out = tmp_path / "iteration-1.jsonl"
    outcome = run_command(
        "export_jsonl",
        "--batch",
        str(iterations[0].batch_id),
        "--include-text-fallback",
        "--output",
        str(out),
    )
    assert outcome.code == 0, outcome.stderr
    rows = out.read_text().splitlines()
    assert len(rows) == Turn.objects.filter(episode__batch=iterations[0].batch).count()
    # A turn's row is the conversation its answer was sampled on: the system message, each
    # earlier turn's frame and answer, then its own frame.
    first = Episode.objects.filter(batch=iterations[0].batch).order_by("seed", "sample")[0]
    turns = list(Turn.objects.filter(episode=first).order_by("index"))
    by_turn = {
        (row["metadata"]["episode_id"], row["metadata"]["turn"]): row
        for row in map(json.loads, rows)
    }
    assert len(turns) > 1, "8 steps of at most 8 actions a turn, but a first turn of 8"
    messages = by_turn[(first.id, 1)]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert (turns[0].model_text or "") in messages[2]["content"]
    images = [p for m in messages[:4] if isinstance(m["content"], list) for p in m["content"]]
    assert sum(part["type"] == "image_url" for part in images) == 2

    # The job page draws each iteration's reward, loss and KL.
    user = django_user_model.objects.create_user("rl-viewer", password="rl-viewer-pass-1")
    client.force_login(user)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert 'id="grpo-reward-chart"' in page and 'id="grpo-update-chart"' in page
    assert '<dd id="grpo-iterations">2 done of 2</dd>' in page
    for iteration in iterations:
        assert f'href="/rollouts/{iteration.batch_id}/"' in page
