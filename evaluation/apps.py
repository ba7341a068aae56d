from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "evaluation"

    def ready(self) -> None:
        # Rollouts says when a batch has closed; evaluation warms its leaderboard then.
        from evaluation.tasks import warm_after_a_batch
        from rollouts.recording.services import batch_closed

        batch_closed.connect(warm_after_a_batch, dispatch_uid="evaluation-statistics-warm")
