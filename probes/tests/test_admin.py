"""The admin of every probes model: lists and pages open; generated rows are not edited."""

from __future__ import annotations

import pytest

from probes.models import ProbeAnswer, ProbeQuestion, ProbeRun, ProbeRunChunk
from probes.services import probe_set_create
from probes.tests.helpers import recorded
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows():
    batch = recorded(seeds=(1,), steps=3)
    probe_set = probe_set_create(filters=TurnSelection(batches=(batch.id,)), kinds=["night"])
    question = ProbeQuestion.objects.filter(probe_set=probe_set).first()
    run = ProbeRun.objects.create(probe_set=probe_set, endpoint_name="local", model="m")
    chunk = ProbeRunChunk.objects.create(run=run, index=0, first=0, last=3)
    answer = ProbeAnswer.objects.create(
        run=run, question=question, choice="no", correct=True, model_text="<b>no</b>"
    )
    return {
        "probeset": probe_set,
        "probequestion": question,
        "proberun": run,
        "proberunchunk": chunk,
        "probeanswer": answer,
    }


def test_it_lists_and_shows_every_model_and_adds_none(admin_client, rows):
    for name, row in rows.items():
        assert admin_client.get(f"/admin/probes/{name}/").status_code == 200, name
        page = admin_client.get(f"/admin/probes/{name}/{row.pk}/change/")
        assert page.status_code == 200, name
        assert admin_client.get(f"/admin/probes/{name}/add/").status_code == 403, name
    # The model's text is shown escaped.
    page = admin_client.get(f"/admin/probes/probeanswer/{rows['probeanswer'].pk}/change/")
    assert b"<b>no</b>" not in page.content and b"&lt;b&gt;no&lt;/b&gt;" in page.content


def test_a_question_cannot_be_changed_but_a_reviewer_may_flag_an_answer(admin_client, rows):
    question = rows["probequestion"]
    admin_client.post(
        f"/admin/probes/probequestion/{question.pk}/change/",
        {"answer": "yes", "kind": "night", "text": "changed"},
    )
    question.refresh_from_db()
    assert (question.answer, question.text) == ("no", "Is it night?")
    answer = rows["probeanswer"]
    response = admin_client.post(
        f"/admin/probes/probeanswer/{answer.pk}/change/",
        {"flagged": "on", "note": "looks like dusk", "correct": "", "choice": "yes"},
    )
    assert response.status_code == 302
    answer.refresh_from_db()
    assert (answer.flagged, answer.note) == (True, "looks like dusk")
    assert (answer.choice, answer.correct) == ("no", True)  # what the model said stays
    probe_set = rows["probeset"]
    admin_client.post(
        f"/admin/probes/probeset/{probe_set.pk}/change/", {"name": "renamed", "seed": "99"}
    )
    probe_set.refresh_from_db()
    assert (probe_set.name, probe_set.seed) == ("renamed", 0)
