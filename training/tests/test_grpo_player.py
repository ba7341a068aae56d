"""The studio's side of a GRPO iteration without a trainer: `StudioPlayer` plays episodes
with a scripted `EpisodeModel` through the real recorder, `GrpoRunSink` writes rewards,
advantages, statistics and loss, a resume removes what came after its checkpoint, and
Cancel stops between two episodes. The trained model's own runs are test_grpo_train.py's."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import timedelta

import pytest
from django.core.files.storage import default_storage
from django.utils import timezone

from rollouts.jobs import EPISODE
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording.frame_store import frame_name
from rollouts.recording.services import batch_create, batch_settings, episode_run
from training.grpo_runs import GrpoRunSink, StudioPlayer, iteration_settings
from training.jobs import LOCAL_RUN
from training.models import GrpoIteration, LocalRun, LocalRunEvent, TrainingJob
from training.open_models.grpo_play import IterationCanceled, ScoredEpisode

pytestmark = pytest.mark.django_db

STEPS = 4
EPISODES = [(3, 0), (3, 1), (5, 0), (5, 1)]


def tool_call(*actions: str) -> str:
    body = json.dumps({"name": "interact_many", "arguments": {"actions": list(actions)}})
    return f"<tool_call>{body}</tool_call>"


class ScriptedModel:
    """An `EpisodeModel` answering the same text every turn; `then` runs after each reply."""

    def __init__(self, answer: str, then=None) -> None:
        self.answer = answer
        self.then = then
        self.sent: list[list[dict]] = []

    def reply(self, content):
        self.sent.append(content)
        if self.then is not None:
            self.then()
        return self.answer


def grpo_run() -> tuple[LocalRun, GrpoRunSink]:
    job = TrainingJob.objects.create(
        provider="trl",
        model="/models/tiny-qwen2-vl",
        config_toml='[training]\nmode = "grpo"\n',
        effective_config={"training": {"mode": "grpo"}},
        idempotency_key=uuid.uuid4().hex,
        status=TrainingJob.Status.RUNNING,
    )
    run = LocalRun.objects.create(job=job)
    token = LOCAL_RUN.claim(run.id)
    run = LocalRun.objects.select_related("job").get(id=run.id)
    return run, GrpoRunSink(run, LOCAL_RUN.held(run.id, token))


def models_by_member() -> dict[tuple[int, int], ScriptedModel]:
    # Member 0 calls the tool, member 1 answers in prose: both are read as actions.
    return {
        (seed, member): ScriptedModel(
            tool_call("move_left", "do") if member == 0 else "I will move right."
        )
        for seed, member in EPISODES
    }


def test_an_iteration_is_a_recorded_batch_scored_and_logged(settings):
    run, sink = grpo_run()
    models = models_by_member()
    player = StudioPlayer(run=run, sink=sink, steps=STEPS, reward="crafter")
    played = player.play(
        iteration=1, checkpoint_step=0, episodes=EPISODES, model_for=lambda s, m: models[(s, m)]
    )
    assert [(p.seed, p.member) for p in played] == EPISODES

    iteration = GrpoIteration.objects.get(job=run.job, number=1)
    assert (iteration.status, iteration.checkpoint_step, iteration.seeds) == ("playing", 0, [3, 5])
    assert (iteration.group_size, iteration.reward) == (2, "crafter")
    batch = iteration.batch
    assert batch.name == f"GRPO job {run.job_id}, iteration 1"
    assert (batch.policy, batch.status, batch.episodes_finished) == ("grpo", "finished", 4)
    settings_of = batch_settings(batch)  # valid settings, as the pages read them
    assert (settings_of.samples_per_seed, settings_of.steps, settings_of.seeds) == (2, 4, (3, 5))
    assert settings_of.model == "/models/tiny-qwen2-vl"
    assert batch.system_prompt and batch.prompt_version > 0

    for item in played:
        episode = Episode.objects.get(id=item.episode_id)
        assert (episode.seed, episode.sample, episode.status) == (
            item.seed,
            item.member,
            "finished",
        )
        turns = list(Turn.objects.filter(episode=episode).order_by("index"))
        # The batch's steps are the game's: a turn of two actions takes two of them.
        expected = ("move_left", "do") if item.member == 0 else ("move_right",)
        assert episode.steps == STEPS and len(turns) == STEPS // len(expected)
        assert item.actions == tuple(expected for _ in turns)
        assert [tuple(t.actions) for t in turns] == list(item.actions)
        assert item.crafter_reward == episode.total_reward
        assert item.achievements == tuple(episode.achievements)
        assert item.model is models[(item.seed, item.member)]
        # What the model was sent is what the turn recorded: the text, and its frame.
        sent = models[(item.seed, item.member)].sent
        assert [c[0]["text"] for c in sent] == [t.observation_text for t in turns]
        assert [m["role"] for m in turns[0].request_messages] == ["system", "user"]
        roles = ["system", "user", "assistant", "user"]
        assert [m["role"] for m in turns[1].request_messages] == roles
        image = turns[1].request_messages[3]["content"][1]["image_url"]
        assert image["frame_step"] == turns[1].frame.step
        assert bool(turns[0].tool_calls) == (item.member == 0)
        assert turns[1].text_fallback == (item.member == 1)

    # Rewards and advantages by hand: 1, 2, 3, 4 -> mean 2.5, interval 0.445740 to 4.554260
    # (test_grpo_statistics.py works it); one episode of four unlocked collect_wood.
    scored = [
        ScoredEpisode(
            episode=dataclasses.replace(item, achievements=("collect_wood",) if i == 0 else ()),
            reward=float(i + 1),
            advantage=(-0.5, 0.5, -1.25, 1.25)[i],
        )
        for i, item in enumerate(played)
    ]
    sink.iteration_scored(1, scored)
    for item, row in zip(played, scored, strict=True):
        assert Episode.objects.get(id=item.episode_id).rl_reward == row.reward
        advantages = Turn.objects.filter(episode_id=item.episode_id).values_list(
            "advantage", flat=True
        )
        assert list(advantages) == [row.advantage] * len(item.actions)
    iteration.refresh_from_db()
    assert (iteration.status, iteration.episodes, iteration.reward_mean) == ("complete", 4, 2.5)
    assert iteration.reward_low == pytest.approx(0.445740, abs=1e-6)
    assert iteration.reward_high == pytest.approx(4.554260, abs=1e-6)
    # Crafter's score: exp(mean over 22 achievements of ln(1 + rate)) - 1, one rate 25%.
    assert iteration.score == pytest.approx(26 ** (1 / 22) - 1, abs=1e-9)
    assert iteration.success_rates["collect_wood"] == 25.0
    assert iteration.success_rates["place_table"] == 0.0

    sink.iteration_logged(1, loss=0.125, kl=float("nan"))
    iteration.refresh_from_db()
    assert (iteration.loss, iteration.kl) == (0.125, None)
    point = LocalRunEvent.objects.get(run=run, kind="metric")
    assert (point.name, point.step, point.value) == ("train", 1, 0.125)
    assert LocalRun.objects.get(id=run.id).step == 1


def test_a_resume_removes_the_iterations_after_its_checkpoint(settings):
    run, sink = grpo_run()
    models = models_by_member()
    player = StudioPlayer(run=run, sink=sink, steps=2, reward="crafter")
    for number in (1, 2):
        player.play(
            iteration=number,
            checkpoint_step=number - 1,
            episodes=EPISODES,
            model_for=lambda s, m: ScriptedModel(models[(s, m)].answer),
        )
    second = GrpoIteration.objects.get(job=run.job, number=2)
    shas = list(Frame.objects.filter(episode__batch=second.batch).values_list("sha256", flat=True))
    assert shas

    sink.resuming(1)
    assert list(GrpoIteration.objects.filter(job=run.job).values_list("number", flat=True)) == [1]
    assert not RolloutBatch.objects.filter(id=second.batch_id).exists()
    assert not Episode.objects.filter(batch_id=second.batch_id).exists()
    assert not Frame.objects.filter(sha256__in=shas, episode__batch_id=second.batch_id).exists()
    # The files are content-addressed, shared with any episode that drew the same frame.
    assert all(default_storage.exists(frame_name(sha)) for sha in shas)
    event = LocalRunEvent.objects.get(run=run, type="iterations_removed")
    assert event.message == "Resumed from step 1: iteration 2 removed, to be played again"

    # Played again: recorded once, under the same number.
    player.play(
        iteration=2,
        checkpoint_step=1,
        episodes=EPISODES,
        model_for=lambda s, m: ScriptedModel(models[(s, m)].answer),
    )
    assert GrpoIteration.objects.filter(job=run.job).count() == 2
    assert Episode.objects.filter(batch__grpo_iteration__job=run.job).count() == 8


def test_cancel_stops_the_iteration_between_two_episodes(settings):
    run, sink = grpo_run()

    def press_cancel():
        LocalRun.objects.filter(id=run.id).update(cancel_requested=True)

    models = {pair: ScriptedModel("noop", then=press_cancel) for pair in EPISODES}
    player = StudioPlayer(run=run, sink=sink, steps=2, reward="crafter")
    with pytest.raises(IterationCanceled):
        player.play(
            iteration=1, checkpoint_step=0, episodes=EPISODES, model_for=lambda s, m: models[(s, m)]
        )
    iteration = GrpoIteration.objects.get(job=run.job, number=1)
    assert iteration.status == "canceled"
    batch = RolloutBatch.objects.get(id=iteration.batch_id)
    assert batch.status == "canceled"
    episodes = Episode.objects.filter(batch=batch).order_by("seed", "sample")
    assert [e.status for e in episodes] == ["finished", "canceled", "canceled", "canceled"]
    # Only the first episode's model was asked anything.
    assert [len(models[pair].sent) for pair in EPISODES] == [2, 0, 0, 0]


def test_episodes_that_are_not_whole_groups_are_refused(settings):
    run, sink = grpo_run()
    player = StudioPlayer(run=run, sink=sink, steps=2, reward="crafter")
    with pytest.raises(ValueError, match="not 2 of each seed"):
        player.play(
            iteration=1,
            checkpoint_step=0,
            episodes=[(3, 0), (3, 1), (5, 0), (5, 2)],
            model_for=lambda s, m: ScriptedModel("noop"),
        )
    assert not GrpoIteration.objects.exists()


def test_no_rollouts_worker_plays_or_is_sent_a_grpo_episode(settings):
    batch = batch_create(
        settings=iteration_settings(
            job_id=1, iteration=1, model="m", seeds=[3], group_size=2, steps=2
        ),
        enqueue=False,
    )
    first, second = Episode.objects.filter(batch=batch).order_by("sample")
    # A message that reached a rollouts worker: the episode is let go, untouched.
    assert episode_run(episode_id=first.id) == "done_already"
    first.refresh_from_db()
    assert (first.status, first.claim_token, first.steps) == ("pending", "", 0)
    assert not Turn.objects.filter(episode=first).exists()
    # Nor does the periodic requeue send one, stale or long pending.
    Episode.objects.filter(id=second.id).update(
        status="running", heartbeat_at=timezone.now() - timedelta(days=1)
    )
    Episode.objects.filter(id=first.id).update(enqueued_at=timezone.now() - timedelta(days=1))
    assert not {first.id, second.id} & set(EPISODE.to_resend(broker_lost=True))
