from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"

    def ready(self) -> None:
        # Registers the job kind with the periodic requeue.
        from training import jobs  # noqa: F401
