"""Spend: tokens times an endpoint's prices per million tokens, in Decimal; prices an admin
sets, hostile or absurd ones refused."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.test import Client

from studio.models import Endpoint
from studio.spend import (
    Prices,
    TokensPerCall,
    prices_of,
    spend,
    spend_estimate,
    spend_json,
    spend_text,
    tokens_per_call_guess,
)

ADD_URL = "/admin/studio/endpoint/add/"
FORM = {
    "name": "priced",
    "kind": "chat",
    "base_url": "http://127.0.0.1:9/v1",
    "allowed_models": "[]",
    "concurrency": 4,
    "requests_per_minute": 0,
    "enabled": "on",
}


def test_it_computes_spend_from_tokens_and_prices_per_million():
    # By hand: 1,234,567 x 2.50 = 3,086,417.5 -> 3.0864175; 89,012 x 10 = 890,120 -> 0.89012;
    # together 3.9765375 dollars.
    prices = Prices(Decimal("2.50"), Decimal("10.00"))
    value = spend(prompt_tokens=1_234_567, completion_tokens=89_012, prices=prices)
    assert value == Decimal("3.9765375")
    assert spend_text(value) == "$3.98"
    assert spend_json(value) == 3.976538


def test_it_has_no_float_drift():
    # A million tokens each at 0.1 and 0.2: 0.3 exactly (floats make 0.30000000000000004).
    value = spend(
        prompt_tokens=1_000_000,
        completion_tokens=1_000_000,
        prices=Prices(Decimal("0.1"), Decimal("0.2")),
    )
    assert value == Decimal("0.3")
    assert str(spend_json(value)) == "0.3"
    # 0.15 per million over a billion tokens: 150 dollars, not 149.99999999999997.
    big = spend(
        prompt_tokens=1_000_000_000, completion_tokens=0, prices=Prices(Decimal("0.15"), Decimal(0))
    )
    assert (big, spend_text(big)) == (Decimal("150"), "$150.00")


def test_it_shows_small_spend_to_a_hundredth_of_a_cent():
    # 4,200 prompt tokens at 0.15 and 300 completion tokens at 0.60: 0.00063 + 0.00018.
    value = spend(
        prompt_tokens=4_200, completion_tokens=300, prices=Prices(Decimal("0.15"), Decimal("0.60"))
    )
    assert value == Decimal("0.00081")
    assert spend_text(value) == "$0.0008"
    assert spend_text(Decimal(0)) == "$0.00"
    assert spend_text(None) == "—"
    assert spend_text(Decimal("1234.5")) == "$1,234.50"


def test_it_refuses_prices_that_are_not_finite_or_below_zero():
    for bad in (Decimal("NaN"), Decimal("Infinity"), Decimal("-0.01"), 2.5):
        with pytest.raises(ValueError):
            Prices(bad, Decimal(1))


def test_it_estimates_episodes_times_steps_times_tokens_per_call():
    # 10 episodes x 64 steps = 640 calls; 640 x 1,500.5 = 960,320 prompt tokens at 2.50 =
    # 2.4008; 640 x 80 = 51,200 completion tokens at 10 = 0.512; 2.9128 in all.
    estimate = spend_estimate(
        episodes=10,
        steps=64,
        per_call=TokensPerCall(prompt=Decimal("1500.5"), completion=Decimal(80), calls=7),
        prices=Prices(Decimal("2.50"), Decimal("10")),
    )
    assert estimate.calls == 640
    assert (estimate.prompt_tokens, estimate.completion_tokens) == (960_320, 51_200)
    assert estimate.spend == Decimal("2.9128")
    unpriced = spend_estimate(
        episodes=1, steps=1, per_call=tokens_per_call_guess(images=2), prices=None
    )
    # The stated guess: 1,000 prompt tokens plus 85 an image, 100 completion tokens.
    assert (unpriced.prompt_tokens, unpriced.completion_tokens, unpriced.spend) == (1170, 100, None)


@pytest.mark.django_db
def test_an_endpoint_without_both_prices_has_none():
    endpoint = Endpoint(name="x", base_url="http://127.0.0.1:9/v1")
    assert prices_of(endpoint) is None
    endpoint.input_price_per_million = Decimal("1.25")
    assert prices_of(endpoint) is None
    endpoint.output_price_per_million = Decimal("5")
    assert prices_of(endpoint) == Prices(Decimal("1.25"), Decimal("5"))


@pytest.fixture
def admin_client(admin_user: User) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.mark.django_db
def test_it_saves_prices_an_admin_gives(admin_client):
    response = admin_client.post(
        ADD_URL, {**FORM, "input_price_per_million": "2.50", "output_price_per_million": "10"}
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    endpoint = Endpoint.objects.get(name="priced")
    assert (endpoint.input_price_per_million, endpoint.output_price_per_million) == (
        Decimal("2.5"),
        Decimal("10"),
    )
    # Without prices is fine too: spend is then "unknown".
    response = admin_client.post(ADD_URL, {**FORM, "name": "free-of-prices"})
    assert response.status_code == 302
    assert Endpoint.objects.get(name="free-of-prices").input_price_per_million is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("input_price", "output_price", "field"),
    [
        ("-1", "1", "input_price_per_million"),
        ("1", "-0.000001", "output_price_per_million"),
        ("NaN", "1", "input_price_per_million"),
        ("1", "Infinity", "output_price_per_million"),
        ("-Infinity", "1", "input_price_per_million"),
        ("1e400", "1", "input_price_per_million"),
        ("10000.000001", "1", "input_price_per_million"),
        ("1", "10001", "output_price_per_million"),
        ("99999999999999999999", "1", "input_price_per_million"),
        ("0.0000001", "1", "input_price_per_million"),  # past a millionth
        ("2,50", "1", "input_price_per_million"),
        ("<script>", "1", "input_price_per_million"),
        ("2.5", "", "output_price_per_million"),  # one price without the other
        ("", "10", "input_price_per_million"),
    ],
)
def test_it_refuses_hostile_or_absurd_prices_in_the_admin(
    admin_client, input_price, output_price, field
):
    response = admin_client.post(
        ADD_URL,
        {**FORM, "input_price_per_million": input_price, "output_price_per_million": output_price},
    )
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not Endpoint.objects.exists()


@pytest.mark.django_db
def test_the_database_refuses_a_price_written_past_the_form():
    for prices in ((Decimal(-1), Decimal(1)), (Decimal(1), None), (Decimal(10_001), Decimal(1))):
        with pytest.raises(IntegrityError), transaction.atomic():
            Endpoint.objects.create(
                name="raw",
                base_url="http://127.0.0.1:9/v1",
                input_price_per_million=prices[0],
                output_price_per_million=prices[1],
            )
