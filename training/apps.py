from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"

    def ready(self) -> None:
        # Registers the job kind with the periodic requeue.
        # Registers the providers, and with them their endpoint kinds in studio's list.
        from training import (
            jobs,  # noqa: F401
            providers,  # noqa: F401
        )

        # Registered here, after `providers`' own list: its client reads the models.
        from training.providers import trl  # noqa: F401
