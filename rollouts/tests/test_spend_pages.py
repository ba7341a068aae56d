"""Every call counted and priced where people look: the batch page, the batch
list and `rollout`'s summary show model calls, tokens and spend for finished, failed and
canceled episodes alike; the batch form estimates a batch's cost before it starts."""

from __future__ import annotations

import io
import json
import re
from decimal import ROUND_HALF_UP, Decimal

import pytest
from django.core.management import call_command
from django.urls import reverse

from rollouts import selectors
from rollouts.models import Episode, RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch
from studio.models import Endpoint

pytestmark = pytest.mark.django_db


def _cell(page: str, attribute: str) -> list[str]:
    """The text of every element carrying `attribute`, tags stripped, spaces squeezed."""
    found = re.findall(rf"<(\w+)[^>]*\b{attribute}\b[^>]*>(.*?)</\1>", page, re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", inner).split()) for _tag, inner in found]


def _priced(endpoint: Endpoint, input_price: str, output_price: str) -> Endpoint:
    endpoint.input_price_per_million = Decimal(input_price)
    endpoint.output_price_per_million = Decimal(output_price)
    endpoint.save()
    return endpoint


def test_it_prices_every_call_the_server_received(chat_server, chat_endpoint, viewer_client):
    _priced(chat_endpoint, "3.00", "15.00")
    # Each answer bills 12,000 prompt and 600 completion tokens: by hand, 12,000 x 3 + 600 x 15
    # = 45,000 millionths of a dollar, $0.045 a call.
    chat_server.default = replies.Reply(
        tool_calls=[(replies.TOOL_NAME, '{"actions": ["noop"]}')], usage=(12_000, 600)
    )
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        seeds=(0, 1),
        steps=3,
    )
    calls = len(chat_server.requests)  # the server's own count, not the studio's
    assert calls == 6
    out = io.StringIO()
    call_command("rollout", "--cancel", str(batch.id), stdout=out, stderr=io.StringIO())
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert (summary["model_calls"], summary["prompt_tokens"]) == (calls, calls * 12_000)
    assert summary["completion_tokens"] == calls * 600
    assert summary["spend"] == 0.27  # 6 x $0.045

    page = viewer_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert "$0.27" in _cell(page, "data-spend")[0]
    assert "$3.00 input and $15.00 output per million tokens" in page  # the tooltip
    assert "prices as they are now" in page
    # Per episode: 3 calls, 36,000 + 1,800 tokens, $0.135 shown as $0.14.
    assert _cell(page, "data-model-calls") == ["3", "3"]
    assert _cell(page, "data-tokens") == ["37,800", "37,800"]
    assert _cell(page, "data-spend")[1:] == ["$0.14", "$0.14"]

    listing = viewer_client.get(reverse("rollouts:batch_list")).content.decode()
    assert _cell(listing, "data-spend") == ["$0.27"]
    assert _cell(listing, "data-model-calls") == ["6"]
    assert _cell(listing, "data-tokens") == ["75,600"]


def _model_batch(endpoint: Endpoint, *, model: str = "vlm-x", seeds=(0, 1, 2)) -> RolloutBatch:
    return services.batch_create(
        settings=RolloutSettings(
            policy="openai",
            model=model,
            endpoint=endpoint.name,
            base_url=endpoint.base_url,
            seeds=seeds,
            steps=10,
        ),
        enqueue=False,
    )


def _played(batch: RolloutBatch, seed: int, status: str, prompt: int, completion: int, calls: int):
    """What recording leaves on an episode that played (its counters written as it went)."""
    Episode.objects.filter(batch=batch, seed=seed).update(
        status=status,
        steps=calls,
        model_calls=calls,
        model_retries=1,
        model_errors=0 if status == "finished" else 1,
        prompt_tokens=prompt,
        completion_tokens=completion,
        error="" if status == "finished" else status,
    )


def test_it_shows_finished_failed_and_canceled_episodes_apart_with_their_spend(viewer_client):
    endpoint = _priced(
        Endpoint.objects.create(name="priced", base_url="http://127.0.0.1:9/v1"), "2.50", "10"
    )
    batch = _model_batch(endpoint)
    # By hand at 2.50 and 10 per million: 120,000 x 2.5 + 6,000 x 10 = 360,000 -> $0.36;
    # 50,000 x 2.5 + 2,500 x 10 = 150,000 -> $0.15; 30,000 x 2.5 + 1,500 x 10 -> $0.09.
    _played(batch, 0, "finished", 120_000, 6_000, 10)
    _played(batch, 1, "failed", 50_000, 2_500, 4)
    _played(batch, 2, "canceled", 30_000, 1_500, 3)
    RolloutBatch.objects.filter(id=batch.id).update(
        status="canceled",
        episodes_finished=1,
        episodes_failed=2,  # canceled episodes count among the failed, as the lead's counters do
        model_calls=17,
        model_errors=2,
        model_retries=3,
        prompt_tokens=200_000,
        completion_tokens=10_000,
    )
    page = viewer_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert _cell(page, "data-failed") == ["1 failed"]
    assert _cell(page, "data-canceled") == ["1 canceled"]
    assert _cell(page, "data-spend")[0].startswith("Spend $0.60")  # 0.36 + 0.15 + 0.09
    assert _cell(page, "data-spend")[1:] == ["$0.36", "$0.15", "$0.09"]
    assert _cell(page, "data-model-calls") == [
        "10 +1 retry",
        "4 1 err +1 retry",
        "3 1 err +1 retry",
    ]
    assert "17" in _cell(page, "data-model-totals")[0]
    assert 'class="badge status-canceled">canceled' in page

    listing = viewer_client.get(reverse("rollouts:batch_list")).content.decode()
    assert (_cell(listing, "data-failed"), _cell(listing, "data-canceled")) == (["1"], ["1"])
    assert _cell(listing, "data-spend") == ["$0.60"]
    assert _cell(listing, "data-model-calls") == ["17 2 err · 3 retr"]

    summary = selectors.batch_summary(batch=batch)
    assert {k: summary[k] for k in ("finished", "failed", "canceled", "spend")} == {
        "finished": 1,
        "failed": 1,
        "canceled": 1,
        "spend": 0.6,
    }
    assert (summary["model_calls"], summary["model_retries"]) == (17, 3)
    assert (summary["prompt_tokens"], summary["completion_tokens"]) == (200_000, 10_000)


def test_it_says_no_prices_set_and_leaves_spend_out_of_the_summary(viewer_client):
    batch = _model_batch(Endpoint.objects.create(name="unpriced", base_url="http://127.0.0.1:9/v1"))
    RolloutBatch.objects.filter(id=batch.id).update(prompt_tokens=1_000, completion_tokens=10)
    page = viewer_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert _cell(page, "data-spend")[0].startswith("Spend no prices set")
    listing = viewer_client.get(reverse("rollouts:batch_list")).content.decode()
    assert _cell(listing, "data-spend") == ["no prices set"]
    summary = selectors.batch_summary(batch=batch)
    assert "spend" not in summary
    assert {"model_calls", "model_retries", "prompt_tokens", "completion_tokens"} <= set(summary)


def _estimate(client, **values) -> str:
    # What the form sends (htmx includes every enabled field; image_size always has a value).
    response = client.get(reverse("rollouts:batch_estimate"), {"image_size": "64", **values})
    assert response.status_code == 200
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split())


def test_it_estimates_a_batch_from_the_models_earlier_calls(editor_client):
    endpoint = _priced(
        Endpoint.objects.create(name="priced", base_url="http://127.0.0.1:9/v1"), "2.50", "10"
    )
    earlier = _model_batch(endpoint, model="vlm-x")
    RolloutBatch.objects.filter(id=earlier.id).update(
        model_calls=10, prompt_tokens=15_005, completion_tokens=800
    )
    form = {"policy": "openai", "model": "vlm-x", "endpoint": "priced", "seeds": "0-9"}
    # 10 episodes x 64 steps = 640 calls of 1,500.5 prompt and 80 completion tokens each:
    # 960,320 x 2.50 + 51,200 x 10 millionths = 2.4008 + 0.512 = $2.9128.
    text = _estimate(editor_client, **form, steps="64")
    assert "about $2.91 for up to 640 model calls (10 episodes \u00d7 64 steps" in text
    assert "960,320 prompt + 51,200 completion tokens" in text
    assert "the mean of vlm-x's 10 calls in 1 earlier batch" in text
    assert "$2.50 input and $10.00 output per million tokens" in text
    # The form changed: two samples of each seed, twice the calls.
    assert "about $5.83 for up to 1,280 model calls" in _estimate(
        editor_client, **form, steps="64", samples_per_seed="2"
    )


def test_it_states_its_guess_for_a_model_never_played(editor_client):
    _priced(Endpoint.objects.create(name="priced", base_url="http://127.0.0.1:9/v1"), "3", "15")
    text = _estimate(
        editor_client,
        policy="openai",
        model="new-model",
        endpoint="priced",
        seeds="0-1",
        steps="10",
        history_frames="1",
    )
    # The guess: 1,000 + 85 x 2 images = 1,170 prompt and 100 completion tokens a call; 20
    # calls: 23,400 x 3 + 2,000 x 15 = 100,200 millionths, $0.1002.
    assert "about $0.10 for up to 20 model calls" in text
    assert "A guess: no earlier batch of new-model made a call" in text
    assert "1,170 prompt + 100 completion tokens" in text
    assert "85 per image shown" in text


def test_it_estimates_tokens_without_prices_and_nothing_for_a_baseline(editor_client):
    Endpoint.objects.create(name="unpriced", base_url="http://127.0.0.1:9/v1")
    text = _estimate(
        editor_client, policy="openai", model="m", endpoint="unpriced", seeds="0", steps="5"
    )
    assert "no price, for up to 5 model calls" in text
    assert "Endpoint unpriced has no prices" in text
    assert "calls no model" in _estimate(editor_client, policy="scripted", seeds="0", steps="5")
    # Not yet: the box names each field still wrong.
    wrong = _estimate(editor_client, policy="openai", seeds="x")
    assert "shows once these are corrected:" in wrong and "Seeds : " in wrong
    assert "Model : The openai policy needs a model name." in wrong


def test_the_form_asks_for_its_estimate_and_only_editors_may(client, editor, viewer):
    client.force_login(editor)
    page = client.get(reverse("rollouts:batch_create")).content.decode()
    assert f'hx-get="{reverse("rollouts:batch_estimate")}"' in page
    client.force_login(viewer)
    assert client.get(reverse("rollouts:batch_estimate")).status_code == 403


def test_a_canceled_batch_prices_every_request_the_server_received(
    celery_worker, chat_server, chat_endpoint, client, viewer
):
    from studio.testing import wait_until

    _priced(chat_endpoint, "3.00", "15.00")
    chat_server.delay = 0.2
    chat_server.default = replies.Reply(
        tool_calls=[(replies.TOOL_NAME, '{"actions": ["noop"]}')], usage=(12_000, 600)
    )
    batch = services.batch_create(
        settings=RolloutSettings(
            policy="openai",
            model="test-vlm",
            endpoint=chat_endpoint.name,
            base_url=chat_endpoint.base_url,
            seeds=tuple(range(4)),
            steps=200,
            concurrency=2,
        )
    )
    wait_until(lambda: len(chat_server.requests) >= 6, timeout=60, what="6 model calls")
    out = io.StringIO()
    # `rollout --cancel` returns once no episode plays on: its summary counts every call.
    call_command("rollout", "--cancel", str(batch.id), stdout=out, stderr=io.StringIO())
    summary = json.loads(out.getvalue().splitlines()[-1])
    received = len(chat_server.requests)  # the server's own count
    assert (summary["model_calls"], summary["canceled"], summary["failed"]) == (received, 4, 0)
    # $0.045 a call (12,000 x 3 + 600 x 15 millionths), every call received.
    assert summary["spend"] == float(Decimal("0.045") * received)

    client.force_login(viewer)
    page = client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert _cell(page, "data-canceled") == ["4 canceled"]
    cents = (Decimal("0.045") * received).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    assert _cell(page, "data-spend")[0].startswith(f"Spend ${cents}")
    per_episode = Episode.objects.filter(batch=batch).order_by("seed")
    assert sum(e.model_calls for e in per_episode) == received
    assert _cell(page, "data-model-calls") == [str(e.model_calls) for e in per_episode]


def test_the_estimate_shows_a_hostile_model_name_as_text(editor_client):
    Endpoint.objects.create(name="unpriced", base_url="http://127.0.0.1:9/v1")
    response = editor_client.get(
        reverse("rollouts:batch_estimate"),
        {
            "policy": "openai",
            "model": '<img src=x onerror="alert(1)">',
            "endpoint": "unpriced",
            "seeds": "0",
            "steps": "5",
            "image_size": "64",
        },
    )
    page = response.content.decode()
    assert "<img" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
