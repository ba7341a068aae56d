"""Writes for rollouts: create batches, claim and record episodes, keep batch progress.

Which services module a write goes in: here, the recording lifecycle of batches and episodes
(create, enqueue, claim, run, finish, fail, requeue), from `batches` (a batch's life) and
`episodes` (an episode's, on its worker). `services_review`: a reviewer's marks on recorded
turns (flags, notes, relabels), which never change what was played. `services_play`: a
person's game, key by key. `services_fork`: a new episode from another's prefix. Those three
call this one to record; this one calls back only to replay a fork.
"""

from __future__ import annotations

from rollouts.recording.batches import (
    EPISODE_ENDED,
    EPISODES,
    Progress,
    batch_cancel,
    batch_create,
    batch_enqueue,
    batch_episodes_still_playing,
    batch_play_inline,
    batch_resume,
    batch_run_inline,
)
from rollouts.recording.episodes import (
    RESUME_REQUESTED,
    SENT_FIELDS,
    _episode_claim,
    batch_closed,
    batch_fail,
    batch_settings,
    episode_claim,
    episode_fail,
    episode_finish,
    episode_run,
    policy_calls_model,
)

__all__ = [
    "EPISODES",
    "EPISODE_ENDED",
    "RESUME_REQUESTED",
    "SENT_FIELDS",
    "Progress",
    "_episode_claim",
    "batch_cancel",
    "batch_closed",
    "batch_create",
    "batch_enqueue",
    "batch_episodes_still_playing",
    "batch_fail",
    "batch_play_inline",
    "batch_resume",
    "batch_run_inline",
    "batch_settings",
    "episode_claim",
    "episode_fail",
    "episode_finish",
    "episode_run",
    "policy_calls_model",
]
