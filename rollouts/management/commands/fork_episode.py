"""`python manage.py fork_episode`: replay an episode to turn K, then play on (SPEC section 4)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from django.core.management.base import CommandError

from rollouts import services, services_fork
from rollouts.management.policy_options import add_policy_arguments, settings_from_options
from rollouts.models import Episode
from rollouts.rollout_settings import HUMAN_POLICY, POLICIES, SettingsError
from studio.commands import StudioCommand, progress_bar, usage_error


class Command(StudioCommand):
    help = (
        "Fork an episode: replay its executed actions up to turn K (each frame checked against "
        "the original's sha256), then play on with a policy. The last line is a JSON summary; "
        "exit 1 when the fork failed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("episode", type=int, metavar="EPISODE")
        parser.add_argument(
            "--turn", type=int, required=True, metavar="K", help="the turn the fork plays anew"
        )
        add_policy_arguments(parser, policies=(*POLICIES, HUMAN_POLICY), steps_default=None)
        parser.add_argument(
            "--with-correction",
            action="store_true",
            help="play turn K's correction (relabel) first, then the policy",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--wait", action="store_true", help="follow the fork to its end")
        mode.add_argument("--inline", action="store_true", help="play here, no broker needed")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["policy"]:
            raise usage_error(f"--policy is required ({', '.join((*POLICIES, HUMAN_POLICY))})")
        source = Episode.objects.select_related("batch").filter(id=options["episode"]).first()
        if source is None:
            raise usage_error(f"episode: there is no episode {options['episode']}")
        human = options["policy"] == HUMAN_POLICY
        try:
            settings = services_fork.fork_settings(
                source=source,
                settings=settings_from_options(options, seeds=(int(source.seed),)),
                steps=options["steps"],
            )
            episode = services_fork.episode_fork(
                source=source,
                turn=options["turn"],
                settings=settings,
                with_correction=options["with_correction"],
                enqueue=not options["inline"],
            )
        except (services_fork.ForkError, SettingsError) as exc:
            raise usage_error(str(exc)) from exc
        if human and episode.status == Episode.Status.RUNNING:
            sys.stderr.write(f"play it at /play/{episode.id}/\n")
        elif human:
            pass  # its replay failed; the error is below
        elif options["inline"]:
            services.episode_run(episode_id=episode.id)
        elif options["wait"]:
            self._wait(episode)
        episode.refresh_from_db()
        self.stdout.write(
            json.dumps(
                {
                    "episode_id": episode.id,
                    "batch_id": episode.batch_id,
                    "forked_from": source.id,
                    "turn": options["turn"],
                    "status": episode.status,
                    "steps": episode.steps,
                }
            )
        )
        if episode.status == Episode.Status.FAILED:
            raise CommandError(f"fork failed: {episode.error}", returncode=1)

    def _wait(self, episode: Episode) -> None:
        bar = progress_bar(total=1, desc=f"fork {episode.id}", unit="episode")
        with bar:
            while Episode.objects.filter(
                id=episode.id, status__in=[Episode.Status.PENDING, Episode.Status.RUNNING]
            ).exists():
                time.sleep(0.5)
            bar.update(1)
