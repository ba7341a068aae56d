"""`python manage.py fork_episode`: replay an episode to turn K, then play on (`docs/review.md`)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from django.core.management.base import CommandError

from rollouts.management.commands.rollout import Command as RolloutCommand
from rollouts.models import Episode
from rollouts.play import forks as services_fork
from rollouts.policies.kinds import offered_names
from rollouts.recording import services
from rollouts.rollout_settings import HUMAN_POLICY, SettingsError, cli_default
from studio.commands import progress_bar, usage_error

# `rollout` options a fork does not take (its original decides them), with their defaults.
_NOT_FOR_FORKS = {name: cli_default(name) for name in ("seeds", "image_size", "name")} | {
    "resume": None
}


class Command(RolloutCommand):
    """`rollout`'s policy options (endpoint, model, limits), for one episode forked at K."""

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
        parser.add_argument(
            "--with-correction",
            action="store_true",
            help="play turn K's correction (relabel) first, then the policy",
        )
        super().add_arguments(parser)
        for action in parser._actions:
            if action.dest == "policy":
                action.choices = (*offered_names(), HUMAN_POLICY)
            elif action.dest in _NOT_FOR_FORKS:
                action.help = argparse.SUPPRESS
        # The fork's step limit defaults to the original's.
        parser.set_defaults(steps=None)

    def handle(self, *args: Any, **options: Any) -> None:
        given = [name for name, default in _NOT_FOR_FORKS.items() if options[name] != default]
        if given:
            raise usage_error(
                f"--{given[0].replace('_', '-')}: a fork plays its original's seed and image size"
            )
        if not options["policy"]:
            policies = ", ".join((*offered_names(), HUMAN_POLICY))
            raise usage_error(f"--policy is required ({policies})")
        source = Episode.objects.select_related("batch").filter(id=options["episode"]).first()
        if source is None:
            raise usage_error(f"episode: there is no episode {options['episode']}")
        human = options["policy"] == HUMAN_POLICY
        policy_settings = self._settings(
            {
                **options,
                "seeds": str(source.seed),
                "image_size": source.batch.image_size,
                "steps": options["steps"] or source.batch.step_limit,
            }
        )
        try:
            settings = services_fork.fork_settings(
                source=source, settings=policy_settings, steps=options["steps"]
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
            self.stderr.write(f"play it at /play/{episode.id}/")
        elif human:
            pass  # its replay failed; the error is below
        elif options["inline"]:
            services.batch_play_inline(batch=episode.batch, cli_api_key=self._cli_api_key())
        elif options["wait"]:
            self._wait_fork(episode)
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

    def _wait_fork(self, episode: Episode) -> None:
        bar = progress_bar(total=1, desc=f"fork {episode.id}", unit="episode")
        with bar:
            while Episode.objects.filter(
                id=episode.id, status__in=[Episode.Status.PENDING, Episode.Status.RUNNING]
            ).exists():
                time.sleep(0.5)
            bar.update(1)
