"""Preference pairs: episodes of one seed that saw the same frames, then answered differently."""

from __future__ import annotations

import base64
import json

import pytest

from curation import services
from curation.export_options import ExportOptions
from curation.preferences import divergence_turn, find_pairs
from curation.tests.conftest import read_rows, record, run
from curation.tests.hf_reader import read_hf
from rollouts.models import Episode, Frame
from rollouts.recording.frame_store import FrameStore
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db

# Two scripted plays of seed 11 that take the same actions for 4 turns, then differ at turn 4:
# what a fork at turn 4 of the original looks like.
ORIGINAL = ("move_right", "move_down", "move_left", "move_up", "do")
FORKED = ("move_right", "move_down", "move_left", "move_up", "noop")


def outcome(batch, *, achievements: int, reward: float) -> Episode:
    episode = batch.episodes.get()
    Episode.objects.filter(id=episode.id).update(
        achievement_count=achievements, total_reward=reward
    )
    return episode


@pytest.fixture
def original_and_fork():
    original = record(seeds=(11,), steps=8, actions=ORIGINAL)
    fork = record(seeds=(11,), steps=8, actions=FORKED)
    return original, fork


def test_divergence_is_the_first_different_answer_on_the_same_frames():
    a = [("f0", ["x"]), ("f1", ["y"]), ("f2", ["z"])]
    assert divergence_turn(a, [("f0", ["x"]), ("f1", ["w"]), ("f9", ["z"])]) == 1
    assert divergence_turn(a, a) is None  # identical plays
    assert divergence_turn(a, [("f0", ["x"]), ("g1", ["w"])]) is None  # states differ first
    assert divergence_turn(a, [("f0", ["q"])]) == 0


def test_a_fork_and_its_original_give_one_pair_at_the_fork_turn(original_and_fork, tmp_path):
    original, fork = original_and_fork
    better = outcome(original, achievements=3, reward=2.9)
    worse = outcome(fork, achievements=1, reward=0.9)
    # Their frames are the same up to turn 4: the worlds are reproducible.
    shas = {
        e.id: list(Frame.objects.filter(episode=e).order_by("step").values_list("sha256"))
        for e in (better, worse)
    }
    assert shas[better.id][:5] == shas[worse.id][:5]
    filters = TurnSelection(batches=(original.id, fork.id))
    (pair,) = list(find_pairs(filters))
    assert pair.turn == 4
    assert (pair.chosen.episode_id, pair.rejected.episode_id) == (better.id, worse.id)

    out = run(
        "export_jsonl", "--output", str(tmp_path / "dpo.jsonl"),
        "--batch", str(original.id), str(fork.id), "--kind", "preference",
    )  # fmt: skip
    assert out.code == 0, out.stderr
    assert out.summary["rows"] == 1 and out.summary["episodes"] == 2
    (row,) = read_rows(tmp_path / "dpo.jsonl")
    assert set(row) == {"prompt", "chosen", "rejected", "images", "tools", "metadata"}
    chosen_call = row["chosen"][0]["tool_calls"][0]["function"]
    rejected_call = row["rejected"][0]["tool_calls"][0]["function"]
    assert json.loads(chosen_call["arguments"]) == {"actions": ["do"]}
    assert json.loads(rejected_call["arguments"]) == {"actions": ["noop"]}
    # The prompt is what both saw at turn 4: its one image is that frame, as a placeholder.
    (image,) = row["images"]
    frame = Frame.objects.get(episode=better, step=4)
    png = base64.b64decode(image.split(",", 1)[1])
    assert png == FrameStore().read(frame.image.name)
    assert Frame.objects.get(episode=worse, step=4).sha256 == frame.sha256
    user = row["prompt"][-1]
    assert [p["type"] for p in user["content"]] == ["text", "image"]
    meta = row["metadata"]
    assert (meta["seed"], meta["turn"]) == (11, 4)
    assert meta["chosen"]["episode_id"] == better.id and meta["chosen"]["unique_achievements"] == 3
    assert meta["rejected"]["episode_id"] == worse.id and meta["rejected"]["reward"] == 0.9

    openai = run(
        "export_jsonl", "--output", str(tmp_path / "openai.jsonl"),
        "--batch", str(original.id), str(fork.id), "--kind", "preference", "--format", "openai",
    )  # fmt: skip
    assert openai.code == 0, openai.stderr
    (orow,) = read_rows(tmp_path / "openai.jsonl")
    assert set(orow) == {"input", "preferred_output", "non_preferred_output"}
    assert (
        orow["preferred_output"] == row["chosen"]
        and orow["non_preferred_output"] == row["rejected"]
    )
    parts = orow["input"]["messages"][-1]["content"]
    assert [p["image_url"]["url"] for p in parts if p["type"] == "image_url"] == [image]


def test_the_worse_original_is_rejected(original_and_fork):
    original, fork = original_and_fork
    worse = outcome(original, achievements=2, reward=1.0)
    better = outcome(fork, achievements=2, reward=1.5)  # same achievements: reward decides
    (pair,) = list(find_pairs(TurnSelection(batches=(original.id, fork.id))))
    assert (pair.chosen.episode_id, pair.rejected.episode_id) == (better.id, worse.id)


def test_ties_and_identical_episodes_give_no_pair(original_and_fork):
    original, fork = original_and_fork
    outcome(original, achievements=2, reward=1.5)
    outcome(fork, achievements=2, reward=1.5)
    assert list(find_pairs(TurnSelection(batches=(original.id, fork.id)))) == []
    same = record(seeds=(11,), steps=8, actions=ORIGINAL)
    outcome(same, achievements=0, reward=0.0)
    # identical plays never diverge, whatever their recorded outcome
    assert list(find_pairs(TurnSelection(batches=(original.id, same.id)))) == []


def test_a_filtered_out_divergence_turn_makes_no_pair(original_and_fork):
    original, fork = original_and_fork
    outcome(original, achievements=3, reward=2.9)
    outcome(fork, achievements=1, reward=0.9)
    fork.episodes.get().turns.filter(index=4).update(flagged=True)
    filters = TurnSelection(batches=(original.id, fork.id), flagged="exclude")
    assert list(find_pairs(filters)) == []


def test_samples_of_a_seed_give_pairs_and_hf_preference_columns(tmp_path):
    batch = record(seeds=(2,), samples_per_seed=3, steps=20, policy="random")
    for sample, (count, reward) in enumerate([(1, 1.0), (2, 2.0), (0, 0.0)]):
        Episode.objects.filter(batch=batch, sample=sample).update(
            achievement_count=count, total_reward=reward
        )
    pairs = list(find_pairs(TurnSelection(batches=(batch.id,))))
    ranks = {0: 1, 1: 2, 2: 0}
    assert len(pairs) == 3
    for pair in pairs:
        assert ranks[pair.chosen.sample] > ranks[pair.rejected.sample]
    output = tmp_path / "hf"
    result = services.hf_export(
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(kind="preference"),
        output=output,
    )
    assert result.summary()["rows"] == 3
    read = read_hf(output, ("prompt", "chosen", "rejected", "turn"), tmp_path / "reader")
    rows = read["parquet"]["train"]["rows"]
    assert read["parquet"] == read["disk"] and len(rows) == 3
    for row in rows:
        images = sum(1 for m in row["prompt"] for p in m["content"] if p["type"] == "image")
        assert images == len(row["pixels"]) == 1
        assert row["chosen"][0]["role"] == row["rejected"][0]["role"] == "assistant"


def test_the_live_counts_show_the_pairs(original_and_fork, editor_client):
    from django.urls import reverse

    original, fork = original_and_fork
    outcome(original, achievements=3, reward=2.9)
    outcome(fork, achievements=1, reward=0.9)
    page = editor_client.get(
        reverse("datasets:dataset_counts"),
        {"name": "x", "batches": [original.id, fork.id], "flagged": "any", "format": "studio",
         "kind": "preference"},
    )  # fmt: skip
    assert 'data-count="pairs">1<' in page.content.decode()


def test_the_dataset_page_previews_the_pairs_with_escaped_text(original_and_fork, viewer_client):
    from django.urls import reverse

    original, fork = original_and_fork
    better = outcome(original, achievements=3, reward=2.9)
    outcome(fork, achievements=1, reward=0.9)
    better.turns.filter(index=4).update(model_text="<script>alert(1)</script>")
    dataset = services.dataset_create(
        name="pairs",
        filters=TurnSelection(batches=(original.id, fork.id)),
        options=ExportOptions(kind="preference"),
    )
    html = viewer_client.get(reverse("datasets:dataset_detail", args=[dataset.id])).content
    html = html.decode()
    assert 'data-turn="4"' in html and html.count('class="card preview-row pair"') == 1
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    frame = Frame.objects.get(episode=better, step=4)
    assert frame.sha256 in html


def test_a_preference_version_exports_pairs_and_its_trl_download(original_and_fork):
    from django.core.files.storage import default_storage

    from curation.models import DatasetVersion

    original, fork = original_and_fork
    outcome(original, achievements=3, reward=2.9)
    outcome(fork, achievements=1, reward=0.9)
    dataset = services.dataset_create(
        name="pairs",
        filters=TurnSelection(batches=(original.id, fork.id)),
        options=ExportOptions(kind="preference"),
    )
    version = services.dataset_version_create(dataset=dataset, enqueue=False)
    assert services.dataset_version_export(version_id=version.id) == "done"
    version.refresh_from_db()
    assert version.status == DatasetVersion.Status.DONE
    assert (version.rows, version.episodes, version.images) == (1, 2, 1)
    (row,) = read_rows(default_storage.path(version.file.name))
    assert row["metadata"]["turn"] == 4
    assert version.hf_file.name.endswith(".hf.zip") and default_storage.exists(version.hf_file.name)


def test_training_refuses_a_preference_version(original_and_fork, tmp_path):
    from training.upload_files import DataRefused, upload_file_build

    original, fork = original_and_fork
    outcome(original, achievements=3, reward=2.9)
    outcome(fork, achievements=1, reward=0.9)
    dataset = services.dataset_create(
        name="pairs",
        filters=TurnSelection(batches=(original.id, fork.id)),
        options=ExportOptions(kind="preference"),
    )
    version = services.dataset_version_create(dataset=dataset, enqueue=False)
    assert services.dataset_version_export(version_id=version.id) == "done"
    version.refresh_from_db()
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    with pytest.raises(DataRefused) as refused:
        upload_file_build(
            version=version, provider="synth", role="train", directory=uploads, label="x"
        )
    assert "holds preference pairs" in refused.value.lines[0]
    assert list(uploads.iterdir()) == []


def test_preference_rows_are_not_written_for_synth():
    from curation.export_options import check_combination
    from rollouts.review.turn_selection import FilterError

    with pytest.raises(FilterError, match="not synth"):
        check_combination(TurnSelection(), ExportOptions(kind="preference", format="synth"))


def test_a_real_fork_and_its_original_give_one_pair_at_the_fork_turn():
    from rollouts.play import forks as services_fork
    from rollouts.recording import services as rollout_services
    from rollouts.rollout_settings import RolloutSettings

    original = record(seeds=(11,), steps=8, actions=ORIGINAL)
    source = original.episodes.get()
    settings = services_fork.fork_settings(
        source=source, settings=RolloutSettings(policy="scripted", actions=("noop",)), steps=None
    )
    fork = services_fork.episode_fork(source=source, turn=4, settings=settings, enqueue=False)
    assert rollout_services.episode_run(episode_id=fork.id) == "finished"
    fork.refresh_from_db()
    assert fork.forked_from_id == source.id
    filters = TurnSelection(batches=(original.id, fork.batch_id))
    for better, worse in ((source, fork), (fork, source)):
        Episode.objects.filter(id=better.id).update(achievement_count=2, total_reward=2.0)
        Episode.objects.filter(id=worse.id).update(achievement_count=1, total_reward=1.0)
        (pair,) = list(find_pairs(filters))
        assert pair.turn == 4
        assert (pair.chosen.episode_id, pair.rejected.episode_id) == (better.id, worse.id)
    Episode.objects.filter(id=fork.id).update(achievement_count=2, total_reward=2.0)
    Episode.objects.filter(id=source.id).update(achievement_count=2, total_reward=2.0)
    assert list(find_pairs(filters)) == []
