"""Model endpoints are named by an admin, and keys go only there.

A reviewer who could type any URL in the batch form would have the worker send the server's
key to it. These tests try that, with a listener of their own that must receive nothing, and run
the batches that are allowed on a real Celery worker against a real local server.
"""

from __future__ import annotations

import io
import json
import socket

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from rollouts.models import RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import BATCH_ENDS, record_batch
from rollouts.tests.openai_server import ChatServer
from studio.models import Endpoint
from studio.testing import wait_for_row

ENDPOINT_KEY = "sk-test-endpoint-key-0123456789"  # set by the chat_endpoint fixture


@pytest.fixture
def listener():
    """A reviewer's own server: it must never hear from the studio."""
    server = ChatServer().start()
    yield server
    server.stop()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


FORM = {"policy": "openai", "model": "test-vlm", "seeds": "0", "steps": 2, "image_size": 64}
FORM.update(history_frames=0)


def test_it_takes_no_url_from_the_batch_form(editor_client, chat_endpoint, listener):
    url = reverse("rollouts:batch_create")
    for attempt in (
        {"endpoint": listener.url},
        {"endpoint": "", "base_url": listener.url},
        {"endpoint": chat_endpoint.name, "base_url": listener.url},
    ):
        response = editor_client.post(url, {**FORM, **attempt})
        if response.status_code == 302:  # the URL field is ignored: the endpoint's URL is used
            batch = RolloutBatch.objects.get()
            assert batch.endpoint == chat_endpoint.base_url
            assert batch.settings["base_url"] == chat_endpoint.base_url
            batch.delete()
        else:
            assert response.status_code == 200
            assert "endpoint" in response.context["form"].errors
    assert RolloutBatch.objects.count() == 0
    page = editor_client.get(url).content.decode()
    assert 'name="base_url"' not in page and chat_endpoint.name in page
    assert listener.requests == []


def test_it_offers_only_enabled_chat_endpoints(editor_client, chat_endpoint, listener):
    Endpoint.objects.create(name="off", base_url=listener.url, enabled=False)
    Endpoint.objects.create(name="trainer", base_url=listener.url, kind=Endpoint.Kind.SYNTH)
    url = reverse("rollouts:batch_create")
    choices = [c[0] for c in editor_client.get(url).context["form"].fields["endpoint"].choices]
    assert [str(c) for c in choices] == ["", "local-test"]
    for name in ("off", "trainer"):
        response = editor_client.post(url, {**FORM, "endpoint": name})
        assert "endpoint" in response.context["form"].errors
    assert RolloutBatch.objects.count() == 0 and listener.requests == []


def test_it_refuses_a_model_the_endpoint_does_not_allow(editor_client, chat_endpoint):
    chat_endpoint.allowed_models = ["other-vlm"]
    chat_endpoint.save()
    response = editor_client.post(
        reverse("rollouts:batch_create"), {**FORM, "endpoint": chat_endpoint.name}
    )
    assert "'test-vlm' is not allowed" in response.context["form"].errors["model"][0]
    assert RolloutBatch.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_it_sends_the_key_only_to_the_chosen_endpoint_from_the_browser(
    client, editor, celery_worker, chat_server, chat_endpoint, listener, settings
):
    settings.OPENAI_API_KEY = "sk-server-wide-secret-999"
    chat_endpoint.concurrency = 3
    chat_endpoint.requests_per_minute = 6000
    chat_endpoint.save()
    client.force_login(editor)
    response = client.post(
        reverse("rollouts:batch_create"),
        {**FORM, "seeds": "0-1", "endpoint": chat_endpoint.name, "base_url": listener.url},
    )
    assert response.status_code == 302
    batch = wait_for_row(RolloutBatch.objects.get(), statuses=BATCH_ENDS, timeout=120)
    assert batch.status == RolloutBatch.Status.FINISHED, batch.error
    assert (batch.endpoint_name, batch.endpoint) == ("local-test", chat_server.url)
    # The endpoint's limits are the batch's defaults.
    assert (batch.settings["concurrency"], batch.settings["requests_per_minute"]) == (3, 6000)
    assert len(chat_server.requests) == 4
    assert {r.headers["authorization"] for r in chat_server.requests} == {f"Bearer {ENDPOINT_KEY}"}
    assert listener.requests == []
    assert ENDPOINT_KEY not in json.dumps(list(RolloutBatch.objects.values()), default=str)


@pytest.mark.django_db(transaction=True)
def test_it_sends_no_key_from_a_worker_to_a_url_no_endpoint_has(celery_worker, listener, settings):
    settings.OPENAI_API_KEY = "sk-server-wide-secret-999"
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "rollout",
        "--policy=openai",
        "--model=test-vlm",
        f"--base-url={listener.url}",
        "--seeds=0",
        "--steps=2",
        "--wait",
        stdout=out,
        stderr=err,
    )
    assert "workers send it no key" in err.getvalue()
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    assert summary["finished"] == 1
    assert {r.headers["authorization"] for r in listener.requests} == {"Bearer sk-no-key"}


def test_it_plays_inline_with_the_commands_own_key_for_its_own_url(
    transactional_db, listener, settings
):
    settings.OPENAI_API_KEY = "sk-operator-own-key-42"
    out = io.StringIO()
    call_command(
        "rollout",
        "--policy=openai",
        "--model=test-vlm",
        f"--base-url={listener.url}",
        "--seeds=0",
        "--steps=1",
        "--inline",
        stdout=out,
    )
    assert listener.requests[0].headers["authorization"] == "Bearer sk-operator-own-key-42"


def test_it_picks_an_endpoint_by_name_on_the_command_line(
    transactional_db, chat_server, chat_endpoint, listener, settings
):
    settings.OPENAI_API_KEY = "sk-server-wide-secret-999"
    chat_endpoint.concurrency = 2
    chat_endpoint.save()
    out = io.StringIO()
    call_command(
        "rollout",
        "--policy=openai",
        "--model=test-vlm",
        "--endpoint=local-test",
        "--seeds=0",
        "--steps=1",
        "--requests-per-minute=600",
        "--inline",
        stdout=out,
    )
    batch = RolloutBatch.objects.get(id=json.loads(out.getvalue().splitlines()[-1])["batch_id"])
    assert (batch.endpoint_name, batch.endpoint) == ("local-test", chat_server.url)
    assert (batch.settings["concurrency"], batch.settings["requests_per_minute"]) == (2, 600)
    # Inline or not, an endpoint's key is its own, never the command's.
    assert chat_server.requests[0].headers["authorization"] == f"Bearer {ENDPOINT_KEY}"
    assert listener.requests == []


@pytest.mark.django_db
def test_it_says_no_more_than_unreachable(chat_endpoint, settings):
    settings.STUDIO_OPENAI_CONNECT_ATTEMPTS = 2
    errors = []
    for name, base_url in (
        ("closed", f"http://127.0.0.1:{_closed_port()}/v1"),
        ("nowhere", "http://studio-no-such-host.invalid/v1"),
    ):
        Endpoint.objects.create(name=name, base_url=base_url)
        batch = record_batch(
            policy="openai", model="test-vlm", endpoint=name, base_url=base_url, steps=2
        )
        assert batch.status == RolloutBatch.Status.FAILED
        errors.append(batch.error)
    assert errors == [
        "model endpoint 'closed' is unreachable (2 attempts)",
        "model endpoint 'nowhere' is unreachable (2 attempts)",
    ]


@pytest.mark.django_db
def test_it_says_unreachable_for_a_connection_dropped_mid_episode(chat_server, chat_endpoint):
    from rollouts.tests import openai_server as replies

    chat_server.script(replies.tool_call("noop"), replies.closed())
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        steps=2,
        max_retries=0,
    )
    turn = batch.episodes.get().turns.get(index=1)
    assert (turn.error_kind, turn.error) == ("connection", "unreachable (after 0 retries)")


@pytest.mark.django_db
def test_it_fails_a_batch_whose_endpoint_moved_or_was_disabled(chat_endpoint, listener):
    settings = RolloutSettings(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        seeds=(0,),
        steps=1,
    )
    moved = services.batch_create(settings=settings, enqueue=False)
    chat_endpoint.base_url = listener.url
    chat_endpoint.save()
    services.episode_run(episode_id=moved.episodes.get().id)
    moved.refresh_from_db()
    assert moved.status == RolloutBatch.Status.FAILED
    assert "points elsewhere than when this batch was created" in moved.error
    disabled = services.batch_create(
        settings=RolloutSettings(**{**settings.to_json(), "base_url": listener.url}),
        enqueue=False,
    )
    Endpoint.objects.filter(id=chat_endpoint.id).update(enabled=False)
    services.episode_run(episode_id=disabled.episodes.get().id)
    disabled.refresh_from_db()
    assert "'local-test' is not enabled any more" in disabled.error
    assert listener.requests == []


@pytest.mark.django_db(transaction=True)
def test_it_exits_non_zero_when_a_waited_batch_failed(celery_worker, settings):
    Endpoint.objects.create(name="down", base_url=f"http://127.0.0.1:{_closed_port()}/v1")
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"2 of 2 episodes failed; model endpoint 'down'") as e:
        call_command(
            "rollout",
            "--policy=openai",
            "--model=test-vlm",
            "--endpoint=down",
            "--seeds=0-1",
            "--steps=5",
            "--wait",
            stdout=out,
        )
    assert e.value.returncode == 1
    assert json.loads(out.getvalue().strip().splitlines()[-1])["status"] == "failed"


@pytest.mark.django_db
def test_it_sends_an_endpoints_key_to_its_url_for_a_batch_without_its_name(
    chat_server, chat_endpoint, settings
):
    # E.g. a batch created before endpoints had names, resumed now.
    settings.OPENAI_API_KEY = "sk-server-wide-secret-999"
    batch = record_batch(policy="openai", model="test-vlm", base_url=chat_server.url, steps=1)
    assert batch.status == RolloutBatch.Status.FINISHED
    assert chat_server.requests[0].headers["authorization"] == f"Bearer {ENDPOINT_KEY}"


@pytest.mark.django_db
def test_it_follows_no_redirect_away_from_the_endpoint(chat_server, chat_endpoint, listener):
    from rollouts.tests import openai_server as replies

    redirect = replies.status(307, message="moved")
    redirect.headers = {"Location": f"{listener.url}/chat/completions"}
    chat_server.script(replies.tool_call("noop"), redirect)
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        steps=2,
    )
    assert batch.episodes.get().turns.get(index=1).error_kind == "http_307"
    assert listener.requests == []
