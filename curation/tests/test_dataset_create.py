"""`manage.py dataset_create`: a dataset saved from export_jsonl's own filter flags."""

from __future__ import annotations

import pytest

from curation.models import Dataset
from curation.tests.conftest import record, run


@pytest.fixture
def two_batches(db):
    # Scripted: one action a turn, so 3 episodes of 30 steps are 90 turns.
    return record(seeds=(1, 2, 3), steps=30), record(seeds=(4,), steps=5)


def test_it_saves_the_filters_and_options_it_is_given(two_batches):
    first, _ = two_batches
    done = run(
        "dataset_create", "--name", "first fine-tune", "--batch", str(first.id),
        "--flagged", "exclude", "--format", "openai", "--val-fraction", "0.25",
        "--history-frames", "2",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    dataset = Dataset.objects.get()
    assert done.summary == {"dataset_id": dataset.id, "turns": 90, "episodes": 3}
    assert dataset.name == "first fine-tune"
    assert dataset.filters["batches"] == [first.id]
    assert dataset.filters["flagged"] == "exclude"
    assert (
        dataset.export_options["format"],
        dataset.export_options["val_fraction"],
        dataset.export_options["history_frames"],
    ) == ("openai", 0.25, 2)
    assert not dataset.versions.exists()  # saved, not exported


def test_it_counts_every_batch_without_a_batch_filter(two_batches):
    done = run("dataset_create", "--name", "everything")
    assert done.code == 0, done.stderr
    assert done.summary == {"dataset_id": Dataset.objects.get().id, "turns": 95, "episodes": 4}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--require-achievement", "collect_gold"), "unknown achievement 'collect_gold'"),
        (("--batch", "999"), "there is no batch 999"),
        (("--flagged", "sometimes"), "invalid choice: 'sometimes'"),
        (("--colour", "red"), "unrecognized arguments: --colour red"),
        (("--val-fraction", "1.5"), "val-fraction: 1.5 is not in [0, 1)"),
        (("--dataset", "1"), "unrecognized arguments: --dataset 1"),
    ],
)
def test_it_refuses_a_filter_it_does_not_know_and_saves_nothing(two_batches, capsys, args, said):
    done = run("dataset_create", "--name", "typo", *args)
    assert done.code == 2
    # argparse's refusals go to the process's stderr, the command's to its own.
    assert said in done.stderr + capsys.readouterr().err
    assert done.stdout == ""
    assert not Dataset.objects.exists()


def test_it_saves_nothing_when_nothing_matches_unless_asked(two_batches):
    nothing = ("--name", "empty", "--min-reward", "100")
    done = run("dataset_create", *nothing)
    assert done.code == 1
    assert "no turn matches these filters; nothing saved" in done.stderr
    assert not Dataset.objects.exists()
    allowed = run("dataset_create", *nothing, "--allow-empty")
    assert allowed.code == 0, allowed.stderr
    assert allowed.summary == {"dataset_id": Dataset.objects.get().id, "turns": 0, "episodes": 0}


def test_it_refuses_what_the_page_refuses(two_batches):
    _, small = two_batches
    # 5 rows: fewer than the 10 OpenAI's fine-tuning takes, refused when saved on the page too.
    done = run("dataset_create", "--name", "small", "--batch", str(small.id), "--format", "openai")
    assert done.code == 2
    assert "at least 10 rows in the training file; this filter selects 5" in done.stderr
    blank = run("dataset_create", "--name", "", "--batch", str(small.id))
    assert blank.code == 2
    assert "--name: This field cannot be blank." in blank.stderr
    assert not Dataset.objects.exists()
