"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from studio.jobs import JobOutcome, job_task, outage_said_in_one_line
from training import local_run_worker, services
from training.jobs import LOCAL_RUN, SUBMISSION


@job_task(SUBMISSION)
def training_job_submit(job_id: int, *, last_attempt: bool) -> JobOutcome:
    # A provider that refused (429, 5xx, unreachable) is tried again after the kind's
    # countdowns (`training.jobs.SUBMISSION`); its last try fails the job instead.
    return services.training_job_submit(job_id=job_id, last_attempt=last_attempt)


@job_task(LOCAL_RUN)
def training_local_run(run_id: int) -> JobOutcome:
    # Routed to the `train` queue: only a worker with the `.[train]` extra should take it.
    return local_run_worker.local_run_work(run_id=run_id)


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
