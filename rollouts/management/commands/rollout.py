"""`python manage.py rollout`: record seeded episodes with a policy (SPEC section 4)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings as django_settings
from django.core.management.base import CommandError
from django.db import close_old_connections

from rollouts import selectors, services
from rollouts.model_endpoints import chat_endpoint_with_url, endpoint_settings
from rollouts.models import Episode, RolloutBatch
from rollouts.rollout_settings import (
    DEFAULT_SCRIPT,
    IMAGE_DETAILS,
    OBSERVATION_MODES,
    ON_BAD_OUTPUT,
    POLICIES,
    RolloutSettings,
    SettingsError,
    parse_seeds,
)
from rollouts.scoring import SCORE_UNIT
from studio.commands import StudioCommand, progress_bar, usage_error
from studio.endpoints import (
    EndpointError,
    endpoint_check_model,
    endpoint_get,
    endpoints_enabled,
    endpoints_seed_defaults,
)
from studio.models import Endpoint
from studio.queue import QUEUE_UNREACHABLE


class Command(StudioCommand):
    help = (
        "Record seeded Crafter episodes with a policy; the last line is a JSON summary. Its "
        f"crafter_score is in {SCORE_UNIT}."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--policy", choices=POLICIES)
        parser.add_argument("--model", default="", help="model name (openai policy)")
        parser.add_argument(
            "--endpoint",
            default="",
            help="an endpoint an admin named (its URL, key variable and limits); "
            "default: 'default' when it exists",
        )
        parser.add_argument(
            "--base-url",
            default="",
            help="an OpenAI-compatible URL instead of --endpoint; workers send no key to a URL "
            "no endpoint has, --inline sends this command's OPENAI_API_KEY",
        )
        parser.add_argument("--seeds", default="0", help="7, 0-9 or 1,5,9-12")
        parser.add_argument(
            "--samples-per-seed",
            type=int,
            default=1,
            metavar="K",
            help="play each seed K times (sample i seeds the policy's own sampling)",
        )
        parser.add_argument("--steps", type=int, default=256)
        parser.add_argument("--image-size", type=int, default=64)
        parser.add_argument("--actions", nargs="+", default=list(DEFAULT_SCRIPT))
        parser.add_argument(
            "--history-frames", type=int, default=0, help="also show the last K frames (0-9)"
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="most model requests in flight per endpoint, across all workers "
            "(default: the endpoint's, else 4)",
        )
        parser.add_argument("--name", default="")
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
            default=None,
            help="per endpoint, across all workers; 0 = no limit (default: the endpoint's)",
        )
        parser.add_argument(
            "--resume",
            type=int,
            metavar="BATCH_ID",
            help="re-run the unfinished (failed, canceled, pending or dead) episodes of a batch",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--wait", action="store_true", help="follow the batch to its end")
        mode.add_argument("--inline", action="store_true", help="play here, no broker needed")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["resume"] is not None:
            batch = RolloutBatch.objects.filter(id=options["resume"]).first()
            if batch is None:
                raise usage_error(f"resume: there is no batch {options['resume']}")
            # Failed episodes afresh, pending ones, and running ones whose worker died.
            services.batch_resume(batch=batch, enqueue=not options["inline"])
        else:
            if not options["policy"]:
                raise usage_error("--policy is required (scripted, random or openai)")
            settings = self._settings(options)
            batch = services.batch_create(settings=settings, enqueue=not options["inline"])
        if not options["inline"] and selectors.batch_episodes_unsent(batch_id=batch.id):
            # Saved, not lost: the periodic requeue sends it once the broker answers again.
            self.stderr.write(f"{QUEUE_UNREACHABLE}; the batch will start when it is back")
        if options["inline"]:
            self._play_inline(batch)
        elif options["wait"]:
            self._wait(batch)
        summary = selectors.batch_summary(batch=batch)
        self.stdout.write(json.dumps(summary))
        if (options["inline"] or options["wait"]) and (
            summary["status"] == RolloutBatch.Status.FAILED or summary["failed"]
        ):
            # Scripts that wait must be able to tell a batch that failed from one that did not.
            batch.refresh_from_db()
            reason = batch.error.splitlines()[0] if batch.error else "see the batch page"
            raise CommandError(
                f"batch {batch.id} failed: {summary['failed']} of {summary['episodes']} "
                f"episodes failed; {reason}",
                returncode=1,
            )

    def _endpoint_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Endpoint name, URL and limits: from --endpoint, a known --base-url, or 'default'."""
        if options["policy"] != "openai" or not options["model"]:
            return {}  # nothing to pick; RolloutSettings names what is missing
        name, base_url = options["endpoint"], options["base_url"]
        if name and base_url:
            raise usage_error("endpoint: give --endpoint or --base-url, not both")
        try:
            if name:
                endpoint = endpoint_get(name=name, kind=Endpoint.Kind.CHAT)
            elif base_url:
                endpoint = chat_endpoint_with_url(base_url)
            else:
                # What OPENAI_BASE_URL / OPENAI_API_KEY describe, as `migrate` seeds it.
                endpoints_seed_defaults()
                endpoint = endpoints_enabled(kind=Endpoint.Kind.CHAT).filter(name="default").first()
            if endpoint is not None:
                endpoint_check_model(endpoint=endpoint, model=options["model"])
        except EndpointError as exc:
            raise usage_error(str(exc)) from exc
        if endpoint is not None:
            return endpoint_settings(endpoint)
        if not base_url:
            known = ", ".join(
                endpoints_enabled(kind=Endpoint.Kind.CHAT).values_list("name", flat=True)
            )
            raise usage_error(
                "endpoint: the openai policy needs --endpoint NAME"
                + (f" (known: {known})" if known else "")
                + " or --base-url URL"
            )
        if not options["inline"]:
            self.stderr.write(
                f"note: no endpoint is named for {base_url}; workers send it no key "
                "(--inline sends your OPENAI_API_KEY; an admin can name it under /admin/)"
            )
        return {"base_url": base_url}

    def _settings(self, options: dict[str, Any]) -> RolloutSettings:
        endpoint = self._endpoint_options(options)

        def chosen(option: str, default: int) -> int:
            value = options[option]
            return value if value is not None else endpoint.get(option, default)

        try:
            return RolloutSettings(
                policy=options["policy"],
                seeds=tuple(parse_seeds(options["seeds"])),
                samples_per_seed=options["samples_per_seed"],
                steps=options["steps"],
                image_size=options["image_size"],
                actions=tuple(options["actions"]),
                name=options["name"],
                model=options["model"],
                endpoint=endpoint.get("endpoint", ""),
                base_url=endpoint.get("base_url", ""),
                history_frames=options["history_frames"],
                concurrency=chosen("concurrency", 4),
                temperature=options["temperature"],
                max_tokens=options["max_tokens"],
                image_detail=options["image_detail"],
                observation_mode=options["observation_mode"],
                on_bad_output=options["on_bad_output"],
                max_retries=options["max_retries"],
                request_timeout=options["request_timeout"],
                requests_per_minute=chosen("requests_per_minute", 0),
            )
        except SettingsError as exc:
            raise usage_error(str(exc)) from exc

    def _play_inline(self, batch: RolloutBatch) -> None:
        ids = list(
            batch.episodes.exclude(status__in=[Episode.Status.FINISHED, Episode.Status.FAILED])
            .order_by("seed", "sample")
            .values_list("id", flat=True)
        )
        settings = services.batch_settings(batch)
        # Model calls wait on the network: overlap episodes. Baselines are CPU-bound: one by one.
        workers = settings.concurrency if settings.policy == "openai" else 1
        bar = progress_bar(total=len(ids), desc=f"batch {batch.id}", unit="episode")

        def play(episode_id: int) -> str:
            try:
                # Inline, the calls leave from this process: its own key may go to the URL
                # its operator gave (never to an admin-named endpoint, which has its own).
                return services.episode_run(
                    episode_id=episode_id, cli_api_key=django_settings.OPENAI_API_KEY
                )
            finally:
                close_old_connections()

        with bar, ThreadPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(play, ids):
                bar.update(1)

    def _wait(self, batch: RolloutBatch) -> None:
        bar = progress_bar(total=batch.episodes_total, desc=f"batch {batch.id}", unit="episode")
        with bar:
            while True:
                counts = selectors.batch_episode_counts(batch_id=batch.id)
                done = counts["finished"] + counts["failed"]
                bar.update(done - bar.n)
                if done >= counts["total"]:
                    return
                time.sleep(0.5)
