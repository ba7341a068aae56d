"""This process's hold on the episodes it plays (`studio.claim_keeper`): a keeper renews their
claims every third of STUDIO_EPISODE_STALE_SECONDS, however long a model call takes, and a
worker that starts under the name of one that held running episodes takes them over at once,
dating when their worker was found gone (the batch page says so).
"""

from __future__ import annotations

from django.utils import timezone

from rollouts.jobs import EPISODE
from studio.claim_keeper import ClaimKeeper, worker_name

KEEPER = ClaimKeeper(EPISODE, lost_worker_at=timezone.now)
keep = KEEPER.keep
let_go = KEEPER.let_go
renew = KEEPER.renew
take_over = KEEPER.take_over

__all__ = ["KEEPER", "keep", "let_go", "renew", "take_over", "worker_name"]
