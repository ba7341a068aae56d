"""compare_batches, /compare/ and the seed page on batches really played."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.game.scoring import crafter_score
from rollouts.models import Episode, RolloutBatch
from rollouts.tests.helpers import record_batch
from studio.testing import manage, subprocess_env

pytestmark = pytest.mark.django_db


def _rates_by_hand(batch: RolloutBatch, seeds: set[int]) -> dict[str, float]:
    """Percent of the batch's finished episodes on `seeds` with each achievement."""
    episodes = [e for e in batch.episodes.all() if e.seed in seeds and e.status == "finished"]
    return {
        name: 100.0 * sum(name in e.achievements for e in episodes) / len(episodes)
        for name in ACHIEVEMENTS
    }


@pytest.fixture
def two_batches() -> tuple[RolloutBatch, RolloutBatch]:
    scripted = record_batch(policy="scripted", seeds=(0, 1, 2), steps=60, name="scripted")
    rand = record_batch(policy="random", seeds=(1, 2, 3), steps=60, name="random")
    return scripted, rand


def _compare_json(capsys, *ids: int) -> dict:
    call_command("compare_batches", *[str(i) for i in ids], "--json")
    return json.loads(capsys.readouterr().out)


def test_it_compares_only_the_shared_seeds(capsys, two_batches):
    scripted, rand = two_batches
    data = _compare_json(capsys, scripted.id, rand.id)
    assert data["shared_seeds"] == [1, 2]
    first, second = data["batches"]
    assert (first["id"], second["id"]) == (scripted.id, rand.id)
    assert first["episodes"] == second["episodes"] == 2
    assert first["failed"] == second["failed"] == 0
    assert first["left_out_seeds"] == [0] and second["left_out_seeds"] == [3]
    for batch, report in ((scripted, first), (rand, second)):
        expected = _rates_by_hand(batch, {1, 2})
        assert report["success_rates"] == pytest.approx(expected, abs=0.005)
        assert report["crafter_score"] == pytest.approx(crafter_score(expected), abs=0.005)
        low, high = report["score_interval"]
        assert low <= report["crafter_score"] <= high
    (difference,) = data["differences"]
    assert difference["id"] == rand.id and difference["against"] == scripted.id
    assert difference["paired_seeds"] == 2
    assert difference["score"] == pytest.approx(
        second["crafter_score"] - first["crafter_score"], abs=0.011
    )
    for name in ACHIEVEMENTS:
        assert difference["success_rates"][name] == pytest.approx(
            second["success_rates"][name] - first["success_rates"][name], abs=0.011
        )
    assert set(difference) >= {"score", "score_interval", "success_rates"}


def test_two_batches_playing_the_same_games_differ_by_exactly_zero(capsys):
    # The scripted policy and the fixed world make the same game twice.
    one = record_batch(policy="scripted", seeds=(4, 5), steps=50)
    two = record_batch(policy="scripted", seeds=(4, 5), steps=50)
    (difference,) = _compare_json(capsys, one.id, two.id)["differences"]
    assert difference["score"] == 0.0
    assert difference["score_interval"] == [0.0, 0.0]
    assert set(difference["success_rates"].values()) == {0.0}
    assert difference["seeds_won"] == {"base": 0, "other": 0, "tie": 2}


def test_failed_episodes_are_counted_not_dropped(capsys, two_batches):
    scripted, rand = two_batches
    Episode.objects.filter(batch=rand, seed=2).update(status="failed", error="worker died")
    data = _compare_json(capsys, scripted.id, rand.id)
    assert data["shared_seeds"] == [1, 2]
    assert data["batches"][1]["episodes"] == 2
    assert data["batches"][1]["failed"] == 1
    (difference,) = data["differences"]
    assert difference["paired_seeds"] == 1
    assert difference["unpaired_seeds"] == [{"seed": 2, "no_finished_episode_in": "other"}]


def test_it_prints_a_table(capsys, two_batches):
    scripted, rand = two_batches
    call_command("compare_batches", str(scripted.id), str(rand.id))
    out = capsys.readouterr().out
    assert out.startswith("2 shared seeds")
    assert "Crafter score" in out and "collect_wood" in out
    assert f"{rand.id}-{scripted.id}" in out


def test_batches_sharing_no_seed_exit_2_with_one_line(transactional_db):
    one = RolloutBatch.objects.create(policy="scripted", seeds=[1])
    two = RolloutBatch.objects.create(policy="scripted", seeds=[2])
    Episode.objects.create(batch=one, seed=1, status="finished")
    Episode.objects.create(batch=two, seed=2, status="finished")
    env = subprocess_env()
    result = manage("compare_batches", str(one.id), str(two.id), "--json", env=env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert (
        result.stderr.strip()
        == f"compare_batches: error: batches {one.id} and {two.id} share no seed"
    )
    result = manage("compare_batches", str(one.id), "999999", env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == "compare_batches: error: there is no batch 999999"
    result = manage("compare_batches", str(one.id), env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == "compare_batches: error: compare at least two batches"


def test_the_page_shows_the_table_chart_and_seed_links(viewer_client, two_batches):
    scripted, rand = two_batches
    response = viewer_client.get(f"/compare/?batches={scripted.id},{rand.id}")
    assert response.status_code == 200
    html = response.content.decode()
    assert "2 shared seeds" in html
    assert "Left out of #" in html and "(0)" in html and "(3)" in html
    assert 'id="summary-table"' in html and "<svg" in html
    assert (
        reverse("evaluation:compare_seed", args=[1]) + f"?batches={scripted.id},{rand.id}" in html
    )
    seed_one = Episode.objects.get(batch=rand, seed=1)
    assert reverse("rollouts:episode_detail", args=[seed_one.id]) in html


def test_the_batch_lists_checkboxes_compare_oldest_first(viewer_client, two_batches):
    scripted, rand = two_batches
    listing = viewer_client.get("/rollouts/").content.decode()
    assert f'name="batches" value="{scripted.id}"' in listing
    assert 'id="compare-form"' in listing
    # Checkboxes submit newest first; the baseline is the oldest.
    response = viewer_client.get(f"/compare/?batches={rand.id}&batches={scripted.id}&format=json")
    assert [b["id"] for b in response.json()["batches"]] == [scripted.id, rand.id]


def test_it_downloads_csv_and_json(viewer_client, capsys, two_batches):
    scripted, rand = two_batches
    query = f"batches={scripted.id},{rand.id}"
    as_json = viewer_client.get(f"/compare/?{query}&format=json")
    assert as_json["Content-Disposition"].startswith("attachment")
    assert as_json.json() == _compare_json(capsys, scripted.id, rand.id)
    as_csv = viewer_client.get(f"/compare/?{query}&format=csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.content.decode())))
    score_rows = {(r["kind"], r["batch"]): r for r in rows if r["metric"] == "crafter_score"}
    data = as_json.json()
    assert (
        float(score_rows[("difference", str(rand.id))]["value"]) == data["differences"][0]["score"]
    )
    assert (
        float(score_rows[("batch", str(scripted.id))]["low"])
        == data["batches"][0]["score_interval"][0]
    )
    bad = viewer_client.get(f"/compare/?batches={scripted.id}&format=json")
    assert bad.status_code == 400 and bad.json() == {"error": "compare at least two batches"}


def test_pages_render_for_empty_and_failed_batches(viewer_client, two_batches):
    scripted, _ = two_batches
    empty = RolloutBatch.objects.create(policy="scripted", seeds=[1], name="never ran")
    response = viewer_client.get(f"/compare/?batches={scripted.id},{empty.id}")
    assert response.status_code == 200
    assert f"batches {scripted.id} and {empty.id} share no seed" in response.content.decode()
    failed = RolloutBatch.objects.create(policy="scripted", seeds=[1, 2], status="failed")
    for seed in (1, 2):
        Episode.objects.create(batch=failed, seed=seed, status="failed", error="boom")
    response = viewer_client.get(f"/compare/?batches={scripted.id},{failed.id}")
    html = response.content.decode()
    assert response.status_code == 200
    assert "Not paired for" in html and "2 seeds" in html
    assert viewer_client.get("/compare/").status_code == 200
    assert viewer_client.get("/compare/?batches=1,x").status_code == 200
    seed_page = viewer_client.get(f"/compare/seed/1/?batches={scripted.id},{failed.id},{empty.id}")
    assert seed_page.status_code == 200
    assert "has no episode on seed 1" in seed_page.content.decode()
    huge = viewer_client.get(f"/compare/seed/{10**30}/?batches={scripted.id}")
    assert huge.status_code == 200 and "is not between 0 and" in huge.content.decode()


def test_the_seed_page_puts_each_batchs_episode_side_by_side(viewer_client, two_batches):
    scripted, rand = two_batches
    response = viewer_client.get(f"/compare/seed/2/?batches={scripted.id},{rand.id}&step=5")
    assert response.status_code == 200
    config = response.context["config"]
    assert config["step"] == 5
    columns = config["columns"]
    for batch, column in zip((scripted, rand), columns, strict=True):
        episode = Episode.objects.get(batch=batch, seed=2)
        assert column["episode"] == episode.id
        frames = list(episode.frames.order_by("step").values_list("sha256", flat=True))
        assert column["frames"] == frames and len(frames) == episode.steps + 1
        assert column["turnSteps"] == list(range(episode.steps))


def test_the_page_costs_the_same_queries_whatever_the_batch_size(
    viewer_client, django_assert_max_num_queries
):
    small = [RolloutBatch.objects.create(policy="scripted", seeds=[]) for _ in range(2)]
    large = [RolloutBatch.objects.create(policy="scripted", seeds=[]) for _ in range(2)]
    for batches, count in ((small, 3), (large, 60)):
        Episode.objects.bulk_create(
            Episode(batch=b, seed=s, status="finished", achievements={"collect_wood": 3})
            for b in batches
            for s in range(count)
        )
    counts = []
    for batches in (small, large):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            response = viewer_client.get(f"/compare/?batches={batches[0].id},{batches[1].id}")
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]
    with django_assert_max_num_queries(8):
        viewer_client.get(f"/compare/?batches={large[0].id},{large[1].id}")
