"""Best-of-N filters over the samples of each seed, on hand-made groups."""

from __future__ import annotations

import pytest

from curation.export_options import ExportOptions
from curation.groups import group_table
from curation.selectors import dataset_counts
from curation.tests.conftest import record, run
from rollouts.models import Episode
from rollouts.review.turn_selection import FilterError, TurnSelection, turns_selected

pytestmark = pytest.mark.django_db

# seed 5: (unique achievements, reward) per sample, set by hand
GROUP_5 = {0: (2, 1.9), 1: (3, 2.8), 2: (2, 2.1), 3: (3, 2.8)}
# seed 6: every sample alike; 0.1 * 3 / 3 is not exactly 0.1 in floating point
GROUP_6 = {0: (1, 0.1), 1: (1, 0.1), 2: (1, 0.1), 3: (1, 0.1)}


@pytest.fixture
def groups():
    batch = record(seeds=(5, 6), samples_per_seed=4, steps=4)
    for seed, table in ((5, GROUP_5), (6, GROUP_6)):
        for sample, (count, reward) in table.items():
            Episode.objects.filter(batch=batch, seed=seed, sample=sample).update(
                achievement_count=count, total_reward=reward
            )
    return batch


def kept(filters: TurnSelection) -> set[tuple[int, int]]:
    ids = turns_selected(filters).values_list("episode_id", flat=True).distinct()
    return set(Episode.objects.filter(id__in=ids).values_list("seed", "sample"))


def test_top_n_per_seed_ranks_by_achievements_then_reward_ties_by_sample(groups):
    top = lambda n: kept(TurnSelection(batches=(groups.id,), top_per_seed=n))  # noqa: E731
    # seed 5: samples 1 and 3 tie on (3, 2.8): the earlier sample ranks first
    assert top(1) == {(5, 1), (6, 0)}
    assert top(2) == {(5, 1), (5, 3), (6, 0), (6, 1)}
    assert top(3) == {(5, 1), (5, 3), (5, 2), (6, 0), (6, 1), (6, 2)}
    assert len(top(10)) == 8


def test_at_or_above_the_mean_keeps_reward_ties_with_the_mean(groups):
    # seed 5: mean reward 2.4, so samples 1 and 3; seed 6: all equal the mean
    mean = TurnSelection(batches=(groups.id,), at_or_above_mean=True)
    assert kept(mean) == {(5, 1), (5, 3), (6, 0), (6, 1), (6, 2), (6, 3)}
    both = TurnSelection(batches=(groups.id,), at_or_above_mean=True, top_per_seed=1)
    assert kept(both) == {(5, 1), (6, 0)}


def test_other_filters_apply_after_the_ranking(groups):
    # min reward 2.0 removes nothing that the ranking keeps first; sample 2 never moves up
    filters = TurnSelection(batches=(groups.id,), top_per_seed=1, min_reward=2.0)
    assert kept(filters) == {(5, 1)}


def test_live_counts_and_the_group_table_show_what_each_group_keeps(groups):
    filters = TurnSelection(batches=(groups.id,), top_per_seed=2)
    counts = dataset_counts(filters=filters, options=ExportOptions())
    assert counts["episodes"] == 4 and counts["turns"] == 16
    table = group_table(filters)
    assert table["total_groups"] == 2 and table["kept_episodes"] == 4
    first = table["groups"][0]
    assert first["seed"] == 5 and first["kept"] == 2
    assert [(e["sample"], e["kept"]) for e in first["episodes"]] == [
        (1, True), (3, True), (2, False), (0, False)
    ]  # fmt: skip
    assert first["mean_reward"] == pytest.approx(2.4)


def test_the_command_takes_the_group_flags(groups, tmp_path):
    out = run(
        "export_jsonl", "--output", str(tmp_path / "best.jsonl"), "--batch", str(groups.id),
        "--top-per-seed", "1",
    )  # fmt: skip
    assert out.code == 0, out.stderr
    assert out.summary["episodes"] == 2 and out.summary["rows"] == 8
    bad = run("export_jsonl", "--output", str(tmp_path / "x.jsonl"), "--top-per-seed", "0")
    assert bad.code == 2 and "top-per-seed: 0 is not between 1 and 1000" in bad.stderr


def test_it_refuses_a_bad_top_n():
    with pytest.raises(FilterError, match="top-per-seed"):
        TurnSelection(top_per_seed=0)


def test_the_live_counts_page_shows_each_groups_kept_samples(groups, editor_client):
    from django.urls import reverse

    page = editor_client.get(
        reverse("datasets:dataset_counts"),
        {"name": "x", "batches": [groups.id], "flagged": "any", "format": "studio",
         "kind": "sft", "top_per_seed": "1"},
    )  # fmt: skip
    html = page.content.decode()
    assert 'data-count="episodes">2<' in html
    assert 'data-count="kept-episodes">2<' in html
    seed5 = html[html.index('data-seed="5"') :].split("</tr>")[0]
    assert seed5.count("kept") == 1 and "s1 3/2.8" in seed5 and seed5.count("dropped") == 3
