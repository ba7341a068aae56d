"""`make demo`: a superuser `demo` and four scripted episodes to look at. Safe to run again."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth.models import User

from rollouts import services
from rollouts.models import Episode, RolloutBatch
from rollouts.rollout_settings import RolloutSettings
from studio.commands import StudioCommand

DEMO_BATCH_NAME = "Demo: scripted baseline"


class Command(StudioCommand):
    help = "Create the demo superuser and record four seeded scripted episodes."

    def handle(self, *args: Any, **options: Any) -> None:
        if not User.objects.filter(username="demo").exists():
            password = os.environ.get("DEMO_PASSWORD") or secrets.token_urlsafe(12)
            User.objects.create_superuser("demo", password=password)
            shown = "(from DEMO_PASSWORD)" if os.environ.get("DEMO_PASSWORD") else password
            self.stdout.write(f"Created superuser demo, password: {shown}  (shown once)")
        else:
            self.stdout.write("Superuser demo exists already.")
        if RolloutBatch.objects.filter(name=DEMO_BATCH_NAME).exists():
            return
        settings = RolloutSettings(policy="scripted", seeds=(0, 1, 2, 3), name=DEMO_BATCH_NAME)
        batch = services.batch_create(
            settings=settings, created_by=User.objects.get(username="demo"), enqueue=False
        )
        for episode in Episode.objects.filter(batch=batch).order_by("seed"):
            services.episode_run(episode_id=episode.id)
            self.stdout.write(f"Recorded seed {episode.seed}")
