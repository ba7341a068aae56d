"""A probe kind is one declaration: a throwaway one, registered here, shows in the set form,
`probe_set --help` and the new-set page, and asks its questions of a frame."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import get_commands, load_command_class
from django.urls import reverse

from probes import questions
from probes.forms import ProbeSetForm
from probes.questions import YES_NO, ProbeKind, frame_questions

VIEW = [["grass"] * 9 for _ in range(7)]
STATE = {"vitals": {}, "inventory": {}}


def _ask_always(view, state):
    yield "", "Is this a throwaway question?", "yes"


THROWAWAY = ProbeKind("always_yes", _ask_always, YES_NO)


@pytest.fixture
def always_yes() -> Iterator[ProbeKind]:
    questions.probe_kind_register(THROWAWAY)
    try:
        yield THROWAWAY
    finally:
        questions.probe_kind_unregister(THROWAWAY.name)


def _probe_set_help() -> str:
    command = load_command_class(get_commands()["probe_set"], "probe_set")
    return " ".join(command.create_parser("manage.py", "probe_set").format_help().split())


def test_it_asks_its_question_of_a_frame(always_yes):
    found = frame_questions(state=STATE, view=VIEW, kinds=["always_yes"], seed=1, frame_key=3)
    assert [(q.kind, q.answer, sorted(q.choices)) for q in found] == [
        ("always_yes", "yes", ["no", "yes"])
    ]
    assert questions.kinds_checked(None)[-1] == "always_yes"
    assert questions.answer_counts([("always_yes", "yes")]) == {"always_yes": {"yes": 1}}


def test_the_form_the_command_and_the_page_offer_it(db, editor_client, always_yes):
    assert ("always_yes", "always_yes") in ProbeSetForm().fields["kinds"].choices
    assert "asleep, always_yes" in _probe_set_help()
    page = editor_client.get(reverse("probes:probe_list")).content.decode()
    assert 'value="always_yes"' in page


def test_it_is_gone_once_unregistered():
    assert "always_yes" not in questions.kind_names()
    assert "always_yes" not in _probe_set_help()
    with pytest.raises(questions.QuestionError, match="unknown kind 'always_yes'"):
        questions.kinds_checked(["always_yes"])
