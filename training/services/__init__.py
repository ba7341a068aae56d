"""Writes for training jobs: create, submit (idempotent), poll, cancel.

Submission is one task that is safe to run twice. It claims the job with a conditional
UPDATE and a token; every remote id is written the moment the provider returns it; a second
delivery (a retry, or a worker killed mid-way) finds those ids and carries on from there, so
it never uploads a file again nor creates a second remote job. Keys are read from the
worker's environment at the moment of the call, never stored or logged.
"""

from training.services.common import (
    Submission,
    SubmissionError,
    endpoint_target,
)
from training.services.jobs import (
    training_cancels_resend,
    training_job_cancel,
    training_job_cancel_remote,
    training_job_create,
    training_job_plan,
)
from training.services.polling import (
    training_job_poll,
    training_job_refresh,
    training_jobs_poll_active,
)
from training.services.submitting import training_job_submit

__all__ = [
    "Submission",
    "SubmissionError",
    "endpoint_target",
    "training_cancels_resend",
    "training_job_cancel",
    "training_job_cancel_remote",
    "training_job_create",
    "training_job_plan",
    "training_job_poll",
    "training_job_refresh",
    "training_job_submit",
    "training_jobs_poll_active",
]
