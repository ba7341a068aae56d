"""Writing what an episode played: each frame's file, then its frames and turns in chunks,
each chunk in one transaction that also renews the episode's claim (a worker that lost it
stops at its next chunk instead of writing beside the new owner), waiting out a database
that cannot be reached (`studio.outages.waited_out`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings as django_settings
from django.db import connections, transaction

from rollouts.game.crafter_env import StudioEnv, encode_png
from rollouts.jobs import EPISODE
from rollouts.models import Episode, Frame, Turn
from rollouts.recording.frame_store import frame_name
from rollouts.recording.replay import ResumeDiverged
from rollouts.recording.totals import EpisodeTotals
from studio.claims import ClaimLost, job_heartbeat
from studio.outages import waited_out
from studio.row_copy import copy_rows
from studio.transactions import commit_without_flush_wait


class Writing:
    """`EpisodeRecorder`'s writes (its attributes: `episode`, `claim_token`, `store`, `chunk`,
    `totals`, `_frames`, `_turns`, `_writing`, `_writer`, `_background`, `_canceled`)."""

    def _add_frame(self, env: StudioEnv, pixels) -> tuple[Frame, bytes]:
        encoded = encode_png(pixels)
        step = env.step_count
        if self.resume is not None and step <= self.resume.stored_through:
            return self._stored_frame(env, step, encoded), encoded.png
        sha256, name = self.store.stage(encoded.png)
        frame = Frame(
            episode=self.episode,
            step=step,
            sha256=sha256,
            image=name,
            width=encoded.width,
            height=encoded.height,
            state=env.state(),
        )
        self._frames.append(frame)
        return frame, encoded.png

    def _stored_frame(self, env: StudioEnv, step: int, encoded) -> Frame:
        """A replayed frame whose row exists: checked against it, not written again."""
        assert self.resume is not None
        sha256 = hashlib.sha256(encoded.png).hexdigest()
        stored = self.resume.frames.get(step)
        if stored is None or stored[1] != sha256:
            raise ResumeDiverged(
                f"the replayed frame at step {step} has sha256 {sha256}, the stored one "
                + (f"has {stored[1]}" if stored else "is missing")
            )
        return Frame(
            id=stored[0],
            episode=self.episode,
            step=step,
            sha256=sha256,
            image=frame_name(sha256),
            width=encoded.width,
            height=encoded.height,
            state=env.state(),
        )

    def flush(
        self, *, final: bool = False, end: Callable[[EpisodeTotals], bool] | None = None
    ) -> None:
        """Write the pending frames and turns, after the chunk before them.

        While the episode plays on, chunks go to a writer thread (started at the first
        one, so that short episodes never pay for a thread and its database connection);
        the final chunk is written here, once the writer is done, and with `end` it ends the
        episode in the same transaction.
        """
        chunk = (self.store.take_staged(), self._frames, self._turns, self.totals.live_fields())
        self._frames, self._turns = [], []
        self._wait_for_writer()
        # A model episode writes its turn here, between two calls, on its own connection: a
        # writer thread would open a connection of its own for each episode (a 5-turn episode
        # paid more for that than for its rows).
        if final or not self._background or self.live:
            try:
                self._write_chunk(*chunk, end=end)
            except ClaimLost:
                raise
            except BaseException:
                if end is not None:
                    # The end failed and took the last rows with it: they are pending again,
                    # so that saving what was played (`play`) writes them, without the end.
                    self.store.stage_again(chunk[0])
                    self._frames, self._turns = chunk[1] + self._frames, chunk[2] + self._turns
                raise
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="episode-writer")
        self._writing = self._writer.submit(self._write_chunk, *chunk)

    def _wait_for_writer(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _close_writer(self) -> None:
        if self._writer is None:
            return
        try:
            self._wait_for_writer()
        finally:
            # The writer thread's own database connection must not outlive it.
            self._writer.submit(connections.close_all).result()
            self._writer.shutdown(wait=True)
            self._writer = None

    def _write_chunk(
        self,
        files: list[tuple[str, bytes]],
        frames: list[Frame],
        turns: list[Turn],
        live: dict[str, int],
        *,
        end: Callable[[EpisodeTotals], bool] | None = None,
    ) -> None:
        """Write one chunk (files first, so no row names a missing file), retried while the
        database is unreachable; a chunk whose commit was lost with the connection, but
        made it, is not written twice."""
        self.store.write_many(files)
        waited_out(
            lambda: self._write_rows(frames, turns, live, end=end),
            what=f"episode {self.episode.id}",
            seconds=django_settings.STUDIO_DATABASE_OUTAGE_SECONDS,
            landed=lambda: self._landed(frames, turns, end),
        )

    def _landed(self, frames: list[Frame], turns: list[Turn], end) -> bool:
        """Whether a chunk whose commit failed with its connection was committed after all
        (its last row is there, or, for an end alone, the episode is finished)."""
        episode = self.episode.id
        if turns:
            written = Turn.objects.filter(episode_id=episode, index=turns[-1].index)
        elif frames:
            written = Frame.objects.filter(episode_id=episode, step=frames[-1].step)
        elif end is not None:
            written = Episode.objects.filter(
                id=episode, claim_token=self.claim_token, status=Episode.Status.FINISHED
            )
        else:
            return False
        return written.exists()

    def _write_rows(
        self,
        frames: list[Frame],
        turns: list[Turn],
        live: dict[str, int],
        *,
        end: Callable[[EpisodeTotals], bool] | None = None,
    ) -> None:
        with transaction.atomic():
            # Turns lost in a database crash (not a restart: that flushes) are played again,
            # from the last turn on disk: at most the last fraction of a second's calls.
            commit_without_flush_wait()
            if end is None:
                self._renew(live)
            copy_rows(frames, turns)  # COPY on PostgreSQL: rows written on every step
            # The end checks the claim as the renewal does; a lost one undoes the rows.
            if end is not None and not end(self.totals):
                if not self._canceled_here():
                    raise ClaimLost(f"episode {self.episode.id} was claimed by another worker")
                self._renew(live)  # the rows stay, the service ends it as canceled

    def _renew(self, live: dict[str, int]) -> None:
        """Renew the claim with the episode's step and counters; a canceled episode's rows are
        still written (its worker holds the claim until it stops), then it stops."""
        if EPISODE.renew(self.episode.id, self.claim_token, **live):
            return
        canceled = job_heartbeat(
            model=Episode,
            pk=self.episode.id,
            token=self.claim_token,
            working=Episode.Status.CANCELED,
            **live,
        )
        if not canceled:
            raise ClaimLost(f"episode {self.episode.id} was claimed by another worker")
        self._canceled = True

    def _canceled_here(self) -> bool:
        return Episode.objects.filter(
            id=self.episode.id, claim_token=self.claim_token, status=Episode.Status.CANCELED
        ).exists()
