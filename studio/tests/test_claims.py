"""The claim service on real PostgreSQL: one winner per row, stale claims taken over, ended
jobs left alone, and the requeue's choice of rows.

The job here is a bulk flag (the smallest `ClaimedJob`); a training submission checks the
job's own "working" status and a `where`. Expected values are worked out by hand from the
rows as written, never read back from the service.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np
import pytest
from django.db import connection, connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from curation.models import Dataset, DatasetVersion
from rollouts.models import Episode, RolloutBatch, TurnBulkFlag
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio import claims
from training.models import TrainingJob

STALE = timedelta(minutes=5)


def _job(**fields) -> TurnBulkFlag:
    return TurnBulkFlag.objects.create(filters={}, flagged=True, **fields)


def _in_thread(work):
    """Run `work` on a thread of its own, so on a database connection of its own."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # reported to the test, not lost with the thread
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def _waits_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row) and row[0] == "Lock"


def _race(claim):
    """Two claimers of one row: the first claims in a transaction it holds open until the
    second waits on the row's lock (polled in pg_stat_activity, not timed), then commits.
    Returns (first's value, second's value)."""
    first_claimed = threading.Event()
    release = threading.Event()
    second_pid: dict = {}

    def first():
        with transaction.atomic():
            value = claim()
            first_claimed.set()
            assert release.wait(60)
        return value

    def second():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            second_pid["pid"] = cursor.fetchone()[0]
        assert first_claimed.wait(60)
        return claim()

    one, first_box = _in_thread(first)
    assert first_claimed.wait(60)
    two, second_box = _in_thread(second)
    try:
        for _ in range(6000):
            if "pid" in second_pid and _waits_on_a_lock(second_pid["pid"]):
                break
            threading.Event().wait(0.01)
        else:
            pytest.fail("the second claimer never waited on the row")
    finally:
        release.set()
        one.join(60)
        two.join(60)
    assert "error" not in first_box and "error" not in second_box
    return first_box["value"], second_box["value"]


@pytest.mark.django_db(transaction=True)
def test_it_gives_a_row_to_one_of_two_racing_claimers():
    job = _job()
    first, second = _race(
        lambda: claims.job_claim(model=TurnBulkFlag, pk=job.id, stale_after=STALE)
    )
    # The first committed "running" with a fresh heartbeat: re-checked after the wait, the
    # second's condition no longer holds, so it updates nothing.
    assert len(first) == 32 and second is None
    job.refresh_from_db()
    assert (job.status, job.claim_token) == ("running", first)


@pytest.mark.django_db(transaction=True)
def test_it_gives_a_row_to_exactly_one_of_many_simultaneous_claimers():
    job = _job()
    start = threading.Barrier(4)

    def claim() -> str | None:
        start.wait(60)
        return claims.job_claim(model=TurnBulkFlag, pk=job.id, stale_after=STALE)

    runs = [_in_thread(claim) for _ in range(4)]
    for thread, _ in runs:
        thread.join(60)
    tokens = [box["value"] for _, box in runs]
    winners = [t for t in tokens if t is not None]
    assert len(winners) == 1 and tokens.count(None) == 3
    job.refresh_from_db()
    assert job.claim_token == winners[0]


@pytest.mark.django_db
def test_it_takes_over_a_claim_whose_heartbeat_is_stale():
    now = timezone.now()
    silent = now - STALE - timedelta(seconds=1)  # 5 min 1 s without a word: presumed dead
    job = _job(status="running", claim_token="dead", heartbeat_at=silent, started_at=silent)
    token = claims.job_claim(model=TurnBulkFlag, pk=job.id, stale_after=STALE)
    assert token is not None and token != "dead"
    job.refresh_from_db()
    assert (job.status, job.claim_token) == ("running", token)
    assert job.heartbeat_at > silent and job.started_at > silent
    # The dead worker wakes up: every write through its old token is refused.
    assert not claims.job_heartbeat(model=TurnBulkFlag, pk=job.id, token="dead", changed=9)
    assert not claims.job_finish(model=TurnBulkFlag, pk=job.id, token="dead")
    assert not claims.job_fail(model=TurnBulkFlag, pk=job.id, token="dead", error="x")
    job.refresh_from_db()
    assert (job.status, job.changed, job.error) == ("running", 0, "")


@pytest.mark.django_db
def test_it_leaves_a_claim_whose_heartbeat_is_fresh():
    recent = timezone.now() - STALE + timedelta(minutes=1)  # silent 4 min: still alive
    job = _job(status="running", claim_token="alive", heartbeat_at=recent)
    assert claims.job_claim(model=TurnBulkFlag, pk=job.id, stale_after=STALE) is None
    job.refresh_from_db()
    assert (job.claim_token, job.heartbeat_at) == ("alive", recent)


@pytest.mark.django_db
def test_it_never_claims_an_ended_job_again():
    long_ago = timezone.now() - timedelta(days=1)
    finished = _job()
    token = claims.job_claim(model=TurnBulkFlag, pk=finished.id, stale_after=STALE)
    assert claims.job_finish(model=TurnBulkFlag, pk=finished.id, token=token, changed=3)
    failed = _job()
    token2 = claims.job_claim(model=TurnBulkFlag, pk=failed.id, stale_after=STALE)
    assert claims.job_fail(model=TurnBulkFlag, pk=failed.id, token=token2, error="boom")
    TurnBulkFlag.objects.update(heartbeat_at=long_ago)
    for job in (finished, failed):
        # Even with no stale window at all and a day-old heartbeat.
        assert claims.job_claim(model=TurnBulkFlag, pk=job.id, stale_after=timedelta(0)) is None
    finished.refresh_from_db()
    failed.refresh_from_db()
    assert (finished.status, finished.changed, finished.claim_token) == ("done", 3, token)
    assert (failed.status, failed.error, failed.claim_token) == ("failed", "boom", token2)
    assert finished.finished_at is not None and failed.finished_at is not None
    # Ending twice changes nothing: the row is no longer "running".
    assert not claims.job_finish(model=TurnBulkFlag, pk=finished.id, token=token)
    assert claims.jobs_to_resend(rows=TurnBulkFlag.objects.all(), stale_after=STALE) == []


@pytest.mark.django_db
def test_it_claims_with_the_jobs_own_working_status_and_condition():
    dataset = Dataset.objects.create(name="d")
    version = DatasetVersion.objects.create(dataset=dataset, number=1)
    job = TrainingJob.objects.create(
        dataset_version=version, base_url="http://127.0.0.1:9", model="m", idempotency_key="k"
    )
    uploading = TrainingJob.Status.UPLOADING
    asked_cancel = Q(cancel_requested=True)  # not so for this job: nothing to claim
    assert (
        claims.job_claim(model=TrainingJob, pk=job.id, stale_after=STALE, where=asked_cancel)
        is None
    )
    token = claims.job_claim(
        model=TrainingJob, pk=job.id, stale_after=STALE, working=uploading, stamp_start=False
    )
    job.refresh_from_db()
    assert (job.status, job.claim_token, job.started_at) == ("uploading", token, None)
    # "running" is not this job's working status: a heartbeat there finds nothing.
    assert not claims.job_heartbeat(model=TrainingJob, pk=job.id, token=token)
    assert claims.job_heartbeat(
        model=TrainingJob, pk=job.id, token=token, working=uploading, remote_job_id="r-1"
    )
    assert TrainingJob.objects.get(id=job.id).remote_job_id == "r-1"


@pytest.mark.django_db
def test_it_picks_what_the_requeue_sends_again(settings):
    settings.STUDIO_REQUEUE_GRACE_SECONDS = 30
    settings.STUDIO_REQUEUE_PENDING_SECONDS = 3600
    now = timezone.now()
    stale = _job(status="running", claim_token="a", heartbeat_at=now - timedelta(minutes=6))
    _job(status="running", claim_token="b", heartbeat_at=now - timedelta(minutes=4))
    never_sent = _job()
    just_made = _job()
    _job(enqueued_at=now - timedelta(minutes=59))  # sent, waiting for a worker: not yet lost
    lost = _job(enqueued_at=now - timedelta(minutes=61))  # sent, never started: lost
    _job(status="done", enqueued_at=now - timedelta(days=1))
    # auto_now_add dates every row now: move creation back by hand.
    TurnBulkFlag.objects.exclude(id=just_made.id).update(created_at=now - timedelta(minutes=1))
    TurnBulkFlag.objects.filter(id=just_made.id).update(created_at=now - timedelta(seconds=5))
    ids = claims.jobs_to_resend(rows=TurnBulkFlag.objects.all(), stale_after=STALE)
    assert ids[0] == stale.id and sorted(ids[1:]) == sorted([never_sent.id, lost.id])


# An episode's claim (`services._episode_claim`, through `claims.job_claim_returning`): on
# PostgreSQL one statement that returns the episode and its batch. What it returns is
# compared with what the ORM's own `select_related("batch").get()` reads of the same row.


def _episode(**fields) -> Episode:
    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(4, 9), steps=5), enqueue=False
    )
    episode = batch.episodes.get(seed=9)
    if fields:
        Episode.objects.filter(id=episode.id).update(**fields)
    return episode


def _columns(obj) -> dict:
    """Every concrete field's value, with its type (a JSON text is not its dict)."""
    return {
        f.attname: (type(getattr(obj, f.attname)), getattr(obj, f.attname))
        for f in type(obj)._meta.concrete_fields
    }


def _read(episode_id: int) -> Episode:
    return Episode.objects.select_related("batch").get(id=episode_id)


@pytest.mark.django_db
def test_an_episode_claim_returns_the_rows_the_orm_reads_back(settings, django_assert_num_queries):
    settings.STUDIO_EPISODE_STALE_SECONDS = 3600
    sent = timezone.now() - timedelta(minutes=3)
    source = _episode()
    episode = _episode(
        achievements={"collect_wood": 3, "place_table": 7},
        total_reward=2.5,
        enqueued_at=sent,
        forked_from=source,
        forked_at_turn=4,
        fork_prefix_turns=5,
        fork_with_correction=True,
        prompt_tokens=12,
    )
    RolloutBatch.objects.filter(id=episode.batch_id).update(status="running")
    # One statement on PostgreSQL (elsewhere the claim, then the read); the batch is running
    # already: nothing else to write.
    with django_assert_num_queries(1 if connection.vendor == "postgresql" else 2):
        token, claimed = services._episode_claim(episode_id=episode.id)
    expected = _read(episode.id)
    assert _columns(claimed) == _columns(expected)
    assert _columns(claimed.batch) == _columns(expected.batch)
    # What the claim wrote, as the ORM reads it back.
    assert (expected.status, expected.claim_token, expected.attempts) == ("running", token, 1)
    assert expected.heartbeat_at == expected.started_at and expected.started_at > sent
    assert expected.achievements == {"collect_wood": 3, "place_table": 7}
    assert expected.batch.settings["seeds"] == [4, 9]
    # Instances as a select_related read makes them: saved, from the database, batch cached.
    for obj in (claimed, claimed.batch):
        assert (obj._state.adding, obj._state.db) == (False, "default")
    with django_assert_num_queries(0):
        assert claimed.batch.id == episode.batch_id
    assert claimed.forked_from_id == source.id
    claimed.total_reward = 3.0  # and they save as ORM instances do
    claimed.save(update_fields=["total_reward"])
    assert _read(episode.id).total_reward == 3.0


@pytest.mark.django_db
def test_an_episode_claim_starts_a_pending_batch():
    episode = _episode()
    _token, claimed = services._episode_claim(episode_id=episode.id)
    batch = RolloutBatch.objects.get(id=episode.batch_id)
    assert batch.status == "running" and batch.started_at >= claimed.started_at
    # The returned batch is the row as the claim found it (pending), as the ORM's read was.
    assert claimed.batch.status == "pending"
    assert _columns(claimed) == _columns(_read(episode.id))


@pytest.mark.django_db
def test_an_episode_claim_takes_over_a_stale_one(settings):
    settings.STUDIO_EPISODE_STALE_SECONDS = 300
    silent = timezone.now() - timedelta(seconds=301)
    episode = _episode(
        status="running", claim_token="dead", heartbeat_at=silent, started_at=silent, attempts=1
    )
    RolloutBatch.objects.filter(id=episode.batch_id).update(status="running")
    token, claimed = services._episode_claim(episode_id=episode.id)
    expected = _read(episode.id)
    assert _columns(claimed) == _columns(expected)
    assert _columns(claimed.batch) == _columns(expected.batch)
    assert token not in ("dead", "") and expected.claim_token == token
    assert (expected.status, expected.attempts, expected.error) == ("running", 2, "")
    assert expected.heartbeat_at > silent and expected.started_at > silent


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields",
    [
        {"status": "finished", "claim_token": "t", "attempts": 1},
        {"status": "failed", "claim_token": "t", "attempts": 1, "error": "boom"},
        # Silent 4 min of a 5 min window: its worker is alive.
        {"status": "running", "claim_token": "alive", "attempts": 1, "heartbeat_at": 240},
    ],
    ids=["finished", "failed", "fresh"],
)
def test_an_episode_claim_leaves_an_ended_or_held_one(settings, fields):
    settings.STUDIO_EPISODE_STALE_SECONDS = 300
    now = timezone.now()
    fields = {**fields, "started_at": now - timedelta(hours=1)}
    fields["heartbeat_at"] = now - timedelta(seconds=fields.get("heartbeat_at", 3600))
    episode = _episode(**fields)
    before = (_columns(_read(episode.id)), _columns(_read(episode.id).batch))
    assert services._episode_claim(episode_id=episode.id) is None
    assert services.episode_claim(episode_id=episode.id) is None
    after = _read(episode.id)
    assert (_columns(after), _columns(after.batch)) == before


@pytest.mark.django_db
def test_an_episode_claim_of_a_missing_episode_is_none():
    assert services._episode_claim(episode_id=10**12) is None


@pytest.mark.django_db(transaction=True)
def test_an_episode_goes_to_one_of_two_racing_claimers(settings):
    settings.STUDIO_EPISODE_STALE_SECONDS = 3600
    episode = _episode()
    (token, claimed), second = _race(lambda: services._episode_claim(episode_id=episode.id))
    assert second is None
    expected = _read(episode.id)
    assert (expected.status, expected.claim_token, expected.attempts) == ("running", token, 1)
    assert _columns(claimed) == _columns(expected)


@pytest.mark.django_db(transaction=True)
def test_an_episode_goes_to_exactly_one_of_many_simultaneous_claimers():
    episode = _episode()
    start = threading.Barrier(4)

    def claim():
        start.wait(60)
        return services._episode_claim(episode_id=episode.id)

    runs = [_in_thread(claim) for _ in range(4)]
    for thread, _ in runs:
        thread.join(60)
    assert all("error" not in box for _, box in runs)
    won = [box["value"] for _, box in runs if box["value"] is not None]
    assert len(won) == 1 and len(runs) - len(won) == 3
    expected = _read(episode.id)
    assert (expected.claim_token, expected.attempts) == (won[0][0], 1)
    assert RolloutBatch.objects.get(id=episode.batch_id).status == "running"


@pytest.mark.django_db
def test_an_end_writes_what_the_orms_update_writes():
    source = _episode()
    ours, reference = _episode(), _episode()
    tokens = []
    for episode in (ours, reference):
        token, _ = services._episode_claim(episode_id=episode.id)
        tokens.append(token)
    values = {
        "error": 'it\'s "quoted" \\ and ünïcode',
        "steps": np.int64(7),  # numpy numbers, as a game's totals may hold them
        "total_reward": np.float64(2.5),
        "achievements": {"collect_wood": 3, "place_table": 7},
        "achievement_count": 2,
        "forked_from": source,  # an instance for a foreign key
        "forked_at_turn": None,
    }
    assert claims.job_finish(
        model=Episode, pk=ours.id, token=tokens[0], status="finished", **values
    )
    now = Episode.objects.get(id=ours.id).finished_at
    held = claims.job_held(model=Episode, pk=reference.id, token=tokens[1])
    assert held.update(status="finished", finished_at=now, heartbeat_at=now, **values) == 1
    skip = {"id", "batch_id", "seed", "claim_token", "enqueued_at", "started_at"}
    written = {k: v for k, v in _columns(_read(ours.id)).items() if k not in skip}
    assert written == {k: v for k, v in _columns(_read(reference.id)).items() if k not in skip}
    assert _read(ours.id).heartbeat_at == now and _read(ours.id).error == values["error"]
    # The claim is gone once ended: a second end, or a heartbeat, writes nothing.
    assert not claims.job_finish(model=Episode, pk=ours.id, token=tokens[0], status="failed")
    assert not claims.job_heartbeat(model=Episode, pk=ours.id, token=tokens[0], steps=9)
    assert _read(ours.id).status == "finished" and _read(ours.id).steps == 7


@pytest.mark.django_db
def test_a_heartbeat_with_an_expression_goes_through_the_orm():
    episode = _episode(steps=4)
    token, _ = services._episode_claim(episode_id=episode.id)
    assert claims.job_heartbeat(model=Episode, pk=episode.id, token=token, steps=F("steps") + 3)
    assert _read(episode.id).steps == 7
