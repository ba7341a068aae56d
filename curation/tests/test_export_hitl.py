"""Exports of human-in-the-loop data: people's games, corrections, forks' replayed turns."""

from __future__ import annotations

import json

import pytest

from curation.tests.conftest import read_rows, record, run
from rollouts.models import Turn
from rollouts.play import forks as services_fork
from rollouts.play import services as services_play
from rollouts.recording import services
from rollouts.review import services as services_review
from rollouts.review.turn_selection import FilterError, TurnSelection, turns_selected
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests import openai_server as replies

pytestmark = pytest.mark.django_db


def _arguments(row: dict) -> list[str]:
    calls = row["messages"][-1]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "interact_many"
    return json.loads(calls[0]["function"]["arguments"])["actions"]


def test_a_relabeled_turn_exports_the_correction_with_the_original_in_metadata(
    chat_server, editor, tmp_path
):
    chat_server.script(*[replies.tool_call("move_left", "do")] * 5)
    batch = record(
        policy="openai", model="test-vlm", base_url=chat_server.url, seeds=(5,), steps=10
    )
    turn = Turn.objects.get(episode__batch=batch, index=1)
    assert turn.model_text is not None or turn.tool_calls
    services_review.turn_relabel(
        turn=turn, actions=["place_table", "do"], reason="a table first", user=editor
    )
    out = tmp_path / "rows.jsonl"
    assert run("export_jsonl", "--output", str(out)).code == 0
    rows = {r["metadata"]["turn"]: r for r in read_rows(out)}
    fixed, untouched = rows[1], rows[0]
    assistant = fixed["messages"][-1]
    assert assistant["content"] is None  # the model's text is not the answer any more
    assert _arguments(fixed) == ["place_table", "do"]
    assert assistant["tool_calls"][0]["id"] == f"call_{turn.episode_id}_1"
    assert fixed["metadata"]["relabeled"] == {"original_actions": ["move_left", "do"]}
    assert _arguments(untouched) == ["move_left", "do"]
    assert "relabeled" not in untouched["metadata"]

    only = tmp_path / "only.jsonl"
    assert run("export_jsonl", "--output", str(only), "--relabeled", "only").code == 0
    assert [r["metadata"]["turn"] for r in read_rows(only)] == [1]
    rest = tmp_path / "rest.jsonl"
    assert run("export_jsonl", "--output", str(rest), "--relabeled", "exclude").code == 0
    assert 1 not in [r["metadata"]["turn"] for r in read_rows(rest)]
    assert len(read_rows(rest)) == len(rows) - 1

    # Removed: the turn exports as the model answered it again.
    assert services_review.turn_relabel_remove(turn=turn)
    again = tmp_path / "again.jsonl"
    assert run("export_jsonl", "--output", str(again)).code == 0
    assert _arguments(read_rows(again)[1]) == ["move_left", "do"]


def test_a_relabel_is_bounded_and_cleaned(editor):
    batch = record(seeds=(1,), steps=3)
    turn = Turn.objects.get(episode__batch=batch, index=0)
    with pytest.raises(ValueError, match="1 to 8"):
        services_review.turn_relabel(turn=turn, actions=["do"] * 9, reason="", user=editor)
    with pytest.raises(ValueError, match="not one of"):
        services_review.turn_relabel(turn=turn, actions=["jump"], reason="", user=editor)
    relabel = services_review.turn_relabel(
        turn=turn, actions=["do"], reason=" bad\x00 \ud800move\r\n", user=editor
    )
    assert relabel.reason == "bad ?move"
    assert relabel.labeled_by == editor
    changed = services_review.turn_relabel(turn=turn, actions=["noop"], reason="", user=editor)
    assert changed.id == relabel.id and changed.actions == ["noop"]


def test_a_persons_game_exports_their_actions_as_the_tool_call(editor, tmp_path):
    settings = services_play.play_settings(seed=2, steps=50, image_size=64)
    episode = services_play.play_start(settings=settings, user=editor)
    keys = ["move_right", "do", "noop"]
    for turn, action in enumerate(keys):
        services_play.play_step(episode_id=episode.id, action=action, turn=turn)
    out = tmp_path / "human.jsonl"
    assert run("export_jsonl", "--output", str(out), "--batch", str(episode.batch_id)).code == 0
    rows = read_rows(out)
    assert [_arguments(r) for r in rows] == [[k] for k in keys]
    assert all(r["metadata"]["policy"] == "human" for r in rows)
    assert all(r["messages"][-1]["content"] is None for r in rows)


def test_a_forks_replayed_turns_are_left_out_unless_asked_for(tmp_path):
    original = record(seeds=(3,), steps=20).episodes.get()
    fork = services_fork.episode_fork(
        source=original,
        turn=12,
        settings=services_fork.fork_settings(
            source=original, settings=RolloutSettings(policy="random"), steps=None
        ),
        enqueue=False,
    )
    assert services.episode_run(episode_id=fork.id) == "finished"
    out = tmp_path / "fork.jsonl"
    assert run("export_jsonl", "--output", str(out), "--batch", str(fork.batch_id)).code == 0
    assert [r["metadata"]["turn"] for r in read_rows(out)] == list(range(12, 20))
    whole = tmp_path / "whole.jsonl"
    result = run(
        "export_jsonl",
        "--output",
        str(whole),
        "--batch",
        str(fork.batch_id),
        "--include-fork-prefix",
    )
    assert result.code == 0
    assert [r["metadata"]["turn"] for r in read_rows(whole)] == list(range(20))
    # Ordinary episodes are whole either way.
    assert turns_selected(TurnSelection(batches=(original.batch_id,))).count() == 20


def test_an_unknown_relabeled_choice_is_an_error():
    with pytest.raises(FilterError, match="relabeled"):
        TurnSelection(relabeled="maybe")


def test_the_dataset_page_counts_relabeled_turns_and_forks_own_turns(
    editor_client, editor, tmp_path
):
    from django.urls import reverse

    original = record(seeds=(4,), steps=10).episodes.get()
    services_review.turn_relabel(
        turn=original.turns.get(index=2), actions=["do"], reason="", user=editor
    )
    fork = services_fork.episode_fork(
        source=original,
        turn=6,
        settings=services_fork.fork_settings(
            source=original, settings=RolloutSettings(policy="random"), steps=None
        ),
        enqueue=False,
    )
    assert services.episode_run(episode_id=fork.id) == "finished"

    def count(**extra) -> bytes:
        query = {"name": "x", "flagged": "any", "format": "studio", **extra}
        return editor_client.get(reverse("datasets:dataset_counts"), query).content

    assert b'data-count="turns">14<' in count()  # 10 + the fork's own 4
    assert b'data-count="turns">20<' in count(include_fork_prefix="on")
    assert b'data-count="turns">1<' in count(relabeled="only")
    assert b'data-count="turns">13<' in count(relabeled="exclude")


def test_a_corrected_text_fallback_turn_is_exported_as_the_reviewers_call(
    chat_server, editor, tmp_path
):
    chat_server.script(
        replies.tool_call("move_left"),
        replies.text("I will go right now: move_right"),
        replies.tool_call("do"),
    )
    batch = record(policy="openai", model="test-vlm", base_url=chat_server.url, seeds=(4,), steps=3)
    prose = Turn.objects.get(episode__batch=batch, index=1)
    assert prose.text_fallback
    out = tmp_path / "before.jsonl"
    assert run("export_jsonl", "--output", str(out)).code == 0
    assert [r["metadata"]["turn"] for r in read_rows(out)] == [0, 2]  # inferred call: left out
    services_review.turn_relabel(turn=prose, actions=["move_right"], reason="", user=editor)
    out = tmp_path / "after.jsonl"
    assert run("export_jsonl", "--output", str(out)).code == 0
    rows = read_rows(out)
    assert [r["metadata"]["turn"] for r in rows] == [0, 1, 2]
    fixed = rows[1]
    assert _arguments(fixed) == ["move_right"]
    assert fixed["messages"][-1]["content"] is None
    assert "text_fallback" not in fixed["metadata"]
    assert fixed["metadata"]["relabeled"] == {"original_actions": ["move_right"]}
