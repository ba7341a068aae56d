"""An endpoint's allowed models are a list of model names or nothing, everywhere.

The field took any JSON: `[1,2]`, `null`, deep nesting or a string gave a 500 in admin, then
a 500 for reviewers on the batch and probe-run forms, and a string matched substrings of a
model name. These tests post each through the real admin, write each straight into the
database past admin, and open the forms over a row stored before the rule.
"""

from __future__ import annotations

import importlib
import json

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.urls import reverse

from probes.services import probe_set_create
from rollouts.models import RolloutBatch
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests.helpers import record_batch
from studio.models import Endpoint

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/studio/endpoint/add/"
FORM = {
    "name": "limited",
    "kind": "chat",
    "base_url": "http://127.0.0.1:9/v1",
    "concurrency": 4,
    "requests_per_minute": 0,
    "enabled": "on",
}
NAME_OF_200 = "m" * 200
BAD = {
    "numbers": "[1, 2]",
    "null": "null",
    "a string": '"gpt-4o"',
    "deep nesting": "[" * 40 + '"gpt-4o"' + "]" * 40,
    "an object": '{"gpt-4o": true}',
    "a list in the list": '["gpt-4o", ["gpt-4o-mini"]]',
    "an empty name": '[""]',
    "a name of 201 characters": json.dumps(["m" * 201]),
    "a control character": json.dumps(["gpt\x1b[2J"]),
    "51 names": json.dumps([f"model-{i}" for i in range(51)]),
}


@pytest.fixture
def admin_client(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.mark.parametrize("what", list(BAD))
def test_it_shows_admin_a_field_error_for_a_bad_list(admin_client, what):
    response = admin_client.post(ADD_URL, {**FORM, "allowed_models": BAD[what]})

    assert response.status_code == 200
    assert response.context["adminform"].form.errors["allowed_models"]
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize(
    "value", ["[]", '["gpt-4o-mini"]', json.dumps([NAME_OF_200] * 50), '["a b", "ft:x:y"]']
)
def test_it_saves_a_list_of_model_names_from_admin(admin_client, value):
    response = admin_client.post(ADD_URL, {**FORM, "allowed_models": value})

    assert response.status_code == 302
    assert Endpoint.objects.get().allowed_models == json.loads(value)


@pytest.mark.parametrize("what", list(BAD))
def test_it_refuses_a_bad_list_written_straight_into_the_database(what):
    endpoint = Endpoint.objects.create(name="limited", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE studio_endpoint SET allowed_models = %s::jsonb WHERE id = %s",
            [BAD[what], endpoint.id],
        )
    endpoint.refresh_from_db()
    assert endpoint.allowed_models == []


def test_it_refuses_a_bad_list_saved_through_the_orm():
    for value in ([1, 2], "gpt-4o", [["gpt-4o"]], ["m" * 201]):
        with pytest.raises(IntegrityError), transaction.atomic():
            Endpoint.objects.create(
                name="limited", base_url="http://127.0.0.1:9/v1", allowed_models=value
            )
    assert not Endpoint.objects.exists()


def _stored_before_the_rule(value: str) -> Endpoint:
    """A row as it may have been saved before the constraint existed (dropped here, inside
    the test's transaction, which puts it back)."""
    endpoint = Endpoint.objects.create(name="limited", base_url="http://127.0.0.1:9/v1")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE studio_endpoint DROP CONSTRAINT endpoint_allowed_models_names")
        cursor.execute(
            "UPDATE studio_endpoint SET allowed_models = %s::jsonb WHERE id = %s",
            [value, endpoint.id],
        )
    endpoint.refresh_from_db()
    return endpoint


@pytest.mark.parametrize("what", ["numbers", "a string", "deep nesting", "null"])
def test_it_allows_no_model_on_a_row_stored_before_the_rule(editor_client, what):
    endpoint = _stored_before_the_rule(BAD[what])
    # "gpt-4o-mini" contains "gpt-4o": a string once let it through.
    assert not endpoint.allows_model("gpt-4o")
    assert not endpoint.allows_model("gpt-4o-mini")

    url = reverse("rollouts:batch_create")
    assert editor_client.get(url).status_code == 200
    form = {"policy": "openai", "model": "gpt-4o-mini", "seeds": "0", "steps": 2}
    response = editor_client.post(url, {**form, "image_size": 64, "endpoint": endpoint.name})
    assert response.status_code == 200
    assert response.context["form"].errors["model"] == [
        "'gpt-4o-mini' is not allowed on endpoint 'limited'; its allowed models "
        "cannot be read; an admin corrects them under /admin/."
    ]
    assert RolloutBatch.objects.count() == 0


def test_it_renders_the_probe_run_form_over_a_row_stored_before_the_rule(editor_client):
    batch = record_batch(seeds=(2,), steps=3)
    probe_set = probe_set_create(filters=TurnSelection(batches=(batch.id,)), seed=3)
    endpoint = _stored_before_the_rule(BAD["numbers"])

    page = editor_client.get(reverse("probes:set_detail", args=[probe_set.id]))
    assert page.status_code == 200
    response = editor_client.post(
        reverse("probes:run_create", args=[probe_set.id]),
        {"endpoint": endpoint.name, "model": "gpt-4o", "observation": "image", "concurrency": 1},
    )
    assert response.status_code == 400
    assert "its allowed models cannot be read" in response.content.decode()
    assert not probe_set.runs.exists()


def test_it_repairs_stored_rows_without_allowing_more_than_they_did():
    repair = importlib.import_module(
        "studio.migrations.0005_endpoint_allowed_models_names"
    ).allowed_models_repair
    rows = {
        "mixed": '[1, "gpt-4o", "gpt-4o", ["x"]]',
        "text": '"gpt-4o"',
        "numbers": "[1, 2]",
        "fine": '["gpt-4o-mini"]',
    }
    endpoint = _stored_before_the_rule("[]")
    endpoint.delete()
    with connection.cursor() as cursor:
        for name, value in rows.items():
            cursor.execute(
                "INSERT INTO studio_endpoint (name, kind, base_url, api_key_env, allowed_models,"
                " concurrency, requests_per_minute, enabled, created_at, updated_at) VALUES"
                " (%s, 'chat', 'http://127.0.0.1:9/v1', '', %s::jsonb, 4, 0, true, now(), now())",
                [name, value],
            )

    repair(apps, None)

    assert {e.name: (e.allowed_models, e.enabled) for e in Endpoint.objects.all()} == {
        "mixed": (["gpt-4o"], True),
        "text": ([], False),
        "numbers": ([], False),
        "fine": (["gpt-4o-mini"], True),
    }
