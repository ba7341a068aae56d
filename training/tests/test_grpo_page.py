"""A GRPO job on the pages: the job list, and the job page's "Reinforcement learning" card
with its iterations' table and charts, from GrpoIteration rows written here with literal
values; on PostgreSQL and on `make demo`'s settings (SQLite, DEBUG=1: the last test runs the
first again in a child process). Then Evaluate, whose held-out seeds are those the job never
played."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from evaluation.selectors_training import job_held_out_plan
from evaluation.services import evaluation_batch_create
from rollouts.models import Episode, RolloutBatch
from rollouts.tests.helpers import seed_episode
from studio.testing import pytest_on_demo_settings
from training import selectors, services
from training.charts import RewardPoint, reward_chart, update_chart
from training.models import GrpoIteration, TrainingJob
from training.submission import submission_build

GRPO_TOML = Path(__file__).resolve().parents[1] / "configs" / "crafter_vlm_grpo.toml"


def grpo_job() -> TrainingJob:
    submission = submission_build(config_text=GRPO_TOML.read_text(), provider="trl")
    return services.training_job_create(submission=submission, enqueue=False)


def iteration(job: TrainingJob, number: int, *, seeds: tuple[int, ...], **values):
    """An iteration as the train worker leaves it: its batch (named as the worker names it)
    with one finished episode a seed, and the row with `values`."""
    batch = RolloutBatch.objects.create(
        policy="openai",
        model=job.model,
        name=f"GRPO job {job.id}, iteration {number}",
        seeds=list(seeds),
        step_limit=32,
        status="finished",
    )
    Episode.objects.bulk_create(Episode(batch=batch, seed=s, status="finished") for s in seeds)
    return GrpoIteration.objects.create(
        job=job,
        number=number,
        batch=batch,
        seeds=list(seeds),
        group_size=4,
        reward="crafter",
        **values,
    )


def three_iterations(job: TrainingJob) -> list[GrpoIteration]:
    return [
        iteration(
            job,
            1,
            seeds=(0, 1),
            status="complete",
            episodes=8,
            reward_mean=0.5,
            reward_low=0.0,
            reward_high=1.0,
            score=2.5,
            loss=0.4,
            kl=0.01,
            success_rates={"collect_wood": 75.0, "place_table": 12.5, "<b>wake_up</b>": 50.0},
        ),
        iteration(
            job,
            2,
            seeds=(2, 3),
            status="complete",
            episodes=8,
            reward_mean=1.0,
            reward_low=0.5,
            reward_high=1.5,
            score=5.25,
            loss=0.2,
            kl=0.02,
            success_rates={"collect_wood": 100.0},
        ),
        iteration(
            job,
            3,
            seeds=(4, 5),
            status="playing",
            episodes=8,
            reward_mean=2.0,
            reward_low=1.0,
            reward_high=3.0,
            kl=0.03,
        ),
    ]


@pytest.mark.django_db
def test_the_job_page_shows_each_iteration_and_draws_the_reward(client, viewer):
    job = grpo_job()
    first, _, _ = three_iterations(job)
    client.force_login(viewer)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert "Reinforcement learning" in page
    assert "— (GRPO: its own episodes)" in page
    assert "a GRPO job is measured on the episodes it plays" in page
    # The settings as the sample config writes them, and the reward in words.
    assert '<code id="grpo-reward">crafter</code>' in page
    assert "+1 for each achievement&#x27;s first unlock" in page
    assert '<dd id="grpo-group-size">4 ' in page
    assert '<dd id="grpo-seeds">2</dd>' in page and '<dd id="grpo-steps">32</dd>' in page
    assert '<dd id="grpo-iterations">2 done of 10</dd>' in page
    # Each iteration: its batch, its reward with the interval, score, rates, loss, KL, status.
    assert f'href="/rollouts/{first.batch_id}/">batch #{first.batch_id}</a>' in page
    assert '0.500 <span class="muted small">[0.000, 1.000]</span>' in page
    assert '2.000 <span class="muted small">[1.000, 3.000]</span>' in page
    assert "2.50%" in page and "5.25%" in page
    # The highest rates first, a name from the row escaped.
    assert "collect_wood 75%, &lt;b&gt;wake_up&lt;/b&gt; 50%, place_table 13%" in page
    assert "<b>wake_up" not in page
    assert "0.4000" in page and "0.0300" in page
    assert '<span class="badge status-playing">playing</span>' in page
    # The chart: the means as a line, the interval as a band (hand-computed below).
    assert 'id="grpo-reward-chart"' in page
    assert 'points="24.0,167.3 320.0,138.7 616.0,81.3"' in page
    assert 'id="grpo-update-chart"' in page
    assert "loss 0.2000 to 0.4000" in page and "KL 0.0100 to 0.0300" in page

    listing = client.get("/training/").content.decode()
    assert f'data-job="{job.id}"' in listing
    assert "— (GRPO: its own episodes)" in listing


def test_the_reward_chart_is_a_line_in_a_band_of_its_interval():
    # 640 x 220, a margin of 24: iterations 1..3 at x 24, 320, 616; rewards 0..3 from y 196
    # up to y 24, so y = 196 - 172 * reward / 3.
    chart = reward_chart(
        [
            RewardPoint(1, 0.5, 0.0, 1.0),
            RewardPoint(2, 1.0, 0.5, 1.5),
            RewardPoint(3, 2.0, 1.0, 3.0),
        ]
    )
    assert chart.mean_points == "24.0,167.3 320.0,138.7 616.0,81.3"
    # The highs left to right, then the lows right to left.
    assert chart.band_points == (
        "24.0,138.7 320.0,110.0 616.0,24.0 616.0,138.7 320.0,167.3 24.0,196.0"
    )
    assert (chart.iterations, chart.rewards, chart.count) == ((1, 3), (0.0, 3.0), 3)
    # No finite mean: not drawn; one point alone sits in the middle (x 320, y 110), its band
    # the point itself.
    alone = reward_chart([RewardPoint(4, 1.0), RewardPoint(5, float("nan"))])
    assert (alone.mean_points, alone.band_points) == ("320.0,110.0", "320.0,110.0 320.0,110.0")
    assert alone.count == 1
    assert reward_chart([RewardPoint(1, float("inf"))]).empty


def test_the_update_chart_scales_loss_and_kl_each_on_its_own():
    # 640 x 140: y from 116 (lowest) up to 24 (highest) for each series.
    chart = update_chart([(1, 0.4, 0.01), (2, 0.2, 0.02), (3, None, 0.03)])
    assert chart.loss_points == "24.0,24.0 320.0,116.0"
    assert chart.kl_points == "24.0,116.0 320.0,70.0 616.0,24.0"
    assert (chart.losses, chart.kls, chart.iterations) == ((0.2, 0.4), (0.01, 0.03), (1, 3))
    assert update_chart([(1, None, None)]).empty


@pytest.mark.django_db
def test_a_grpo_job_without_iterations_says_so(client, viewer):
    job = grpo_job()
    client.force_login(viewer)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert 'id="grpo-none"' in page and "0 done of 10" in page
    assert "grpo-reward-chart" not in page

    # A reward the trainer does not know, as stored: shown escaped, with why in words.
    config = {**job.effective_config, "training.grpo": {"reward": "<img src=x>"}}
    TrainingJob.objects.filter(id=job.id).update(effective_config=config)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert '<code id="grpo-reward">&lt;img src=x&gt;</code>' in page
    assert "not a reward the trainer knows: &#x27;&lt;img src=x&gt;&#x27; is not a reward" in page
    assert "<img src=x>" not in page
    assert '<dd id="grpo-iterations">0 done of —</dd>' in page


@pytest.mark.django_db
def test_the_page_shows_the_newest_iterations_only():
    job = grpo_job()
    three_iterations(job)
    shown = selectors.job_grpo(job=job, limit=2)
    assert [row.iteration.number for row in shown.rows] == [2, 3]
    assert shown.earlier == 1


@pytest.mark.django_db
def test_evaluate_holds_out_the_seeds_the_job_played(client, editor, chat_endpoint):
    job = grpo_job()
    three_iterations(job)
    TrainingJob.objects.filter(id=job.id).update(
        status="succeeded", remote_job_id="run-1", fine_tuned_model="grpo-1"
    )
    job.refresh_from_db()
    # Seeds 0-5 were played by its iterations: the first held out are 6, 7, 8.
    assert job_held_out_plan(job=job, count=3).seeds == [6, 7, 8]
    client.force_login(editor)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert "on the smallest seeds no episode of this GRPO job played" in page
    # The batch Evaluate starts, with the job's row locked alone (it has no dataset to join).
    batch, created = evaluation_batch_create(
        job=job, endpoint=chat_endpoint, count=3, steps=5, enqueue=False
    )
    assert created and batch.seeds == [6, 7, 8] and batch.model == "grpo-1"


def test_the_page_on_the_demos_sqlite(tmp_path):
    """The first test again in a child pytest on `make demo`'s settings."""
    if connection.vendor == "sqlite":
        pytest.skip("this is the run it starts")
    test = f"{Path(__file__)}::test_the_job_page_shows_each_iteration_and_draws_the_reward"
    result = pytest_on_demo_settings(tmp_path, test)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout, result.stdout[-2000:]


@pytest.mark.django_db
def test_the_admin_shows_iterations_and_never_edits_them(admin_client):
    job = grpo_job()
    first, _, _ = three_iterations(job)
    listing = admin_client.get("/admin/training/grpoiteration/")
    assert listing.status_code == 200
    assert f"Iteration 1 of job {job.id} (complete)" in listing.content.decode()
    assert admin_client.get("/admin/training/grpoiteration/add/").status_code == 403
    change = admin_client.get(f"/admin/training/grpoiteration/{first.id}/change/").content
    assert b'name="reward_mean"' not in change  # shown as text, not as a field to edit
    episodes = admin_client.get("/admin/rollouts/episode/").content.decode()
    assert "column-rl_reward" in episodes
    seed_episode(turns=1, observation="o", model_text="t")
    turns = admin_client.get("/admin/rollouts/turn/").content.decode()
    assert "column-advantage" in turns
