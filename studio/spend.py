"""What model calls cost: tokens times an endpoint's prices per million tokens.

The one place spend is computed, for the batch pages, the batch list, `rollout`'s summary and
the batch form's estimate. Decimal throughout: a price of 0.15 per million tokens times
a billion tokens is 150.00, not 149.99999999999997. Django-free: prices come in as Decimals.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

MILLION = Decimal(1_000_000)
# The summary's JSON carries spend to a millionth of a dollar (a few tokens of a cheap model).
JSON_PLACES = Decimal("0.000001")
CENT = Decimal("0.01")
# Below a cent the pages show four places: a short batch of a cheap model costs fractions
# of a cent, and "$0.00" would read as free.
SMALL_PLACES = Decimal("0.0001")


@dataclass(frozen=True)
class Prices:
    """US dollars per million input (prompt) and output (completion) tokens."""

    input_per_million: Decimal
    output_per_million: Decimal

    def __post_init__(self) -> None:
        for price in (self.input_per_million, self.output_per_million):
            if not isinstance(price, Decimal) or not price.is_finite() or price < 0:
                raise ValueError(f"a price is a finite Decimal of at least 0, not {price!r}")


def prices_of(endpoint: Any) -> Prices | None:
    """An endpoint's prices, or None when it has none (or only one: unknown is unknown)."""
    if endpoint is None:
        return None
    prices = (endpoint.input_price_per_million, endpoint.output_price_per_million)
    if any(price is None for price in prices):
        return None
    return Prices(Decimal(prices[0]), Decimal(prices[1]))


def spend(
    *, prompt_tokens: int | Decimal, completion_tokens: int | Decimal, prices: Prices
) -> Decimal:
    """Dollars for these tokens, exact (no rounding: `scaleb` moves the decimal point)."""
    cost = prompt_tokens * prices.input_per_million + completion_tokens * prices.output_per_million
    return Decimal(cost).scaleb(-6)


def spend_or_none(
    *, prompt_tokens: int | Decimal, completion_tokens: int | Decimal, prices: Prices | None
) -> Decimal | None:
    if prices is None:
        return None
    return spend(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, prices=prices)


def spend_json(value: Decimal) -> float:
    """For a JSON line: rounded to a millionth; the float prints those very digits."""
    return float(value.quantize(JSON_PLACES, rounding=ROUND_HALF_UP))


def spend_text(value: Decimal | None) -> str:
    """For the pages: "$12.35", "$0.0042"; "—" when unknown."""
    if value is None:
        return "—"
    places = CENT if value >= CENT or value == 0 else SMALL_PLACES
    return f"${value.quantize(places, rounding=ROUND_HALF_UP):,}"


def price_text(price: Decimal) -> str:
    """A price per million tokens as an admin would write it: "2.50", "0.075", "10.00"."""
    price = price.normalize()
    if price.as_tuple().exponent > -2:  # type: ignore[operator]
        price = price.quantize(CENT)
    return f"{price:f}"


@dataclass(frozen=True)
class TokensPerCall:
    """Mean prompt and completion tokens per model call, and where the means come from."""

    prompt: Decimal
    completion: Decimal
    calls: int  # the calls they were measured on; 0: a guess
    batches: int = 0


@dataclass(frozen=True)
class SpendEstimate:
    calls: int
    prompt_tokens: Decimal
    completion_tokens: Decimal
    spend: Decimal | None  # None: the endpoint has no prices


def spend_estimate(
    *, episodes: int, steps: int, per_call: TokensPerCall, prices: Prices | None
) -> SpendEstimate:
    """A batch's cost before it starts: one call per step of every episode (a turn may play
    several actions, so fewer calls are made; retries add some), each of the mean tokens."""
    calls = episodes * steps
    prompt_tokens = calls * per_call.prompt
    completion_tokens = calls * per_call.completion
    return SpendEstimate(
        calls=calls,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        spend=spend_or_none(
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, prices=prices
        ),
    )


# With no earlier batch of the model to measure, the form's estimate says it guesses these:
# the system prompt (~2,400 characters) and a turn's text observation come to about 1,000
# tokens, an image at detail "low" (or a small frame at "auto") costs 85, an answer with
# its tool call about 100.
GUESS_PROMPT_TOKENS = 1_000
GUESS_IMAGE_TOKENS = 85
GUESS_COMPLETION_TOKENS = 100


GUESS_TEXT = (
    f"{GUESS_PROMPT_TOKENS:,} prompt tokens for the instructions and the text observation, "
    f"{GUESS_IMAGE_TOKENS} per image shown, and {GUESS_COMPLETION_TOKENS} completion tokens"
)


def tokens_per_call_guess(*, images: int) -> TokensPerCall:
    return TokensPerCall(
        prompt=Decimal(GUESS_PROMPT_TOKENS + GUESS_IMAGE_TOKENS * images),
        completion=Decimal(GUESS_COMPLETION_TOKENS),
        calls=0,
    )
