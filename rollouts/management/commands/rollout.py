"""`python manage.py rollout`: record seeded episodes with a policy (`docs/recording.md`)."""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings as django_settings
from django.core.management.base import CommandError
from django.db import InterfaceError, OperationalError, connection

from rollouts import selectors
from rollouts.game.scoring import SCORE_UNIT
from rollouts.models import RolloutBatch
from rollouts.policies import kinds
from rollouts.policies.endpoints import chat_endpoint_with_url, endpoint_settings
from rollouts.recording import services
from rollouts.rollout_settings import (
    RolloutSettings,
    SettingsError,
    add_cli_arguments,
    settings_from_cli,
)
from studio.commands import StudioCommand, beside_progress_bars, progress_bar, usage_error
from studio.endpoints import (
    EndpointError,
    endpoint_check_model,
    endpoint_get,
    endpoints_enabled,
    endpoints_seed_defaults,
)
from studio.errors import plain_error
from studio.models import Endpoint
from studio.queue import QUEUE_UNREACHABLE, broker_answers


class Command(StudioCommand):
    help = (
        "Record seeded Crafter episodes with a policy; the last line is a JSON summary. Its "
        f"crafter_score is in {SCORE_UNIT}."
    )

    def add_arguments(self, parser) -> None:
        # The batch's options: declared once, with their defaults and help, in RolloutSettings.
        add_cli_arguments(parser)
        parser.add_argument(
            "--resume",
            type=int,
            metavar="BATCH_ID",
            help="re-run the unfinished (failed, canceled, pending or dead) episodes of a batch",
        )
        parser.add_argument(
            "--cancel",
            type=int,
            metavar="BATCH_ID",
            help="stop a pending or running batch: no model request of it starts afterwards",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--wait", action="store_true", help="follow the batch to its end")
        mode.add_argument("--inline", action="store_true", help="play here, no broker needed")

    def _cancel(self, batch_id: int) -> None:
        """`--cancel`: its episodes stop before their next model call; the summary follows."""
        batch = RolloutBatch.objects.filter(id=batch_id).first()
        if batch is None:
            raise usage_error(f"cancel: there is no batch {batch_id}")
        stopped = services.batch_cancel(batch=batch)
        if stopped or batch.status == RolloutBatch.Status.CANCELED:
            self.stderr.write(f"Batch {batch.id} canceled: {stopped} episode(s) stopped.")
        else:
            self.stderr.write(f"Batch {batch.id} had already ended ({batch.status}).")
        self._wait_for_episodes_to_stop(batch)
        batch.refresh_from_db()
        self.stdout.write(json.dumps(selectors.batch_summary(batch=batch)))

    def _wait_for_episodes_to_stop(self, batch: RolloutBatch) -> None:
        """Return once no worker plays the batch any more (each stops before its next call,
        so at most the one call in flight is answered): the summary then counts every call."""
        settings = services.batch_settings(batch)
        deadline = time.monotonic() + settings.request_timeout + 10
        said = False
        while (playing := services.batch_episodes_still_playing(batch=batch)) and (
            time.monotonic() < deadline
        ):
            if not said:
                self.stderr.write(f"Waiting for {playing} episode(s) to finish their call.")
                said = True
            time.sleep(0.2)
        if playing:
            self.stderr.write(
                f"{playing} episode(s) did not answer in time; their worker stops before its "
                "next call."
            )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["cancel"] is not None:
            self._cancel(options["cancel"])
            return
        if options["resume"] is not None:
            batch = RolloutBatch.objects.filter(id=options["resume"]).first()
            if batch is None:
                raise usage_error(f"resume: there is no batch {options['resume']}")
            # Failed episodes afresh, pending ones, and running ones whose worker died.
            services.batch_resume(batch=batch, enqueue=not options["inline"])
            if options["inline"]:
                services.batch_play_inline(
                    batch=batch, cli_api_key=self._cli_api_key(), progress=self._progress
                )
        else:
            if not options["policy"]:
                raise usage_error(f"--policy is required ({kinds.offered_list()})")
            settings = self._settings(options)
            if options["inline"]:
                batch = services.batch_run_inline(
                    settings=settings, cli_api_key=self._cli_api_key(), progress=self._progress
                )
            else:
                batch = services.batch_create(settings=settings)
        if not options["inline"] and selectors.batch_episodes_unsent(batch_id=batch.id):
            # Saved, not lost: the periodic requeue sends it once the broker answers again.
            self.stderr.write(f"{QUEUE_UNREACHABLE}; the batch will start when it is back")
        if options["wait"]:
            self._wait(batch)
        summary = selectors.batch_summary(batch=batch)
        self.stdout.write(json.dumps(summary))
        if (options["inline"] or options["wait"]) and (
            summary["status"] == RolloutBatch.Status.FAILED
            or summary["failed"]
            or summary["canceled"]
        ):
            # Scripts that wait must be able to tell a batch that failed (or was canceled
            # while they waited) from one that did not.
            batch.refresh_from_db()
            reason = batch.error.splitlines()[0] if batch.error else "see the batch page"
            ended = f"{summary['failed']} of {summary['episodes']} episodes failed"
            if summary["canceled"]:
                ended += f", {summary['canceled']} canceled"
            word = "canceled" if batch.status == RolloutBatch.Status.CANCELED else "failed"
            raise CommandError(f"batch {batch.id} {word}: {ended}; {reason}", returncode=1)

    def _endpoint_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Endpoint name, URL and limits: from --endpoint, a known --base-url, or 'default' when
        it is the only chat endpoint."""
        if not kinds.policy_kind(options["policy"]).needs_endpoint or not options["model"]:
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
                # What OPENAI_BASE_URL / OPENAI_API_KEY describe, as `migrate` seeds it; used
                # only when it is the one chat endpoint: with several, the command does not
                # pick one whose calls may be billed.
                endpoints_seed_defaults(say=self.stderr.write)
                chat = list(endpoints_enabled(kind=Endpoint.Kind.CHAT))
                if len(chat) > 1:
                    raise usage_error(
                        f"endpoint: {len(chat)} chat endpoints are named ("
                        + ", ".join(f"{e.name} → {e.base_url}" for e in chat)
                        + "); choose one with --endpoint NAME, or give --base-url URL"
                    )
                endpoint = next((e for e in chat if e.name == "default"), None)
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
                f"endpoint: the {options['policy']} policy needs --endpoint NAME"
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
        try:
            return settings_from_cli(options, endpoint=endpoint)
        except SettingsError as exc:
            raise usage_error(str(exc)) from exc

    @staticmethod
    def _cli_api_key() -> str:
        # Inline, the calls leave from this process: its own key may go to the URL its
        # operator gave (never to an admin-named endpoint, which has its own).
        return django_settings.OPENAI_API_KEY

    @staticmethod
    def _progress(batch: RolloutBatch, total: int):
        return progress_bar(total=total, desc=f"batch {batch.id}", unit="episode")

    def _wait(self, batch: RolloutBatch) -> None:
        """Follow the batch until every episode has ended. The database or the broker being
        down is said in one line when it starts and one when it ends, and following goes on:
        the workers wait it out too (their episodes resume, none fails for it)."""
        bar = progress_bar(total=batch.episodes_total, desc=f"batch {batch.id}", unit="episode")

        def say(line: str) -> None:
            with beside_progress_bars():
                self.stderr.write(line)

        outage = _Outages(say=say)
        with bar:
            while True:
                counts = outage.read(selectors.batch_episode_counts, batch_id=batch.id)
                if counts is not None:
                    bar.update(counts["ended"] - bar.n)
                    if counts["ended"] >= counts["total"]:
                        return
                outage.check_broker()
                time.sleep(WAIT_POLL_SECONDS if counts is not None else WAIT_OUTAGE_SECONDS)


# How often `--wait` reads the batch's progress, asks the broker whether it answers, and tries
# the database again while it is down.
WAIT_POLL_SECONDS = 0.5
WAIT_BROKER_SECONDS = 5.0
WAIT_OUTAGE_SECONDS = 2.0


class _Outages:
    """What `rollout --wait` says of the services it depends on: a line when one stops
    answering, a line when it is back; no traceback (each read is tried again)."""

    def __init__(self, *, say) -> None:
        self.say = say
        self.database_down_since: float | None = None
        self.broker_down_since: float | None = None
        self.broker_checked = 0.0

    def read(self, selector, **kwargs):
        """The selector's answer, or None while the database cannot be reached."""
        try:
            value = selector(**kwargs)
        except (OperationalError, InterfaceError) as exc:
            # A broken connection is not reopened by itself: the next read opens a new one.
            connection.close()
            if self.database_down_since is None:
                self.database_down_since = time.monotonic()
                self.say(
                    f"the database is unreachable ({plain_error(exc).splitlines()[0]}); "
                    "still following the batch: its episodes resume when it is back"
                )
            return None
        if self.database_down_since is not None:
            down = time.monotonic() - self.database_down_since
            self.say(f"the database is back after {down:.0f} s")
            self.database_down_since = None
        return value

    def check_broker(self) -> None:
        now = time.monotonic()
        if now - self.broker_checked < WAIT_BROKER_SECONDS:
            return
        self.broker_checked = now
        if not broker_answers():
            if self.broker_down_since is None:
                self.broker_down_since = now
                self.say(
                    f"{QUEUE_UNREACHABLE}; still following the batch: running episodes go "
                    "on, the others start when it is back"
                )
        elif self.broker_down_since is not None:
            self.say(f"the task queue is back after {now - self.broker_down_since:.0f} s")
            self.broker_down_since = None
