"""An episode's life on its worker: claim it, play and record it (`recorder`), resume it from
its last recorded turn, and end it, counting it on its batch (the last one closes the batch).

The batch's own life (create, send, resume, cancel, play inline) is `batches`, on top of
this; `services` is what other modules call, both together.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction
from django.db.models import F
from django.dispatch import Signal
from django.utils import timezone

from rollouts.jobs import EPISODE
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.policies import build_policy, policy_kind
from rollouts.policies.base import Policy, PolicyUnavailable
from rollouts.recording import sent_calls
from rollouts.recording.fork_replay import fork_prefix_of
from rollouts.recording.recorder import (
    EPISODE_COUNTERS,
    EpisodeCanceled,
    EpisodeRecorder,
    EpisodeTotals,
    ForkDiverged,
    ResumeDiverged,
    ResumePoint,
)
from rollouts.rollout_settings import RolloutSettings
from rollouts.selectors_spend import endpoint_prices
from studio.claim_keeper import worker_name
from studio.errors import plain_error
from studio.jobs import ClaimLost, JobOutcome, error_cut, is_outage
from studio.transactions import commit_without_flush_wait, fetch_and_commit
from studio.untrusted import storable

logger = logging.getLogger(__name__)

# The row counters that `sent_calls` counts too, as requests leave.
SENT_FIELDS = (sent_calls.FIRST_TRIES, sent_calls.RETRIES)


def batch_settings(batch: RolloutBatch) -> RolloutSettings:
    return RolloutSettings.from_json(batch.settings)


def episode_claim(*, episode_id: int) -> str | None:
    """Take the episode if it is pending, or running with a stale heartbeat (its worker died)."""
    claimed = _episode_claim(episode_id=episode_id)
    return claimed[0] if claimed is not None else None


def _episode_claim(*, episode_id: int) -> tuple[str, Episode] | None:
    """`episode_claim`, and the episode (with its batch) as it is once claimed."""
    # One statement on PostgreSQL: the claim returns the episode and its batch (on the
    # critical path of every episode, it was a claim and then a read).
    claimed = EPISODE.claim_returning(
        episode_id, related="batch", increment=("attempts",), error="", worker=worker_name()
    )
    if claimed is None:
        return None
    token, episode = claimed
    # A batch that has started is never pending again (a resumed batch that had started goes
    # back to running), so only the claims that still find it pending date its start: one
    # UPDATE for the first episodes of a batch, none for the others.
    if episode.batch.status == RolloutBatch.Status.PENDING:
        # Filtered on the batch row's own status: an UPDATE that waited for the row's lock
        # checks that again on the row as it then is. Through a join it did not, and a claim
        # that waited behind the batch's last episode ending set a finished batch back to
        # running, for good.
        RolloutBatch.objects.filter(id=episode.batch_id, status=RolloutBatch.Status.PENDING).update(
            status=RolloutBatch.Status.RUNNING, started_at=timezone.now()
        )
    return token, episode


# What `batch_resume` writes on the episodes it sends again: a resume asked for, not a
# worker lost (`episode_run` tells them apart by it).
RESUME_REQUESTED = "resumed on request"


def episode_run(
    *, episode_id: int, cli_api_key: str = "", policy: Policy | None = None
) -> JobOutcome:
    """Claim, play and record one episode. Idempotent.

    A model episode that was played before (its worker died, or it failed or was canceled
    and is resumed) goes on from its last recorded turn: the recorded actions are replayed,
    each frame checked against its stored sha256, and no call is made again for a recorded
    turn; only a replay that does not give the stored frames starts over, and says so
    (`resume_note`). A baseline's calls cost nothing: it starts over. A database or broker
    that cannot be reached hands the episode back ("retry"), never fails it.

    `cli_api_key` is for `rollout --inline` only: the command's own key, sent to the URL its
    operator gave when no admin-named endpoint is involved (`rollouts.policies.endpoints`).
    `policy`: the one that plays, built by the caller instead of from the batch's settings
    (a GRPO job's train worker plays the model it trains); the caller closes it.
    """
    claimed = _episode_claim(episode_id=episode_id)
    if claimed is None:
        return EPISODE.unclaimed(episode_id)
    token, episode = claimed
    settings = batch_settings(episode.batch)
    owned = policy is None
    if owned and not policy_kind(settings.policy).played_by_worker:
        # Only the caller that holds its model plays it (a GRPO job's train worker): a
        # message that reached a rollouts worker lets it go untouched.
        EPISODE.release(episode_id, token)
        return "done_already"
    try:
        if policy is None:
            policy = build_policy(
                settings, seed=int(episode.seed), sample=episode.sample, cli_api_key=cli_api_key
            )
    except PolicyUnavailable as exc:
        batch_fail(batch=episode.batch, error=str(exc))
        episode_fail(episode=episode, claim_token=token, error=str(exc), totals=EpisodeTotals())
        return "failed"
    try:
        return _episode_play(episode=episode, token=token, settings=settings, policy=policy)
    except Exception as exc:
        # A database or broker (the limiter's Redis) that cannot be reached is not the
        # episode's fault: it goes on from its last written turn once they are back.
        if not is_outage(exc):
            raise
        logger.warning("episode %s: %s; handed back, to resume", episode_id, plain_error(exc))
        EPISODE.hand_back(episode_id, token)
        return "retry"
    finally:
        if owned:
            policy.close()


def _episode_play(*, episode: Episode, token: str, settings: RolloutSettings, policy) -> JobOutcome:
    resume = None
    unsettled = None
    calls_model = policy_calls_model(policy)
    if episode.attempts > 1 and calls_model:
        unsettled = _unsettled_calls(episode=episode)
    if episode.attempts > 1:
        resume = _resume_point(episode=episode, token=token, resumable=policy_calls_model(policy))
    try:
        prefix = _fork_prefix(episode) if resume is None else None
    except ValueError as exc:  # ForkError: the fork point is gone
        episode_fail(episode=episode, claim_token=token, error=str(exc), totals=EpisodeTotals())
        return "failed"

    def finish(totals: EpisodeTotals) -> bool:
        # In the transaction of the episode's last rows: one commit writes them and ends it.
        return _episode_end_rows(
            episode=episode,
            claim_token=token,
            status=Episode.Status.FINISHED,
            error="",
            totals=totals,
        )

    def recorder_for(resume: ResumePoint | None, prefix) -> EpisodeRecorder:
        return EpisodeRecorder(
            episode=episode,
            settings=settings,
            policy=policy,
            claim_token=token,
            prefix=prefix,
            resume=resume,
            end=finish,
            unsettled=unsettled,
            priced=calls_model and endpoint_prices(name=settings.endpoint) is not None,
        )

    recorder = recorder_for(resume, prefix)
    try:
        try:
            recorder.play()  # ends the episode as finished with its last rows (`finish`)
        except ResumeDiverged as exc:
            # Never play on from a game that is not the one recorded: start over, say so.
            logger.warning("episode %s: resume diverged (%s), starting over", episode.id, exc)
            _episode_start_over(episode=episode, note=f"started over: {exc}")
            recorder = recorder_for(None, _fork_prefix(episode))
            recorder.play()
    except ForkDiverged as exc:
        episode_fail(episode=episode, claim_token=token, error=str(exc), totals=EpisodeTotals())
        return "failed"
    except EpisodeCanceled:
        _episode_canceled(episode=episode, claim_token=token, totals=recorder.totals)
        return "canceled"
    except ClaimLost:
        logger.warning("episode %s: claim lost, leaving it to its new owner", episode.id)
        return "claim_lost"
    except PolicyUnavailable as exc:
        # The batch first: were this its last episode, ending it would close the batch as
        # finished before it could be marked failed.
        batch_fail(batch=episode.batch, error=str(exc))
        episode_fail(episode=episode, claim_token=token, error=str(exc), totals=recorder.totals)
        return "failed"
    except Exception as exc:  # a poison episode is set aside, never retried forever
        if is_outage(exc):
            raise  # handed back by `episode_run`, not failed
        logger.exception("episode %s failed", episode.id)
        episode_fail(
            episode=episode,
            claim_token=token,
            error=plain_error(exc),
            totals=recorder.totals,
        )
        return "failed"
    return "finished"


def policy_calls_model(policy) -> bool:
    return bool(getattr(policy, "calls_model", False))


def _unsettled_calls(*, episode: Episode) -> dict[str, int]:
    """Requests an earlier attempt sent that its row does not count (its worker died before
    writing their turns): read before anything is written, so its counts are the last
    attempt's."""
    counted = Episode.objects.filter(id=episode.id).values(*SENT_FIELDS).first() or {}
    key = sent_calls.episode_key(episode.id, batch_created_at=episode.batch.created_at)
    return sent_calls.unsettled_calls(key, counted=counted)


def _resume_point(*, episode: Episode, token: str, resumable: bool) -> ResumePoint | None:
    """Where an episode played before goes on from; None to start over (nothing recorded, or
    a baseline, whose rows are then cleared: they are replaced, never added to)."""
    turns = list(
        Turn.objects.filter(episode=episode).order_by("index").values_list("index", "actions")
    )
    frames = {
        step: (frame_id, sha256)
        for frame_id, step, sha256 in Frame.objects.filter(episode=episode).values_list(
            "id", "step", "sha256"
        )
    }
    contiguous = [index for index, _ in turns] == list(range(len(turns)))
    forked_short = episode.forked_at_turn is not None and len(turns) < episode.fork_prefix_turns
    if not resumable or not turns or not contiguous or forked_short:
        if turns or frames:
            _episode_start_over(episode=episode, note="")
        return None
    counters = Episode.objects.filter(id=episode.id).values(*EPISODE_COUNTERS).first() or {}
    lost = episode.resume_note != RESUME_REQUESTED
    Episode.objects.filter(id=episode.id, claim_token=token).update(
        resumed_from_turn=len(turns),
        resume_note="",
        **({"lost_worker_at": timezone.now()} if lost and episode.lost_worker_at is None else {}),
    )
    return ResumePoint(
        actions=[list(actions) for _, actions in turns],
        frames=frames,
        stored_through=max(frames),
        counters=counters,
        # An attempt that ended (failed, canceled) counted its calls on the batch; one whose
        # worker died did not.
        credited=not lost,
    )


def _episode_start_over(*, episode: Episode, note: str) -> None:
    """Clear what an earlier attempt recorded: the episode is played again from its start."""
    with transaction.atomic():
        Turn.objects.filter(episode=episode).delete()
        Frame.objects.filter(episode=episode).delete()
        Episode.objects.filter(id=episode.id).update(
            resume_note=note, resumed_from_turn=0 if note else None
        )


def _episode_canceled(*, episode: Episode, claim_token: str, totals: EpisodeTotals) -> None:
    """A canceled episode's worker lets go: its last counters (its rows are written), and
    the batch's share of them not counted yet. The batch counted it as ended at the cancel."""
    with transaction.atomic():
        let_go = Episode.objects.filter(
            id=episode.id, claim_token=claim_token, status=Episode.Status.CANCELED
        ).update(
            claim_token="",
            **totals.live_fields(),
            total_reward=totals.total_reward,
            achievements=totals.achievements,
            achievement_count=len(totals.achievements),
        )
        credit = totals.uncredited()
        if let_go and any(credit.values()):
            batch_credit(batch_id=episode.batch_id, credit=credit)


def batch_credit(*, batch_id: int, credit: dict[str, int]) -> None:
    """Add model calls and tokens (`EpisodeTotals.batch_counters`) to the batch's counters,
    for episodes that end outside `_batch_count_end` (canceled ones)."""
    RolloutBatch.objects.filter(id=batch_id).update(
        **{name: F(name) + value for name, value in credit.items()}
    )


def _fork_prefix(episode: Episode):
    return fork_prefix_of(episode=episode) if episode.forked_at_turn is not None else None


def episode_finish(*, episode: Episode, claim_token: str, totals) -> None:
    _episode_end(
        episode=episode,
        claim_token=claim_token,
        status=Episode.Status.FINISHED,
        error="",
        totals=totals,
    )


def episode_fail(*, episode: Episode, claim_token: str, error: str, totals) -> None:
    _episode_end(
        episode=episode,
        claim_token=claim_token,
        status=Episode.Status.FAILED,
        error=error_cut(error),
        totals=totals,
    )


def _episode_end(*, episode: Episode, claim_token: str, status: str, error: str, totals) -> bool:
    """End the episode in a transaction of its own; False: the claim was lost."""
    with transaction.atomic():
        # The episodes of a batch end together and each holds the batch row's lock until it
        # commits: waiting for the WAL flush there queued them one flush after another. A
        # crash that loses such a commit leaves the episode running with an old heartbeat (or
        # its last chunk unwritten), and the periodic requeue plays it again, as for a worker
        # that died.
        commit_without_flush_wait()
        return _episode_end_rows(
            episode=episode, claim_token=claim_token, status=status, error=error, totals=totals
        )


def _episode_end_rows(
    *, episode: Episode, claim_token: str, status: str, error: str, totals
) -> bool:
    """The episode's end and its batch's counters, inside the caller's transaction (the one
    that also writes the episode's last rows, when it finishes: `EpisodeRecorder(end=...)`).
    False: the claim was lost, and nothing was written."""
    now = timezone.now()
    ended = EPISODE.finish(
        episode.id, claim_token, status=status, error=error, **totals.as_fields()
    )
    if not ended:
        return False
    closed = _batch_count_end(
        batch_id=episode.batch_id,
        finished=status == Episode.Status.FINISHED,
        totals=totals,
        now=now,
    )
    if closed:
        transaction.on_commit(lambda: _batch_closed(episode.batch_id))
    return True


def _batch_count_end(*, batch_id: int, finished: bool, totals, now) -> bool:
    """Count an ended episode on its batch; True when it was the batch's last (it closed it).

    One UPDATE of the batch row, so that the episodes ending together queue on its lock for
    one statement each, not three. Its SET clauses read the row as it was: this episode
    makes it complete when the ended count before it is one short. The last episode to end
    closes the batch (exactly once: the row is locked); a batch stopped by `batch_fail` keeps
    its status, and its last episode dates its end. Written in SQL: the ORM's expressions
    would build the same statement again for every episode, on the cores the episodes play
    on; with RETURNING it also says whether it closed the batch.
    """
    table = RolloutBatch._meta.db_table
    counter = "episodes_finished" if finished else "episodes_failed"
    complete = "episodes_total <= episodes_finished + episodes_failed + 1"
    running = "status IN (%s, %s)"
    open_statuses = [RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING]
    ended_at = connection.ops.adapt_datetimefield_value(now)
    returning = connection.vendor == "postgresql" or (
        connection.vendor == "sqlite" and connection.Database.sqlite_version_info >= (3, 35)
    )
    counts = "status, episodes_finished + episodes_failed, episodes_total"
    sql = (
        f"UPDATE {table} SET {counter} = {counter} + 1, "
        "model_calls = model_calls + %s, model_errors = model_errors + %s, "
        "model_retries = model_retries + %s, prompt_tokens = prompt_tokens + %s, "
        "completion_tokens = completion_tokens + %s, "
        f"status = CASE WHEN {complete} AND {running} THEN %s ELSE status END, "
        f"finished_at = CASE WHEN {complete} AND ({running} OR finished_at IS NULL) "
        "THEN %s ELSE finished_at END "
        "WHERE id = %s"
        + (
            " RETURNING status, episodes_finished + episodes_failed, episodes_total"
            if returning
            else ""
        )
    )
    # What the episode's written chunks have not added to the batch already.
    credit = totals.uncredited()
    params = [
        credit["model_calls"],
        credit["model_errors"],
        credit["model_retries"],
        credit["prompt_tokens"],
        credit["completion_tokens"],
        *open_statuses,
        RolloutBatch.Status.FINISHED,
        *open_statuses,
        ended_at,
        batch_id,
    ]
    if returning:
        # The last statement of the episode's end: with its COMMIT, so that the batch row's
        # lock is let go on the server, not after another round trip.
        row = fetch_and_commit(sql, params)
    else:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            # The row is ours until the commit: read it as it now is.
            cursor.execute(f"SELECT {counts} FROM {table} WHERE id = %s", [batch_id])
            row = cursor.fetchone()
    # Ended, finished, and every episode counted: this episode closed it (the count moves
    # past the total only if the batch ended before, and then it was not this one).
    return row is not None and row[0] == RolloutBatch.Status.FINISHED and row[1] == row[2]


# Sent once the episode that closed its batch has committed (its `batch_id`): a later app
# connects to it (evaluation warms its leaderboard's statistics), so rollouts names none.
batch_closed = Signal()


def _batch_closed(batch_id: int) -> None:
    """After the commit (off the batch row's lock) of the episode that closed the batch. A
    receiver that fails is only logged: what it would have done is done later (the first
    viewer computes the statistics instead)."""
    for receiver, result in batch_closed.send_robust(sender=RolloutBatch, batch_id=batch_id):
        if isinstance(result, Exception):
            logger.warning("batch %s closed: %r failed (%s)", batch_id, receiver, result)


def batch_fail(*, batch: RolloutBatch, error: str) -> None:
    """Stop a batch that cannot go on (its endpoint is down): pending episodes fail at once."""
    now = timezone.now()
    with transaction.atomic():
        skipped = Episode.objects.filter(batch=batch, status=Episode.Status.PENDING).update(
            status=Episode.Status.FAILED,
            error=storable(f"batch stopped: {error}", max_bytes=4000),
            finished_at=now,
        )
        RolloutBatch.objects.filter(id=batch.id).update(
            episodes_failed=F("episodes_failed") + skipped,
        )
        RolloutBatch.objects.filter(
            id=batch.id, status__in=[RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING]
        ).update(status=RolloutBatch.Status.FAILED, error=storable(error, max_bytes=4000))
    # Episodes still running elsewhere end on their own and count themselves.
    RolloutBatch.objects.filter(
        id=batch.id, episodes_total__lte=F("episodes_finished") + F("episodes_failed")
    ).update(finished_at=now)
