"""The system prompt's game rules against crafter's own data.yaml, read here independently."""

from __future__ import annotations

from pathlib import Path

import crafter
import pytest
import ruamel.yaml

from rollouts.game.tools import PROMPT_VERSION, game_rules, system_prompt
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch

DATA_YAML = Path(crafter.__file__).parent / "data.yaml"


def rule_line(prompt: str, starts: str) -> str:
    (line,) = [line for line in prompt.splitlines() if line.startswith(starts)]
    return line


def test_it_states_the_recipes_crafter_plays_by():
    prompt = system_prompt()
    # Worked out by hand from crafter 1.8.3's data.yaml: stone tools need only a table.
    stone = rule_line(prompt, "- make_stone_pickaxe")
    assert "1 wood, 1 stone" in stone and "table" in stone and "furnace" not in stone
    assert "furnace" not in rule_line(prompt, "- make_stone_sword")
    iron = rule_line(prompt, "- make_iron_pickaxe")
    assert "1 wood, 1 coal, 1 iron" in iron and "a table and a furnace" in iron
    assert "needs 1 stone_pickaxe" in prompt.split("iron gives 1 iron", 1)[1].split(";")[0]
    # The hand-written rule of version 1 is gone.
    assert "a furnace for stone" not in prompt


def test_it_has_a_rule_for_every_entry_of_the_yaml():
    data = ruamel.yaml.YAML(typ="safe", pure=True).load(DATA_YAML.read_text())
    prompt = "\n".join(game_rules())
    collect_line = rule_line(prompt, "- 'do' facing")
    for material, info in data["collect"].items():
        for item, amount in info["receive"].items():
            assert f"{material} gives {amount} {item}" in collect_line
        for tool, amount in info["require"].items():
            assert f"needs {amount} {tool}" in collect_line
    for name, info in data["place"].items():
        line = rule_line(prompt, f"- place_{name} ")
        for item, amount in info["uses"].items():
            assert f"{amount} {item}" in line
        for cell in info["where"]:
            assert cell in line.split("must be", 1)[1]
    for name, info in data["make"].items():
        line = rule_line(prompt, f"- make_{name} ")
        uses = ", ".join(f"{amount} {item}" for item, amount in info["uses"].items())
        assert f"uses {uses};" in line
        for station in ("table", "furnace"):
            assert (station in line) == (station in info["nearby"]), line
    assert len(game_rules()) == 2 + len(data["place"]) + len(data["make"])


@pytest.mark.django_db
def test_it_records_on_the_batch_the_prompt_its_model_was_sent(chat_server):
    chat_server.script(replies.tool_call("noop"), replies.tool_call("noop"))
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        base_url=chat_server.url,
        seeds=(1,),
        steps=2,
        history_frames=2,
    )
    assert batch.prompt_version == PROMPT_VERSION == 2
    sent = [r.body["messages"][0]["content"] for r in chat_server.requests]
    assert len(sent) == 2 and set(sent) == {batch.system_prompt}
    assert "up to your last 2 turns" in batch.system_prompt


@pytest.mark.django_db
def test_it_records_no_prompt_for_baselines():
    batch = record_batch(policy="scripted", seeds=(0,), steps=2)
    assert (batch.prompt_version, batch.system_prompt) == (0, "")


@pytest.mark.django_db
def test_it_records_version_1_and_its_text_for_batches_played_before(chat_server):
    import importlib

    from django.apps import apps

    from rollouts.models import RolloutBatch, Turn

    migration = importlib.import_module("rollouts.migrations.0002_batch_prompt_version")
    chat_server.script(replies.tool_call("noop"))
    batch = record_batch(
        policy="openai", model="test-vlm", base_url=chat_server.url, seeds=(2,), steps=1
    )
    old_text = "Crafting needs a nearby table (and a furnace for stone and iron tools)."
    turn = Turn.objects.get(episode__batch=batch)
    turn.request_messages = [{"role": "system", "content": old_text}, *turn.request_messages[1:]]
    turn.save()
    RolloutBatch.objects.filter(id=batch.id).update(prompt_version=0, system_prompt="")
    baseline = record_batch(policy="random", seeds=(2,), steps=1)
    migration._record_old_prompts(apps, None)
    batch.refresh_from_db()
    baseline.refresh_from_db()
    assert (batch.prompt_version, batch.system_prompt) == (1, old_text)
    assert (baseline.prompt_version, baseline.system_prompt) == (0, "")
