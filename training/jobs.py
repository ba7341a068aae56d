"""The background jobs of training, declared once (`studio.jobs`): a job's submission to its
provider (upload, create, start), and the `trl` provider's run on a train worker. Following
the remote job afterwards is the poll's (`training.tasks.training_jobs_poll`), not a claimed
job."""

from __future__ import annotations

from django.db.models import Q

from studio.jobs import JobKind, register
from training.models import LocalRun, TrainingJob

SUBMISSION = register(
    JobKind(
        name="training_submission",
        model=TrainingJob,
        task="training.tasks.training_job_submit",
        stale_setting="STUDIO_TRAINING_STALE_SECONDS",
        working=TrainingJob.Status.UPLOADING,
        # Submitted is the worker's part done: the job runs on at its provider.
        finished=TrainingJob.Status.SUBMITTED,
        # `started_at` is when the provider reports the remote job running; `finished_at`
        # when it ends there.
        stamp_start=False,
        stamp_finish=False,
        # A job whose cancel was asked for is never taken again (nor sent again).
        claimable=Q(cancel_requested=False),
        hours=3,
        # A provider that refused is tried five more times, over about eight minutes.
        retry_countdowns=(5, 15, 60, 120, 300),
    )
)

# Sent about a job whose remote side exists, through the kind's send path.
CANCEL_TASK = "training.tasks.training_job_cancel"

# A `trl` job's training, on a worker consuming the `train` queue (its task's route in
# `studio.settings`). A worker that dies mid-run leaves its claim to go stale; the requeue
# sends the run again and the next train worker resumes from its last stored checkpoint.
LOCAL_RUN = register(
    JobKind(
        name="training_local_run",
        model=LocalRun,
        task="training.tasks.training_local_run",
        stale_setting="STUDIO_TRAINING_RUN_STALE_SECONDS",
        finished=LocalRun.Status.DONE,
        # A run whose cancel was asked for is never taken again (nor sent again).
        claimable=Q(cancel_requested=False),
        hours=72,
    )
)
