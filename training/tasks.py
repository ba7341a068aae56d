"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from studio.jobs import is_outage, outage_said_in_one_line, retry_after_outage
from training import services

# Countdowns stay far below the broker's visibility timeout (2 h): a delayed message is
# never delivered a second time just for waiting.
RETRY_COUNTDOWNS = (5, 15, 60, 120, 300)


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=3 * 3600,
    time_limit=3 * 3600 + 120,
    max_retries=len(RETRY_COUNTDOWNS),
)
def training_job_submit(self, job_id: int, outages: int = 0) -> str:
    # Tries after an outage of our own database or broker (`outages` of them) are not the
    # provider's: they count against no provider retry.
    provider_retries = self.request.retries - outages
    last = provider_retries >= len(RETRY_COUNTDOWNS)
    try:
        outcome = services.training_job_submit(job_id=job_id, last_attempt=last)
    except Exception as exc:
        if not is_outage(exc):
            raise
        raise retry_after_outage(self, exc, kwargs={"outages": outages + 1}) from exc
    if outcome == "retry":
        # The provider answered 429/5xx or could not be reached after the client's retries.
        countdown = RETRY_COUNTDOWNS[min(provider_retries, len(RETRY_COUNTDOWNS) - 1)]
        raise self.retry(
            countdown=countdown,
            kwargs={"outages": outages},
            max_retries=len(RETRY_COUNTDOWNS) + outages,
        )
    return outcome


@shared_task(acks_late=True, time_limit=600)
def training_jobs_poll() -> int:
    # Beat follows training here (submissions are re-sent by `studio.tasks.jobs_requeue`),
    # and sends again the cancels that never reached the provider.
    with outage_said_in_one_line("training.tasks.training_jobs_poll"):
        services.training_cancels_resend()
        return services.training_jobs_poll_active()
    return 0


@shared_task(acks_late=True, time_limit=600)
def training_job_cancel(job_id: int, token: str = "") -> str:
    # Never retried by a countdown of its own: a provider that was down is tried again by the
    # beat task once the back-off the row holds has passed, so one cancel is under way.
    return services.training_job_cancel_remote(job_id=job_id, token=token)
