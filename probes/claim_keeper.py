"""This process's hold on the probe chunks it asks (`studio.claim_keeper`): a question's call
may take longer than a chunk's claim stays fresh, so the claims are renewed whatever the calls
do, and a chunk goes stale only when its worker is gone (its answered questions are never
asked again)."""

from __future__ import annotations

from probes.jobs import PROBE_CHUNK
from studio.claim_keeper import ClaimKeeper, worker_name

KEEPER = ClaimKeeper(PROBE_CHUNK)
keep = KEEPER.keep
let_go = KEEPER.let_go
renew = KEEPER.renew

__all__ = ["KEEPER", "keep", "let_go", "renew", "worker_name"]
