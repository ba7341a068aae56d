"""Which variables an endpoint may name as its key, and who may name one.

A staff user given the endpoint permissions could set an endpoint's key variable to
`SECRET_KEY`, then `DATABASE_URL`, point it at a listener of their own and receive both.
These tests try that through the real admin, and send a real model call from a row written past
the rule to a real local server that records every header it gets.
"""

from __future__ import annotations

import logging
import os
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from rollouts.tests.helpers import record_batch
from rollouts.tests.openai_server import ChatServer
from studio.endpoints import endpoint_api_key, endpoint_key_set
from studio.key_names import key_env_name_allowed
from studio.models import Endpoint

ADD_URL = "/admin/studio/endpoint/add/"
LIST_URL = "/admin/studio/endpoint/"
SECRETS = ["SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "AWS_SECRET_ACCESS_KEY"]
FORM = {
    "name": "mine",
    "kind": "chat",
    "base_url": "http://127.0.0.1:9/v1",
    "allowed_models": "[]",
    "concurrency": 4,
    "requests_per_minute": 0,
    "enabled": "on",
}


@pytest.fixture
def staff(db) -> User:
    """A staff user holding all four endpoint permissions: still no editor of endpoints."""
    user = User.objects.create_user("staff", password="staff-pass-123", is_staff=True)
    for action in ("add", "change", "delete", "view"):
        user.user_permissions.add(Permission.objects.get(codename=f"{action}_endpoint"))
    return user


@pytest.fixture
def listener():
    """A staff user's own server, where an endpoint must never send the server's secrets."""
    server = ChatServer().start()
    yield server
    server.stop()


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _change_url(endpoint: Endpoint) -> str:
    return f"/admin/studio/endpoint/{endpoint.id}/change/"


def _key_set_cell(page: str, name: str) -> str:
    row = next(r for r in re.findall(r"<tr.*?</tr>", page, re.S) if f">{name}</a>" in r)
    return re.search(r'<td class="field-key_set">(.*?)</td>', row, re.S).group(1)


def test_it_refuses_staff_with_every_endpoint_permission_adding_one(staff, listener):
    response = _client(staff).post(
        ADD_URL, {**FORM, "base_url": listener.url, "api_key_env": "SECRET_KEY"}
    )
    assert response.status_code == 403
    assert not Endpoint.objects.exists()


def test_it_refuses_staff_changing_or_deleting_one(staff, chat_endpoint, listener):
    client = _client(staff)
    for key_env in ("SECRET_KEY", "DATABASE_URL"):
        response = client.post(
            _change_url(chat_endpoint),
            {**FORM, "name": chat_endpoint.name, "base_url": listener.url, "api_key_env": key_env},
        )
        assert response.status_code == 403
    after = Endpoint.objects.get(id=chat_endpoint.id)
    assert (after.base_url, after.api_key_env) == (chat_endpoint.base_url, "STUDIO_TEST_CHAT_KEY")
    response = client.post(f"/admin/studio/endpoint/{chat_endpoint.id}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert Endpoint.objects.filter(id=chat_endpoint.id).exists()
    assert listener.requests == []


def test_it_lets_staff_with_the_view_permission_look_only(staff, chat_endpoint):
    client = _client(staff)
    listing = client.get(LIST_URL).content.decode()
    assert chat_endpoint.name in listing and ADD_URL not in listing
    page = client.get(_change_url(chat_endpoint)).content.decode()
    assert "STUDIO_TEST_CHAT_KEY" in page and 'name="_save"' not in page


def test_it_keeps_a_viewer_who_is_not_staff_out(viewer, chat_endpoint):
    client = _client(viewer)
    assert client.get(LIST_URL).status_code == 302
    assert client.post(ADD_URL, {**FORM, "api_key_env": "SECRET_KEY"}).status_code == 302
    assert list(Endpoint.objects.values_list("name", flat=True)) == [chat_endpoint.name]


@pytest.mark.parametrize("key_env", SECRETS)
def test_it_refuses_the_servers_own_secrets_even_to_a_superuser(admin_user, key_env):
    response = _client(admin_user).post(ADD_URL, {**FORM, "api_key_env": key_env})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["api_key_env"]
    assert "must match STUDIO_KEY_ENV_PATTERN" in errors["api_key_env"][0]
    assert not Endpoint.objects.exists()


def test_it_refuses_a_superuser_pointing_an_existing_endpoint_at_a_secret(
    admin_user, chat_endpoint
):
    response = _client(admin_user).post(
        _change_url(chat_endpoint),
        {**FORM, "name": chat_endpoint.name, "api_key_env": "DATABASE_URL"},
    )
    assert (
        response.status_code == 200 and "api_key_env" in response.context["adminform"].form.errors
    )
    assert Endpoint.objects.get(id=chat_endpoint.id).api_key_env == "STUDIO_TEST_CHAT_KEY"


def test_it_accepts_a_providers_key_variable(admin_user):
    response = _client(admin_user).post(ADD_URL, {**FORM, "api_key_env": "MY_PROVIDER_API_KEY"})
    assert response.status_code == 302
    assert Endpoint.objects.get(name="mine").api_key_env == "MY_PROVIDER_API_KEY"


def test_it_gives_the_same_answer_whether_or_not_a_variable_exists(admin_user, monkeypatch):
    monkeypatch.setenv("STUDIO_TEST_EXISTING_URL", "postgres://u:p@h/d")
    monkeypatch.delenv("STUDIO_TEST_MISSING_URL", raising=False)
    client = _client(admin_user)
    errors = [
        client.post(ADD_URL, {**FORM, "api_key_env": name}).context["adminform"].form.errors
        for name in ("STUDIO_TEST_EXISTING_URL", "STUDIO_TEST_MISSING_URL")
    ]
    assert errors[0] == errors[1]
    assert not Endpoint.objects.exists()
    # Nor do the form's help or errors list the server's variables.
    page = client.post(ADD_URL, {**FORM, "api_key_env": "NOPE"}).content.decode()
    assert "STUDIO_TEST_EXISTING_URL" not in page and "STUDIO_TEST_CHAT_KEY" not in page


def test_it_follows_the_operators_pattern_but_never_past_the_deny_list(
    admin_user, settings, monkeypatch
):
    client = _client(admin_user)
    settings.STUDIO_KEY_ENV_PATTERN = r"TEAM_[A-Z]+_TOKEN"  # narrower: _KEY names are out
    assert client.post(ADD_URL, {**FORM, "api_key_env": "MY_PROVIDER_API_KEY"}).status_code == 200
    assert client.post(ADD_URL, {**FORM, "api_key_env": "TEAM_VLLM_TOKEN"}).status_code == 302
    settings.STUDIO_KEY_ENV_PATTERN = r".*"  # wider: anything but the server's secrets
    for key_env in [*SECRETS, "DJANGO_SECRET_KEY", "REDIS_URL", "DEMO_PASSWORD", "secret_key"]:
        form = client.post(ADD_URL, {**FORM, "name": "wide", "api_key_env": key_env})
        assert form.status_code == 200, key_env
        assert not key_env_name_allowed(key_env)
    assert list(Endpoint.objects.values_list("api_key_env", flat=True)) == ["TEAM_VLLM_TOKEN"]
    # The same rule at use time: the row's variable is set, and still nothing is read.
    monkeypatch.setenv("SECRET_KEY", "django-secret-never-sent")
    Endpoint.objects.update(api_key_env="SECRET_KEY")
    assert endpoint_api_key(Endpoint.objects.get()) == ""


@pytest.mark.django_db
@pytest.mark.parametrize("key_env", ["SECRET_KEY", "DATABASE_URL"])
def test_it_sends_no_secret_from_a_row_written_past_the_rule(
    chat_server, chat_endpoint, monkeypatch, caplog, key_env
):
    # The real database URL (password included) when there is one; a marked SECRET_KEY.
    secret = (key_env == "DATABASE_URL" and os.environ.get(key_env)) or "django-secret-4f9a2c"
    monkeypatch.setenv(key_env, secret)
    Endpoint.objects.filter(id=chat_endpoint.id).update(api_key_env=key_env)
    with caplog.at_level(logging.WARNING, logger="studio.endpoints"):
        record_batch(
            policy="openai",
            model="test-vlm",
            endpoint=chat_endpoint.name,
            base_url=chat_endpoint.base_url,
            steps=1,
        )
    assert chat_server.requests, "the model call was made"
    received = "\n".join(
        f"{name}: {value}" for r in chat_server.requests for name, value in r.headers.items()
    )
    assert secret not in received
    assert {r.headers["authorization"] for r in chat_server.requests} == {"Bearer sk-no-key"}
    warnings = [r.getMessage() for r in caplog.records if r.name == "studio.endpoints"]
    assert warnings and all(secret not in w for w in warnings)
    assert f"key variable '{key_env}' is not allowed" in warnings[0]


def test_it_shows_no_key_needed_for_an_endpoint_without_a_key(admin_user, chat_endpoint):
    Endpoint.objects.create(name="ollama", base_url="http://127.0.0.1:11434/v1")
    Endpoint.objects.create(name="unset", base_url="http://127.0.0.1:9/v1", api_key_env="UNSET_KEY")
    Endpoint.objects.create(name="secret", base_url="http://127.0.0.1:9/v1")
    Endpoint.objects.filter(name="secret").update(api_key_env="SECRET_KEY")
    assert endpoint_key_set(Endpoint.objects.get(name="ollama")) is None
    page = _client(admin_user).get(LIST_URL).content.decode()
    assert _key_set_cell(page, "ollama") == "no key needed"
    assert "icon-yes" in _key_set_cell(page, chat_endpoint.name)
    assert "icon-no" in _key_set_cell(page, "unset")
    # SECRET_KEY exists on this server; the column does not say so.
    assert os.environ.get("SECRET_KEY") and "icon-no" in _key_set_cell(page, "secret")
