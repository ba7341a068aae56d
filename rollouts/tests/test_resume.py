"""Episodes resume from their last recorded turn: a model episode
whose worker was killed, or that failed or was canceled and is resumed, replays its recorded
actions (each frame checked against its stored sha256), is shown the same past, and never
calls the model again for a turn already recorded; a worker starting under the name of one
that died takes its episodes over at once."""

from __future__ import annotations

import collections
import re
import time

import pytest
from django.urls import reverse
from django.utils import timezone

from rollouts.models import Episode, Frame, RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.openai_server import tool_call
from studio.testing import (
    WORKER_ARGS,
    celery_worker_running,
    queue_purge,
    start_python,
    subprocess_env,
    wait_until,
)

# A scripted player through the model protocol: its actions depend only on the step the
# observation names, so that every run of a seed asks the same and plays the same.
CYCLE = ("move_right", "do", "move_down", "do", "move_left", "noop", "move_up", "do")
STEP = re.compile(r"Step (\d+) of")


def step_of(body: dict) -> int:
    for message in reversed(body["messages"]):
        if message["role"] != "user":
            continue
        parts = message["content"]
        texts = [parts] if isinstance(parts, str) else [p.get("text", "") for p in parts]
        for text in texts:
            found = STEP.search(text or "")
            if found:
                return int(found.group(1))
    raise AssertionError("no step in the request")


def scripted(body: dict):
    return tool_call(CYCLE[step_of(body) % len(CYCLE)])


def model_settings(endpoint, seeds, steps, **extra) -> RolloutSettings:
    return RolloutSettings(
        policy="openai",
        model="test-vlm",
        endpoint=endpoint.name,
        base_url=endpoint.base_url,
        seeds=tuple(seeds),
        steps=steps,
        history_frames=2,
        **extra,
    )


def frames_of(batch: RolloutBatch) -> dict[int, list[str]]:
    """Each seed's frame hashes in step order."""
    frames = collections.defaultdict(list)
    for seed, sha256 in (
        Frame.objects.filter(episode__batch=batch)
        .order_by("episode__seed", "step")
        .values_list("episode__seed", "sha256")
    ):
        frames[seed].append(sha256)
    return dict(frames)


def asked(requests) -> collections.Counter:
    """How many times the server was asked for each (seed, step)."""
    return collections.Counter((r.body["seed"], step_of(r.body)) for r in requests)


def test_a_killed_worker_is_replaced_and_its_episodes_resume_without_calling_twice(
    transactional_db, chat_server, chat_endpoint, settings, editor_client
):
    chat_server.responder = scripted
    seeds, steps = (5, 6, 7), 20
    # The uninterrupted run, in this process.
    reference = services.batch_run_inline(settings=model_settings(chat_endpoint, seeds, steps))
    assert reference.episodes_finished == 3
    expected = frames_of(reference)
    chat_server.requests.clear()
    # Every answer takes as long as STUDIO_LIVE_WRITE_SECONDS (a real model takes longer):
    # each turn is written as it is played, and the kill lands mid-episode.
    chat_server.delay = 1.0

    env = subprocess_env(CELERY_BROKER_URL=settings.CELERY_BROKER_URL)
    # Workers started by hand: the queue must stay as the killed one left it.
    with celery_worker_running():  # points this process at the broker, queue purged
        pass
    first = start_python(*WORKER_ARGS, env=env, quiet=True, own_session=True)
    try:
        batch = services.batch_create(settings=model_settings(chat_endpoint, seeds, steps))
        wait_until(
            lambda: len(chat_server.requests) >= 25,
            timeout=120,
            what=lambda: (
                "25 calls; episodes: "
                + str(list(Episode.objects.filter(batch=batch).values("status", "error", "steps")))
            ),
        )
    finally:
        first.kill_all()  # SIGKILL, mid-episode: no chance to let go of anything
    killed_at = time.monotonic()
    at_kill = len(chat_server.requests)
    in_flight_at_kill = 1  # the solo pool plays one episode at a time
    running = Episode.objects.get(batch=batch, status=Episode.Status.RUNNING)
    recorded = running.turns.count()
    assert recorded > 0
    # A worker of the same name starts (the queue kept as the killed one left it): it takes
    # over at once, not after the stale window.
    second = start_python(*WORKER_ARGS, env=env, quiet=True, own_session=True)
    try:
        wait_until(
            lambda: RolloutBatch.objects.get(id=batch.id).status == RolloutBatch.Status.FINISHED,
            timeout=180,
            what=lambda: str(list(Episode.objects.filter(batch=batch).values("status", "steps"))),
        )
    finally:
        second.kill_all()
        queue_purge()
    took = time.monotonic() - killed_at
    batch.refresh_from_db()
    assert (batch.episodes_finished, batch.episodes_failed) == (3, 0)
    resumed = Episode.objects.get(id=running.id)
    assert resumed.resumed_from_turn >= recorded - 1 and resumed.lost_worker_at is not None
    assert resumed.resume_note == ""
    # The batch page says so, instead of "running" with nothing moving.
    page = editor_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    at = timezone.localtime(resumed.lost_worker_at).strftime("%H:%M")
    said = f"1 episode lost its worker at {at}; resumed from turn {resumed.resumed_from_turn}."
    assert said in page
    # Every episode played to the end, each turn once, frames as the uninterrupted run's.
    for episode in Episode.objects.filter(batch=batch):
        indexes = list(episode.turns.order_by("index").values_list("index", flat=True))
        assert indexes == list(range(steps)), episode.id
    assert frames_of(batch) == expected
    # The server was asked each (seed, step) once, but for the calls in flight at the kill
    # and the turn whose row was on its way.
    counts = asked(chat_server.requests)
    assert set(counts) == {(seed, step) for seed in seeds for step in range(steps)}
    twice = sum(n - 1 for n in counts.values())
    assert twice <= in_flight_at_kill + 1, {k: n for k, n in counts.items() if n > 1}
    # Every request is counted on the batch, the repeated ones too, and those the killed
    # worker had sent and never saw answered.
    received = len(chat_server.requests)
    assert batch.model_calls + batch.model_retries == received
    # Taken over at the new worker's start, not after the stale window (30 s, and up to 15 s
    # more for the requeue): the rest of the resumed episode and the last one (35 s of calls)
    # end within 60 s.
    print(
        f"takeover and the rest: {took:.1f} s; {received} requests ({at_kill} at the kill), "
        f"{twice} asked twice"
    )
    assert took < 60, took


def test_a_failed_model_episode_resumed_goes_on_from_its_last_turn(
    transactional_db, chat_server, chat_endpoint, settings
):
    settings.STUDIO_OPENAI_MAX_FAILED_TURNS = 2
    chat_server.responder = scripted
    reference = services.batch_run_inline(settings=model_settings(chat_endpoint, [11], 40))
    expected = frames_of(reference)
    chat_server.requests.clear()

    down_after = 25

    def failing(body):
        if step_of(body) >= down_after and not resumed:
            from rollouts.tests.openai_server import status

            return status(503)
        return scripted(body)

    resumed = False
    chat_server.responder = failing
    batch = services.batch_run_inline(
        settings=model_settings(chat_endpoint, [11], 40, max_retries=0)
    )
    episode = Episode.objects.get(batch=batch)
    assert episode.status == Episode.Status.FAILED
    played = episode.turns.count()
    assert played >= down_after
    calls_before = len(chat_server.requests)
    assert batch.model_calls == calls_before

    resumed = True
    assert services.batch_resume(batch=batch, enqueue=False) == 1
    services.batch_play_inline(batch=batch)
    batch.refresh_from_db()
    episode.refresh_from_db()
    assert (batch.status, episode.status) == ("finished", "finished")
    assert episode.resumed_from_turn == played and episode.lost_worker_at is None
    assert list(episode.turns.order_by("index").values_list("index", flat=True)) == list(range(40))
    # No call again for a recorded turn: the resume asked from the first unrecorded step on.
    later = asked(chat_server.requests[calls_before:])
    recorded_steps = set(
        Frame.objects.filter(turns__episode=episode, turns__index__lt=played).values_list(
            "step", flat=True
        )
    )
    assert not recorded_steps & {step for _, step in later}
    # The turns that failed were played as noops (recorded so): the game is the uninterrupted
    # run's up to them, and one frame a step after them.
    frames = frames_of(batch)[11]
    assert frames[: down_after + 1] == expected[11][: down_after + 1] and len(frames) == 41
    assert batch.model_calls == len(chat_server.requests)


@pytest.mark.django_db
def test_a_resume_whose_replay_does_not_match_starts_over_and_says_so(
    chat_server, chat_endpoint, settings
):
    chat_server.responder = scripted
    batch = services.batch_run_inline(settings=model_settings(chat_endpoint, [3], 12))
    episode = Episode.objects.get(batch=batch)
    # A recorded frame that the game does not give again (a tampered row).
    Frame.objects.filter(episode=episode, step=4).update(sha256="0" * 64)
    Episode.objects.filter(id=episode.id).update(status=Episode.Status.FAILED)
    RolloutBatch.objects.filter(id=batch.id).update(
        episodes_finished=0, episodes_failed=1, status=RolloutBatch.Status.FAILED
    )
    batch.refresh_from_db()
    services.batch_resume(batch=batch, enqueue=False)
    services.batch_play_inline(batch=batch)
    episode.refresh_from_db()
    assert episode.status == Episode.Status.FINISHED
    assert episode.resume_note.startswith("started over: the replayed frame at step 4 has sha256")
    assert episode.turns.count() == 12
