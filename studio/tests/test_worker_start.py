"""What a `celery worker` process does before its first task."""

from __future__ import annotations

import json

from studio.testing import run_python, subprocess_env

# Starts as a worker process does (Django, the tasks of every app), then says it is ready.
_READY = """
import gc, json, sys, django
django.setup()
from celery import signals
from studio.celery import app
app.loader.import_default_modules()
from rollouts.game import crafter_env, crafter_views
if sys.argv[1:] == ["--break-the-game"]:
    def broken():
        raise RuntimeError("no textures")
    crafter_env.warm_up = broken
gc.collect()
tracked = len(gc.get_objects())
signals.worker_ready.send(sender=None)
print(json.dumps({
    "tracked_before": tracked,
    "frozen": gc.get_freeze_count(),
    "tracked_after": len(gc.get_objects()),
    "textures_loaded": crafter_views.shared_textures.cache_info().currsize,
}))
"""


def test_a_ready_worker_has_built_the_game_and_left_it_out_of_garbage_collections():
    """Everything built to start lives as long as the worker: frozen, no full collection
    walks it again (each would hold the GIL for as long as it walks)."""
    seen = _ready()
    assert seen["textures_loaded"] == 1
    # All that was tracked before, and the game built since, is frozen; next to nothing is
    # left for the collector.
    assert seen["frozen"] > seen["tracked_before"] > 100_000
    assert seen["tracked_after"] < 1_000


def test_a_worker_that_cannot_build_the_game_still_starts_and_freezes():
    seen = _ready("--break-the-game")
    assert seen["textures_loaded"] == 0
    assert seen["frozen"] >= seen["tracked_before"] > 100_000
    assert seen["tracked_after"] < 1_000


def _ready(*args: str) -> dict:
    done = run_python("-c", _READY, *args, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
