"""The turn filter is declared once (`TurnSelection` and its `Filter`s): the dataset form, the
export commands' flags, the turn list's form and the bulk-flag confirmation are made from it.

The names each face must keep are written out here by hand: the export commands' flags
(`docs/formats.md`), the turn list's address query (bookmarks and the browser tests use
it), the dataset form's fields (saved as `Dataset.filters`). A filter declared for a face
and missing from it, or a face offering a filter the declaration does not give it, fails
here.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from curation.command_options import add_filter_arguments, filters_from_options
from curation.export_options import ExportOptions
from curation.forms import DatasetForm
from curation.management.commands import dataset_create, export_hf, export_jsonl
from curation.models import Dataset
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.review.forms import BulkFlagForm, TurnFilterForm, turn_list_query
from rollouts.review.selectors import turn_filter_choices
from rollouts.review.turn_selection import (
    EVERY_TURN,
    TurnSelection,
    selection_summary,
    turn_filters,
)

pytestmark = pytest.mark.django_db

# The filter flags of export_jsonl (and so export_hf), as `docs/formats.md` lists them.
COMMAND_FLAGS = {
    "batch": "batches",
    "model": "models",
    "require-achievement": "require_achievements",
    "exclude-achievement": "exclude_achievements",
    "min-unique": "min_unique",
    "min-reward": "min_reward",
    "user-image": "user_image",
    "include-assistant": "include_assistant",
    "flagged": "flagged",
    "include-text-fallback": "include_text_fallback",
    "relabeled": "relabeled",
    "include-fork-prefix": "include_fork_prefix",
    "include-canceled": "include_canceled",
    "top-per-seed": "top_per_seed",
    "at-or-above-mean": "at_or_above_mean",
    "exclude-errors": "exclude_errors",
}
# The export commands' flags that are not filters.
COMMAND_OPTIONS = {"dataset", "allow-empty", "kind", "val-fraction", "history-frames", "format"}
# The turn list's address query: field name -> the filter it sets.
TURN_LIST_QUERY = {
    "batch": "batches",
    "model": "models",
    "policy": "policies",
    "seed": "seeds",
    "achievement": "turn_unlocked",
    "reward": "reward",
    "q": "search",
    "flagged": "flagged",
    "has_error": "has_error",
}
DATASET_FILTERS = {
    "batches",
    "models",
    "policies",
    "require_achievements",
    "exclude_achievements",
    "min_unique",
    "min_reward",
    "user_image",
    "include_assistant",
    "flagged",
    "exclude_errors",
    "include_text_fallback",
    "relabeled",
    "include_fork_prefix",
    "include_canceled",
    "top_per_seed",
    "at_or_above_mean",
}


def _declared(face: str) -> dict[str, str]:
    """The declaration's names on one face -> the filter's field name."""
    names = {}
    for f, spec in turn_filters():
        name = {"flag": spec.flag, "query": spec.query, "dataset": spec.dataset and f.name}[face]
        if name:
            names[name] = f.name
    return names


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s[2:] for action in parser._actions for s in action.option_strings if s[:2] == "--"}


def test_it_declares_each_face_of_the_filter_once():
    assert _declared("flag") == COMMAND_FLAGS
    assert _declared("query") == TURN_LIST_QUERY
    assert set(_declared("dataset")) == DATASET_FILTERS


def test_the_dataset_form_has_exactly_the_declarations_filters(db):
    export_options = {f.name for f in dataclasses.fields(ExportOptions)}
    fields = set(DatasetForm().fields) - {"name", "description"} - export_options
    assert fields == set(_declared("dataset"))
    # In the declaration's order, after the name, before the export options.
    names = list(DatasetForm().fields)
    assert names[: 2 + len(fields)] == ["name", "description", *_declared("dataset")]


def test_the_turn_list_forms_have_exactly_the_declarations_filters():
    assert set(TurnFilterForm().fields) == set(_declared("query"))
    # The bulk flag's form: the same filters and the state to set, under a name of its own.
    assert set(BulkFlagForm().fields) == {*_declared("query"), "set_flagged"}
    # The pages' own parameters never shadow a filter.
    own = {"sort", "after", "before", "page", "set_flagged", "csrfmiddlewaretoken"}
    assert not own & set(_declared("query"))


@pytest.mark.parametrize(
    ("command", "own"),
    [
        # `--probe-set`: a probe set's rows instead of turns (`probes.exporting`).
        (export_jsonl.Command, {"output", "val-output", "force", "probe-set"}),
        (export_hf.Command, {"output", "tool-calls-as-text", "force", "probe-set"}),
        (dataset_create.Command, {"name", "description"}),
    ],
)
def test_the_export_commands_have_exactly_the_declarations_flags(command, own):
    django_flags = _flags(BaseCommand().create_parser("manage.py", "base"))
    flags = _flags(command().create_parser("manage.py", "export")) - django_flags
    assert flags - COMMAND_OPTIONS - own == set(_declared("flag"))


def test_the_flags_make_the_filter_they_name(db):
    batch = RolloutBatch.objects.create(policy="openai", model="m-a")
    parser = argparse.ArgumentParser(add_help=False)
    add_filter_arguments(parser)
    given = parser.parse_args(
        [
            *("--batch", str(batch.id), "--model", "m-a"),
            *("--require-achievement", "collect_wood", "place_table"),
            *("--exclude-achievement", "eat_cow", "--min-unique", "2", "--min-reward", "1.5"),
            *("--user-image", "--flagged", "exclude", "--relabeled", "only"),
            *("--include-fork-prefix", "--top-per-seed", "3", "--at-or-above-mean"),
        ]
    )
    filters, _options = filters_from_options(vars(given))
    assert filters == TurnSelection(
        batches=(batch.id,),
        models=("m-a",),
        require_achievements=("collect_wood", "place_table"),
        exclude_achievements=("eat_cow",),
        min_unique=2,
        min_reward=1.5,
        user_image=True,
        flagged="exclude",
        relabeled="only",
        include_fork_prefix=True,
        top_per_seed=3,
        at_or_above_mean=True,
    )
    # Not given: the defaults, a dataset's.
    nothing, _options = filters_from_options(vars(parser.parse_args([])))
    assert nothing == TurnSelection()


def test_a_filter_flag_beside_dataset_is_refused_by_its_flag(db, tmp_path):
    dataset = Dataset.objects.create(name="d", filters={}, export_options={})
    with pytest.raises(CommandError, match=r"^--min-unique: --dataset uses the dataset's saved"):
        call_command(
            "export_jsonl",
            "--output",
            str(tmp_path / "x.jsonl"),
            "--dataset",
            str(dataset.id),
            "--min-unique",
            "1",
        )


def test_the_dataset_form_makes_the_filter_it_shows(db):
    batch = RolloutBatch.objects.create(policy="openai", model="m-a")
    form = DatasetForm(
        {
            "name": "d",
            "batches": [str(batch.id)],
            "models": ["m-a"],
            "policies": ["openai"],
            "exclude_achievements": ["eat_cow"],
            "min_reward": "0.5",
            "flagged": "only",
            "exclude_errors": "on",
            "relabeled": "exclude",
            "top_per_seed": "2",
            "history_frames": "0",
            "format": "studio",
        }
    )
    assert form.is_valid(), form.errors
    assert form.filters == TurnSelection(
        batches=(batch.id,),
        models=("m-a",),
        policies=("openai",),
        exclude_achievements=("eat_cow",),
        min_reward=0.5,
        flagged="only",
        exclude_errors=True,
        relabeled="exclude",
        top_per_seed=2,
    )


def test_the_turn_list_query_goes_to_the_filter_and_back():
    selection = TurnFilterForm(
        {"batch": "4", "policy": "human", "seed": "0", "achievement": "collect_wood", "q": "tree"}
    )
    assert selection.is_valid(), selection.errors
    filters = selection.filters()
    assert filters == dataclasses.replace(
        EVERY_TURN,
        batches=(4,),
        policies=("human",),
        seeds=(0,),
        turn_unlocked=("collect_wood",),
        search="tree",
    )
    assert turn_list_query(filters) == "batch=4&policy=human&seed=0&achievement=collect_wood&q=tree"
    assert turn_list_query(EVERY_TURN) == ""


def test_a_summary_names_what_narrows_the_list_in_the_pages_words():
    assert selection_summary(EVERY_TURN) == []
    narrowed = dataclasses.replace(
        EVERY_TURN, batches=(2,), reward="positive", has_error="no", turn_unlocked=("eat_cow",)
    )
    assert selection_summary(narrowed) == [
        ("batch", "2"),
        ("unlocked", "eat_cow"),
        ("reward", "> 0"),
        ("error", "without error"),
    ]


def _batch_with_rewards(rewards: list[float], *, model: str = "m-a") -> RolloutBatch:
    batch = RolloutBatch.objects.create(policy="openai", model=model)
    episode = Episode.objects.create(batch=batch, seed=1, status="finished")
    for index, reward in enumerate(rewards):
        frame = Frame.objects.create(
            episode=episode, step=index, sha256="0" * 64, image="f.png", width=8, height=8
        )
        Turn.objects.create(episode=episode, index=index, frame=frame, reward=reward)
    return batch


def _confirmation_filters(page: str) -> list[str]:
    listed = re.search(r'<ul class="small">(.*?)</ul>', page, re.S)
    assert listed, page
    return [item.strip() for item in re.findall(r"<li>(.*?)</li>", listed.group(1), re.S)]


def test_the_bulk_flag_confirmation_names_every_active_filter_and_no_other(editor_client):
    # Batch 2 and reward > 0: 10 turns. It said "batch: 2, model: any, flagged: any,
    # error: any, unlocked: any", leaving out the reward (the count was right).
    _batch_with_rewards([1.0] * 3)
    batch = _batch_with_rewards([1.0] * 10 + [0.0] * 5 + [-1.0] * 2)
    url = reverse("rollouts:turns_bulk_flag")
    response = editor_client.get(url, {"batch": batch.id, "reward": "positive", "set_flagged": 1})
    assert response.status_code == 200
    page = response.content.decode()
    assert "Flag 10 turns?" in page
    assert _confirmation_filters(page) == [f"batch: {batch.id}", "reward: &gt; 0"]

    everything = editor_client.get(url, {"set_flagged": 0}).content.decode()
    assert "Unflag 20 turns?" in everything
    assert _confirmation_filters(everything) == ["no filter: every turn"]

    query = {"model": "m-a", "flagged": "exclude", "q": "go", "has_error": "no", "seed": 1}
    narrowed = editor_client.get(url, {**query, "set_flagged": 1}).content.decode()
    assert _confirmation_filters(narrowed) == [
        "model: m-a",
        "seed: 1",
        "search: go",
        "flagged: not flagged",
        "error: without error",
    ]


def test_the_turn_lists_model_filter_offers_each_model_once(viewer_client):
    for model in ("m-b", "m-a", "m-a", "m-b", ""):
        RolloutBatch.objects.create(policy="openai" if model else "scripted", model=model)
    assert turn_filter_choices()["models"] == ["m-a", "m-b"]
    page = viewer_client.get(reverse("rollouts:turn_list")).content.decode()
    offered = re.search(r'<select name="model">(.*?)</select>', page, re.S).group(1)
    assert re.findall(r'<option value="([^"]*)"', offered) == ["", "m-a", "m-b"]
