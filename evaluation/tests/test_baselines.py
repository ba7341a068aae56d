"""The comparison of a fine-tuned model's evaluation with its base batch: offered once the base
batch has ended, its progress until then (the job page and the batch page); a comparison of a
batch still playing says so."""

from __future__ import annotations

import pytest

from evaluation.baselines import batch_evaluation
from evaluation.selectors_training import job_evaluations
from rollouts.models import Episode, RolloutBatch
from training.models import TrainingJob
from training.tests.test_evaluate import BASE, FINE_TUNED, _job

pytestmark = pytest.mark.django_db

SEEDS = [1, 3, 4, 5, 6, 7]


def evaluation_batch(*, job: TrainingJob, model: str, ended: int) -> RolloutBatch:
    """A batch of `job`'s Evaluate on SEEDS whose first `ended` episodes have finished (the
    others still to play), as the recorder leaves its rows."""
    done = ended == len(SEEDS)
    batch = RolloutBatch.objects.create(
        policy="openai",
        model=model,
        seeds=SEEDS,
        step_limit=3,
        status="finished" if done else "running",
        settings={"observation_mode": "image_text", "history_frames": 0},
        evaluates=job,
        episodes_total=len(SEEDS),
        episodes_finished=ended,
    )
    Episode.objects.bulk_create(
        Episode(
            batch=batch,
            seed=seed,
            status="finished" if i < ended else "pending",
            achievements={"collect_wood": 1} if i < ended else {},
        )
        for i, seed in enumerate(SEEDS)
    )
    return batch


def end(batch: RolloutBatch) -> None:
    batch.episodes.update(status="finished", achievements={"collect_wood": 1})
    RolloutBatch.objects.filter(id=batch.id).update(status="finished", episodes_finished=len(SEEDS))


def test_a_base_batch_still_playing_shows_its_progress_not_the_comparison(viewer_client):
    job = _job(seeds=(0, 2))
    tuned = evaluation_batch(job=job, model=FINE_TUNED, ended=6)
    base = evaluation_batch(job=job, model=BASE, ended=2)

    rows = {row.role: row for row in job_evaluations(job=job)}
    assert rows["fine-tuned"].baseline == base and rows["fine-tuned"].compare_url == ""
    assert rows["fine-tuned"].waits_for == base
    # Two of six episodes ended: their score, said to be so far.
    assert rows["base"].score == "0.23% so far" and rows["fine-tuned"].score == "0.23%"
    page = viewer_client.get(f"/training/{job.id}/").content.decode()
    assert "compare-link" not in page and "/compare/" not in page
    assert f'data-waits-for="{base.id}"' in page
    assert "is playing: 2 of 6 episodes ended." in page
    assert "The comparison opens when it ends." in page
    assert 'id="evaluation-batches" hx-get' in page  # the table refreshes itself meanwhile
    batch_page = viewer_client.get(f"/rollouts/{tuned.id}/").content.decode()
    assert "compare-link" not in batch_page
    assert f"#{base.id}</a> is playing (2 of 6 episodes ended)" in batch_page

    end(base)
    link = f'href="/compare/?batches={base.id},{tuned.id}"'
    page = viewer_client.get(f"/training/{job.id}/").content.decode()
    assert link in page and "data-waits-for" not in page
    assert 'id="evaluation-batches" hx-get' not in page
    assert link in viewer_client.get(f"/rollouts/{tuned.id}/").content.decode()


def test_the_comparison_of_a_batch_still_playing_says_its_numbers_are_partial(viewer_client):
    job = _job(seeds=(0, 2))
    base = evaluation_batch(job=job, model=BASE, ended=6)
    tuned = evaluation_batch(job=job, model=FINE_TUNED, ended=2)
    evaluation = batch_evaluation(batch=tuned)
    assert evaluation.compare_url == f"/compare/?batches={base.id},{tuned.id}"
    html = viewer_client.get(evaluation.compare_url).content.decode()
    assert f'data-playing="{tuned.id}"' in html and f'data-playing="{base.id}"' not in html
    assert "is still playing: 2 of 6 episodes ended" in html
    end(tuned)
    assert "data-playing" not in viewer_client.get(evaluation.compare_url).content.decode()
