"""Project-level behaviour: settings from the environment, the demo set-up."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

from rollouts.models import Episode, RolloutBatch
from studio.models import Endpoint
from studio.testing import manage


def test_it_refuses_to_start_without_a_secret_key_when_debug_is_off():
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


@pytest.mark.django_db
def test_it_sets_up_the_demo_once(monkeypatch, capsys):
    monkeypatch.setenv("DEMO_PASSWORD", "demo-pass-123")
    call_command("demo_setup")
    out = capsys.readouterr().out
    assert "Created superuser demo" in out
    assert "demo-pass-123" not in out
    assert authenticate(username="demo", password="demo-pass-123").is_superuser
    batch = RolloutBatch.objects.get()
    assert batch.seeds == [0, 1, 2, 3]
    assert set(batch.episodes.values_list("status", flat=True)) == {Episode.Status.FINISHED}
    # The batch form has an endpoint to offer: a local model server, no key.
    endpoint = Endpoint.objects.get(name="local")
    assert (endpoint.kind, endpoint.base_url, endpoint.api_key_env) == (
        "chat",
        "http://127.0.0.1:11434/v1",
        "",
    )
    monkeypatch.delenv("DEMO_PASSWORD")
    call_command("demo_setup")
    assert RolloutBatch.objects.count() == 1
    assert "to set its password: DEMO_PASSWORD=... make demo" in capsys.readouterr().out
    monkeypatch.setenv("DEMO_PASSWORD", "another-pass-456")
    call_command("demo_setup")
    assert "password is now DEMO_PASSWORD" in capsys.readouterr().out
    assert authenticate(username="demo", password="another-pass-456") is not None
    assert Endpoint.objects.filter(name="local").count() == 1


def test_it_requires_login_everywhere_but_the_login_page(client, db):
    for url in ["/rollouts/", "/admin/", "/frames/" + "0" * 64 + ".png"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert "/login/" in response["Location"]
    assert client.get("/login/").status_code == 200
