"""`make demo`: a superuser `demo` and four scripted episodes to look at. Safe to run again."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth.models import User

from rollouts.models import RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.commands import StudioCommand
from studio.endpoints import endpoint_described
from studio.models import Endpoint

DEMO_BATCH_NAME = "Demo: scripted baseline"
DEMO_ENDPOINT_NAME = "local"
DEMO_ENDPOINT_URL = os.environ.get("DEMO_MODEL_URL", "http://127.0.0.1:11434/v1")


class Command(StudioCommand):
    help = "Create the demo superuser and record four seeded scripted episodes."

    def handle(self, *args: Any, **options: Any) -> None:
        given = os.environ.get("DEMO_PASSWORD", "")
        user = User.objects.filter(username="demo").first()
        if user is None:
            password = given or secrets.token_urlsafe(12)
            user = User.objects.create_superuser("demo", password=password)
            shown = "(from DEMO_PASSWORD)" if given else f"{password}  (shown once)"
            self.stdout.write(f"Created superuser demo, password: {shown}")
        elif given:
            user.set_password(given)
            user.save(update_fields=["password"])
            self.stdout.write("Superuser demo exists; its password is now DEMO_PASSWORD.")
        else:
            self.stdout.write(
                "Superuser demo exists; to set its password: DEMO_PASSWORD=... make demo"
            )
        # Something to pick in the batch form's endpoint list: a model server on this machine
        # (Ollama's address; vLLM is usually :8000, which the studio takes). Edit it under
        # /admin/; its key, if any, comes from the variable named there, never the database.
        endpoint, created = Endpoint.objects.get_or_create(
            name=DEMO_ENDPOINT_NAME,
            defaults={"kind": Endpoint.Kind.CHAT, "base_url": DEMO_ENDPOINT_URL},
        )
        if created:
            self.stdout.write(f"Created model endpoint {endpoint.name} ({endpoint.base_url})")
        # Where the batch and probe forms can send calls, said at every start: an endpoint
        # the environment named (`OPENAI_API_KEY`: OpenAI itself) bills what it is sent.
        self.stdout.write(
            "Model endpoints: "
            + "; ".join(endpoint_described(e) for e in Endpoint.objects.order_by("name"))
        )
        if RolloutBatch.objects.filter(name=DEMO_BATCH_NAME).exists():
            return
        settings = RolloutSettings(policy="scripted", seeds=(0, 1, 2, 3), name=DEMO_BATCH_NAME)
        services.batch_run_inline(settings=settings, created_by=user)
        self.stdout.write(f"Recorded {len(settings.seeds)} demo episodes (seeds 0-3).")
