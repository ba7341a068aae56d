"""The policy options of `rollout` and `fork_episode`: declared once, read into RolloutSettings."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

from rollouts.rollout_settings import (
    DEFAULT_SCRIPT,
    IMAGE_DETAILS,
    OBSERVATION_MODES,
    ON_BAD_OUTPUT,
    RolloutSettings,
)


def add_policy_arguments(parser, *, policies: tuple[str, ...], steps_default: int | None) -> None:
    parser.add_argument("--policy", choices=policies)
    parser.add_argument("--model", default="", help="model name (openai policy)")
    parser.add_argument(
        "--base-url", default="", help="OpenAI-compatible endpoint; default OPENAI_BASE_URL"
    )
    parser.add_argument("--steps", type=int, default=steps_default)
    parser.add_argument("--actions", nargs="+", default=list(DEFAULT_SCRIPT))
    parser.add_argument(
        "--history-frames", type=int, default=0, help="also show the last K frames (0-9)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="most model requests in flight per endpoint, across all workers",
    )
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--image-detail", choices=IMAGE_DETAILS, default="auto")
    parser.add_argument("--observation-mode", choices=OBSERVATION_MODES, default="image_text")
    parser.add_argument(
        "--on-bad-output",
        choices=ON_BAD_OUTPUT,
        default="noop",
        help="after a failed call or unusable answer: play noop, or end the episode",
    )
    parser.add_argument(
        "--max-retries", type=int, default=4, help="retries of a 429, 5xx, timeout or drop"
    )
    parser.add_argument("--request-timeout", type=float, default=60.0)
    parser.add_argument(
        "--requests-per-minute",
        type=int,
        default=0,
        help="per endpoint, across all workers; 0 = no limit",
    )


def settings_from_options(options: dict[str, Any], **given: Any) -> RolloutSettings:
    """RolloutSettings from the parsed options; `given` fills what the command decides itself.

    Raises SettingsError on a bad value."""
    values = {
        "policy": options["policy"],
        "actions": tuple(options["actions"]),
        "model": options["model"],
        "base_url": options["base_url"] or django_settings.OPENAI_BASE_URL,
        "history_frames": options["history_frames"],
        "concurrency": options["concurrency"],
        "temperature": options["temperature"],
        "max_tokens": options["max_tokens"],
        "image_detail": options["image_detail"],
        "observation_mode": options["observation_mode"],
        "on_bad_output": options["on_bad_output"],
        "max_retries": options["max_retries"],
        "request_timeout": options["request_timeout"],
        "requests_per_minute": options["requests_per_minute"],
    }
    if options.get("steps") is not None:
        values["steps"] = options["steps"]
    values.update(given)
    return RolloutSettings(**values)
