"""Reads for what model calls cost: an endpoint's prices, a batch's and its episodes' spend as
the batch pages show it, and the batch form's estimate. The arithmetic is `studio.spend`'s."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, Sum

from rollouts.models import Episode, RolloutBatch
from rollouts.policies import kinds
from rollouts.rollout_settings import RolloutSettings
from studio.models import Endpoint
from studio.spend import (
    GUESS_TEXT,
    Prices,
    SpendEstimate,
    TokensPerCall,
    price_text,
    prices_of,
    spend_estimate,
    spend_or_none,
    spend_text,
    tokens_per_call_guess,
)


def endpoint_prices(*, name: str) -> Prices | None:
    """The prices an admin set on the named model endpoint, as they are now."""
    if not name:
        return None
    return prices_of(Endpoint.objects.filter(name=name, kind=Endpoint.Kind.CHAT).first())


def batch_prices(*, batch: RolloutBatch) -> Prices | None:
    """The batch's endpoint's prices as they are *now*, not when it played (the batch keeps
    no copy): a batch played at an earlier price shows what it would cost today. A batch sent
    to a URL no endpoint names has none."""
    return endpoint_prices(name=batch.endpoint_name)


def batch_spend(*, batch: RolloutBatch, prices: Prices | None) -> Decimal | None:
    return spend_or_none(
        prompt_tokens=batch.prompt_tokens,
        completion_tokens=batch.completion_tokens,
        prices=prices,
    )


def spend_shown(*, value: Decimal | None, prices: Prices | None) -> dict[str, str]:
    """Spend as the pages show it, with the tooltip that says where the prices come from."""
    if prices is None:
        return {
            "text": "no prices set",
            "title": "The endpoint has no prices: an admin sets them under Admin, Endpoints.",
        }
    return {
        "text": spend_text(value),
        "title": "At the endpoint's prices as they are now (not when it played): "
        f"${price_text(prices.input_per_million)} input and "
        f"${price_text(prices.output_per_million)} output per million tokens",
    }


def episodes_with_spend(episodes: Iterable[Episode], *, prices: Prices | None) -> list[Episode]:
    """The episodes, each with `spend` (Decimal, or None without prices) and `spend_text`."""
    rows = list(episodes)
    for episode in rows:
        episode.spend = spend_or_none(
            prompt_tokens=episode.prompt_tokens,
            completion_tokens=episode.completion_tokens,
            prices=prices,
        )
        episode.spend_text = spend_text(episode.spend)
    return rows


def batches_with_spend(batches: Iterable[RolloutBatch]) -> list[RolloutBatch]:
    """A page of the batch list, each batch with `spend_shown` (see `batches_with_progress`,
    which annotates the prices and the canceled episodes)."""
    rows = list(batches)
    for batch in rows:
        prices = None
        if batch.input_price is not None and batch.output_price is not None:
            prices = Prices(batch.input_price, batch.output_price)
        batch.spend_shown = spend_shown(
            value=batch_spend(batch=batch, prices=prices), prices=prices
        )
        # The batch's counter `episodes_failed` holds its canceled episodes too.
        batch.failed_only = max(batch.episodes_failed - batch.canceled, 0)
        total = batch.episodes_total or 1
        batch.canceled_percent = round(100 * batch.canceled / total, 2)
        batch.failed_only_percent = round(100 * batch.failed_only / total, 2)
    return rows


@dataclass(frozen=True)
class BatchEstimate:
    """What the batch form says a batch would cost before it starts."""

    episodes: int
    steps: int
    model: str
    endpoint: str
    per_call: TokensPerCall  # measured (calls > 0) or the stated guess (calls == 0)
    estimate: SpendEstimate
    prices: Prices | None

    @property
    def spend_text(self) -> str:
        return spend_text(self.estimate.spend)

    @property
    def guess_text(self) -> str:
        return GUESS_TEXT

    @property
    def prices_text(self) -> str:
        if self.prices is None:
            return ""
        return (
            f"${price_text(self.prices.input_per_million)} input and "
            f"${price_text(self.prices.output_per_million)} output per million tokens"
        )


def batch_estimate(*, settings: RolloutSettings) -> BatchEstimate | None:
    """Episodes x steps x the mean tokens per call of this model's earlier batches (or a stated
    guess), times the endpoint's prices; None for a policy that calls no model."""
    if not kinds.calls_model(settings.policy):
        return None
    images = kinds.images_per_call(settings)
    per_call = model_tokens_per_call(model=settings.model) or tokens_per_call_guess(images=images)
    prices = endpoint_prices(name=settings.endpoint)
    episodes = len(settings.seeds) * settings.samples_per_seed
    return BatchEstimate(
        episodes=episodes,
        steps=settings.steps,
        model=settings.model,
        endpoint=settings.endpoint,
        per_call=per_call,
        estimate=spend_estimate(
            episodes=episodes, steps=settings.steps, per_call=per_call, prices=prices
        ),
        prices=prices,
    )


def model_tokens_per_call(*, model: str) -> TokensPerCall | None:
    """Mean prompt and completion tokens per call over every earlier batch of this model
    (whatever its endpoint), or None when none made a call."""
    totals = RolloutBatch.objects.filter(
        policy__in=kinds.model_policy_names(), model=model, model_calls__gt=0
    ).aggregate(
        calls=Sum("model_calls"),
        prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"),
        batches=Count("id"),
    )
    if not totals["calls"]:
        return None
    calls = Decimal(totals["calls"])
    return TokensPerCall(
        prompt=Decimal(totals["prompt"]) / calls,
        completion=Decimal(totals["completion"]) / calls,
        calls=totals["calls"],
        batches=totals["batches"],
    )
