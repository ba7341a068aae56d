"""An admin who disables an endpoint (a leaked key, a bill running) stops its key at once.

An episode read its endpoint and key once, as it started: disabled 12 s into a 100-step
episode, 39 more requests carried the key and the episode finished. Here a real local
server logs every request with its headers while the endpoint is disabled mid-episode.
"""

from __future__ import annotations

import time

import pytest

from rollouts.models import Episode, RolloutBatch
from rollouts.policies.base import PolicyUnavailable
from rollouts.policies.endpoints import connection_check, model_connection
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import EndpointDisabler
from studio.models import Endpoint

KEY = "sk-test-endpoint-key-0123456789"  # set by the chat_endpoint fixture


def _settings(endpoint: Endpoint, **options) -> RolloutSettings:
    return RolloutSettings(
        policy="openai",
        model="test-vlm",
        endpoint=endpoint.name,
        base_url=endpoint.base_url,
        seeds=(0,),
        history_frames=0,
        **options,
    )


@pytest.mark.django_db(transaction=True)
def test_it_sends_the_key_at_most_once_after_the_endpoint_is_disabled(chat_server, chat_endpoint):
    chat_server.delay = 0.25  # a model taking its time: the disable lands mid-call
    batch = services.batch_create(settings=_settings(chat_endpoint, steps=30), enqueue=False)
    admin = EndpointDisabler(server=chat_server, endpoint=chat_endpoint, after_requests=3)

    outcome = services.episode_run(episode_id=batch.episodes.get().id)

    assert len(admin.requests_after(KEY)) <= 1
    assert outcome == "failed"
    batch.refresh_from_db()
    episode = batch.episodes.get()
    assert batch.status == RolloutBatch.Status.FAILED
    assert episode.status == Episode.Status.FAILED
    assert batch.error == episode.error == "endpoint 'local-test' was disabled by an admin"
    # The calls made before it were sent with the key, and played.
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in chat_server.requests)
    assert 3 <= len(chat_server.requests) <= 4
    assert episode.turns.count() >= 3


@pytest.mark.django_db(transaction=True)
def test_it_sends_no_retry_with_the_key_after_the_endpoint_is_disabled(chat_server, chat_endpoint):
    from rollouts.tests import openai_server as replies

    # Every answer a slow 503: the turn's retries are what would keep sending the key.
    chat_server.default = replies.slow(0.25, replies.status(503))
    batch = services.batch_create(
        settings=_settings(chat_endpoint, steps=3, max_retries=20), enqueue=False
    )
    admin = EndpointDisabler(server=chat_server, endpoint=chat_endpoint, after_requests=2)

    services.episode_run(episode_id=batch.episodes.get().id)

    assert len(admin.requests_after(KEY)) <= 1
    batch.refresh_from_db()
    assert batch.error == "endpoint 'local-test' was disabled by an admin"
    assert len(chat_server.requests) <= 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"enabled": False}, "endpoint 'local-test' was disabled by an admin"),
        (
            {"base_url": "http://127.0.0.1:9/v1"},
            "endpoint 'local-test' was moved to another URL by an admin",
        ),
        (
            {"api_key_env": "STUDIO_TEST_OTHER_KEY"},
            "endpoint 'local-test' was given another key by an admin",
        ),
        ({"kind": Endpoint.Kind.SYNTH}, "endpoint 'local-test' was removed by an admin"),
        (None, "endpoint 'local-test' was removed by an admin"),
    ],
)
def test_it_stops_the_key_when_an_admin_changes_where_it_goes(
    chat_endpoint, monkeypatch, change, error
):
    monkeypatch.setenv("STUDIO_TEST_OTHER_KEY", "sk-test-rotated-key-9876543210")
    connection = model_connection(_settings(chat_endpoint, steps=1))
    connection_check(connection, since=time.monotonic())  # as it was: the key may go
    if change is None:
        chat_endpoint.delete()
    else:
        Endpoint.objects.filter(id=chat_endpoint.id).update(**change)
    with pytest.raises(PolicyUnavailable) as stopped:
        connection_check(connection, since=time.monotonic())
    assert str(stopped.value) == error


@pytest.mark.django_db
def test_it_keeps_the_key_when_another_variable_holds_the_same_key(chat_endpoint, monkeypatch):
    monkeypatch.setenv("STUDIO_TEST_SAME_KEY", KEY)
    connection = model_connection(_settings(chat_endpoint, steps=1))
    Endpoint.objects.filter(id=chat_endpoint.id).update(
        api_key_env="STUDIO_TEST_SAME_KEY", concurrency=8
    )
    connection_check(connection, since=time.monotonic())  # raises nothing
    assert connection.api_key == KEY
