"""`python manage.py rollout`: record seeded episodes with a policy (SPEC section 4)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings as django_settings
from django.db import close_old_connections

from rollouts import selectors, services
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


class Command(StudioCommand):
    help = (
        "Record seeded Crafter episodes with a policy; the last line is a JSON summary. Its "
        f"crafter_score is in {SCORE_UNIT}."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--policy", choices=POLICIES)
        parser.add_argument("--model", default="", help="model name (openai policy)")
        parser.add_argument(
            "--base-url", default="", help="OpenAI-compatible endpoint; default OPENAI_BASE_URL"
        )
        parser.add_argument("--seeds", default="0", help="7, 0-9 or 1,5,9-12")
        parser.add_argument("--steps", type=int, default=256)
        parser.add_argument("--image-size", type=int, default=64)
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
            default=0,
            help="per endpoint, across all workers; 0 = no limit",
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
        if options["inline"]:
            self._play_inline(batch)
        elif options["wait"]:
            self._wait(batch)
        self.stdout.write(json.dumps(selectors.batch_summary(batch=batch)))

    def _settings(self, options: dict[str, Any]) -> RolloutSettings:
        try:
            return RolloutSettings(
                policy=options["policy"],
                seeds=tuple(parse_seeds(options["seeds"])),
                steps=options["steps"],
                image_size=options["image_size"],
                actions=tuple(options["actions"]),
                name=options["name"],
                model=options["model"],
                base_url=options["base_url"] or django_settings.OPENAI_BASE_URL,
                history_frames=options["history_frames"],
                concurrency=options["concurrency"],
                temperature=options["temperature"],
                max_tokens=options["max_tokens"],
                image_detail=options["image_detail"],
                observation_mode=options["observation_mode"],
                on_bad_output=options["on_bad_output"],
                max_retries=options["max_retries"],
                request_timeout=options["request_timeout"],
                requests_per_minute=options["requests_per_minute"],
            )
        except SettingsError as exc:
            raise usage_error(str(exc)) from exc

    def _play_inline(self, batch: RolloutBatch) -> None:
        ids = list(
            batch.episodes.exclude(status__in=[Episode.Status.FINISHED, Episode.Status.FAILED])
            .order_by("seed")
            .values_list("id", flat=True)
        )
        settings = services.batch_settings(batch)
        # Model calls wait on the network: overlap episodes. Baselines are CPU-bound: one by one.
        workers = settings.concurrency if settings.policy == "openai" else 1
        bar = progress_bar(total=len(ids), desc=f"batch {batch.id}", unit="episode")

        def play(episode_id: int) -> str:
            try:
                return services.episode_run(episode_id=episode_id)
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
