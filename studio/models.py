"""Endpoints an admin has named: the only places a key is ever sent to; and what every job
row a worker claims has in common."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from studio.key_names import key_env_name_validate
from studio.model_names import (
    ALLOWED_MODELS_HELP,
    AllowedModelsValid,
    allowed_model_names,
    allowed_models_problem,
)

ENV_VAR_NAME = RegexValidator(
    r"^[A-Za-z_][A-Za-z0-9_]*$", "An environment variable name, such as OPENAI_API_KEY."
)

# A price per million tokens past this is a typo (a price per token, an extra zero), not a
# model: the dearest listed ones cost hundreds. Prices are stored to a millionth.
PRICE_PER_MILLION_MAX = Decimal(10_000)


def _price_field(which: str) -> models.DecimalField:
    return models.DecimalField(
        f"{which} price per million tokens",
        max_digits=11,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(PRICE_PER_MILLION_MAX)],
        help_text=f"What the provider bills for a million {which} "
        f"({'prompt' if which == 'input' else 'completion'}) tokens, in US dollars, "
        "e.g. 2.50; from 0 to 10,000. Empty: unknown, and no spend is shown.",
    )


# Endpoint kinds declared by later apps (a training provider's), beyond `Endpoint.Kind`.
_KINDS_ADDED: dict[str, str] = {}


def endpoint_kind_add(name: str, label: str) -> None:
    """A later app's kind of endpoint (training.providers registers each provider's)."""
    _KINDS_ADDED[name] = label


def endpoint_kind_remove(name: str) -> None:
    _KINDS_ADDED.pop(name, None)


def endpoint_kind_choices() -> list[tuple[str, str]]:
    """`Endpoint.kind`'s choices: a callable, so that a new provider needs no migration."""
    known = list(Endpoint.Kind.choices)
    names = {name for name, _ in known}
    return known + [(name, label) for name, label in _KINDS_ADDED.items() if name not in names]


class Endpoint(models.Model):
    """A model server or training provider, its base URL and where its key comes from.

    The key itself never enters the database: only the *name* of the environment variable
    that holds it on the workers. A key is sent to this base URL and nowhere else, so a user
    who may only pick an endpoint cannot point the server's key at a listener of their own.
    """

    class Kind(models.TextChoices):
        CHAT = "chat", "Model endpoint (chat completions)"
        SYNTH = "synth", "Training: synth learning API"
        OPENAI = "openai", "Training: OpenAI-compatible fine-tuning"

    name = models.SlugField(max_length=60, unique=True)
    kind = models.CharField(max_length=20, choices=endpoint_kind_choices, default=Kind.CHAT)
    base_url = models.URLField(max_length=500)
    api_key_env = models.CharField(
        "key variable",
        max_length=100,
        blank=True,
        validators=[ENV_VAR_NAME, key_env_name_validate],
        help_text="Name of the environment variable that holds the key on the workers "
        "(e.g. OPENAI_API_KEY); never the key itself. It must match STUDIO_KEY_ENV_PATTERN "
        "(by default, names ending in _KEY) and not be one of the server's own secrets. "
        "Empty: no key is sent.",
    )
    allowed_models = models.JSONField(default=list, blank=True, help_text=ALLOWED_MODELS_HELP)
    concurrency = models.PositiveIntegerField(
        default=4, help_text="Default for model requests in flight, across all workers."
    )
    requests_per_minute = models.PositiveIntegerField(
        default=0, help_text="Default limit across all workers; 0 = no limit."
    )
    # Spend shown on the batch pages and in `rollout`'s summary (studio.spend): both or none.
    input_price_per_million = _price_field("input")
    output_price_per_million = _price_field("output")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(concurrency__gte=1) & Q(concurrency__lte=256),
                name="endpoint_concurrency_range",
            ),
            models.CheckConstraint(
                condition=(
                    Q(input_price_per_million__isnull=True)
                    & Q(output_price_per_million__isnull=True)
                )
                | (
                    # NOT NULL said outright: a CHECK passes when it comes out NULL.
                    Q(input_price_per_million__isnull=False)
                    & Q(output_price_per_million__isnull=False)
                    & Q(input_price_per_million__gte=0)
                    & Q(input_price_per_million__lte=PRICE_PER_MILLION_MAX)
                    & Q(output_price_per_million__gte=0)
                    & Q(output_price_per_million__lte=PRICE_PER_MILLION_MAX)
                ),
                name="endpoint_prices_both_in_range",
            ),
            models.CheckConstraint(
                condition=AllowedModelsValid("allowed_models"), name="endpoint_allowed_models_names"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        super().clean()
        errors = {}
        # Here, not as the field's validator: Django skips those for `null` and `{}`.
        problem = allowed_models_problem(self.allowed_models)
        if problem is not None:
            errors["allowed_models"] = problem
        # One price without the other would show a spend that leaves out half the tokens.
        prices = {
            "input_price_per_million": self.input_price_per_million,
            "output_price_per_million": self.output_price_per_million,
        }
        missing = [name for name, price in prices.items() if price is None]
        if len(missing) == 1:
            errors[missing[0]] = "Give both prices (input and output), or leave both empty."
        if errors:
            raise ValidationError(errors)

    def allows_model(self, model: str) -> bool:
        names = allowed_model_names(self.allowed_models)
        return names is not None and (not names or model in names)


class LoginFailure(models.Model):
    """A failed login, for the rate limit of `studio.login_throttle`; kept only while it counts."""

    username = models.CharField(max_length=150, db_index=True)
    address = models.CharField(max_length=45, db_index=True)
    at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.username} from {self.address} at {self.at:%Y-%m-%d %H:%M:%S}"


class ClaimedJob(models.Model):
    """What every long job's row has: its status, the claim a worker holds on it, when its
    message left, who asked for it and when it ran. The row, not the broker, is the truth;
    `studio.claims` claims, renews and ends it. Progress counters are each job's own."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True)
    claim_token = models.CharField(max_length=64, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When a message was last handed to the broker; null: never (the broker was down).
    enqueued_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
