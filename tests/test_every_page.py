"""Every URL pattern of every app answers without a server error, on PostgreSQL and on the
demo's SQLite, for a superuser and for a plain viewer.

The studio is filled with an object of every kind first: a model's batch (played against the
local chat server), a canceled batch, a scripted fork and a person's game, a flag job and a
correction, a dataset with an exported version and an import, a training job with events
and a loss curve, its evaluation batches and their comparison, a probe set with two runs and
their comparison. Each pattern found by walking the resolver (the admin's changelist, add,
change, history and delete pages of every registered model included) is filled from
`page_arguments` and fetched with GET; a pattern it has no value for fails the test, so a
new page is added to the crawl when it is added to the studio.

The pytest session runs on PostgreSQL; `test_every_page_on_the_demos_sqlite` runs this
module again in a child process on the demo's settings (an SQLite file, the filesystem
broker, DEBUG=1).
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from curation import services as dataset_services
from curation.export_options import ExportOptions
from curation.models import Dataset, DatasetImport, DatasetVersion
from evaluation.tests.test_baselines import evaluation_batch
from probes import runs as probe_runs
from probes.models import ProbeRun, ProbeSet
from probes.services import probe_set_create
from rollouts.models import Episode, RolloutBatch, Turn, TurnBulkFlag
from rollouts.play import services as services_play
from rollouts.play.forks import episode_fork, fork_settings
from rollouts.recording import services as recording
from rollouts.review.services import turn_bulk_flag_start, turn_relabel
from rollouts.review.turn_selection import TurnSelection
from rollouts.review.viewer import TURN_TEXT_FIELDS
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch
from studio.models import LoginFailure
from studio.testing import ROOT, pytest_on_demo_settings
from training import services as training_services
from training.models import GrpoIteration, LocalRun, TrainingEvent, TrainingJob
from training.submission import submission_build
from training.tests.test_evaluate import BASE, FINE_TUNED, _job

pytestmark = pytest.mark.django_db

# The tests run again in the child process on SQLite (the loss chart's own, by hand).
ON_SQLITE_TOO = (
    f"{Path(__file__).relative_to(ROOT)}::test_every_page_answers",
    "training/tests/test_loss_chart.py",
)
PASSWORD = "crawl-pass-123"
GRPO_TOML = ROOT / "training" / "configs" / "crafter_vlm_grpo.toml"


@dataclass
class Studio:
    """One object of every kind, as the crawl visits them."""

    model_batch: RolloutBatch
    canceled_batch: RolloutBatch
    fork: Episode
    game: Episode
    turn: Turn
    bulk_flag: TurnBulkFlag
    dataset: Dataset
    version: DatasetVersion
    upload: DatasetImport
    job: TrainingJob
    grpo_job: TrainingJob
    tuned: RolloutBatch
    base: RolloutBatch
    probe_set: ProbeSet
    image_run: ProbeRun
    text_run: ProbeRun
    superuser: User
    viewer: User


@pytest.fixture
def studio(db, chat_server, chat_endpoint) -> Studio:
    superuser = User.objects.create_superuser("crawler", password=PASSWORD)
    viewer = User.objects.create_user("looker", password=PASSWORD)
    Group.objects.create(name="reviewers")
    LoginFailure.objects.create(username="nobody", address="127.0.0.1", at=timezone.now())

    # A model's batch: every turn a tool call, some with the model's text beside it.
    chat_server.script(*(replies.tool_call("move_left", "do") for _ in range(3)))
    model_batch = record_batch(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        seeds=(0, 1),
        steps=6,
    )
    assert model_batch.status == "finished", model_batch.error
    episode = model_batch.episodes.order_by("seed").first()
    turn = episode.turns.order_by("index").first()

    canceled_batch = recording.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(7, 8), steps=5), enqueue=False
    )
    recording.batch_cancel(batch=canceled_batch)

    turn_relabel(turn=episode.turns.get(index=1), actions=["noop", "do"], reason="", user=superuser)
    scripted = RolloutSettings(policy="scripted", seeds=(episode.seed,))
    fork = episode_fork(
        source=episode,
        turn=1,
        settings=fork_settings(source=episode, settings=scripted, steps=None),
        with_correction=True,
        enqueue=False,
    )
    recording.batch_play_inline(batch=fork.batch)

    game = services_play.play_start(
        settings=services_play.play_settings(seed=3, steps=20, image_size=64), user=superuser
    )
    for index, action in enumerate(("move_left", "do", "move_up")):
        services_play.play_step(episode_id=game.id, action=action, turn=index)

    bulk_flag = turn_bulk_flag_start(
        filters=TurnSelection(batches=(model_batch.id,)), flagged=True, user=superuser
    )
    dataset = dataset_services.dataset_create(
        name="every kind",
        filters=TurnSelection(batches=(model_batch.id, fork.batch_id)),
        options=ExportOptions(),
    )
    version = dataset_services.dataset_version_create(dataset=dataset, enqueue=False)
    assert dataset_services.dataset_version_export(version_id=version.id) == "done"
    upload = DatasetImport.objects.create(
        original_name="turns.jsonl",
        upload="imports/none.jsonl",
        status=DatasetImport.Status.FAILED,
        error="line 3: the row has no messages",
    )

    job = _job(seeds=(0, 2))
    started = timezone.now() - dt.timedelta(hours=1)
    TrainingEvent.objects.bulk_create(
        TrainingEvent(
            job=job,
            remote_id=f"metric-{step}",
            time=started + dt.timedelta(seconds=step),
            type="metric",
            step=step,
            train_loss=2.0 - step / 20,
            validation_loss=2.1 - step / 20 if step % 5 == 0 else None,
        )
        for step in range(1, 31)
    )
    TrainingEvent.objects.create(
        job=job, remote_id="done", time=timezone.now(), type="job.succeeded", message="done"
    )
    # A train worker's run, as a `trl` job has (its card on the job page, its admin pages).
    LocalRun.objects.create(job=job, status=LocalRun.Status.DONE, step=30, total_steps=30)
    grpo_job = _grpo_job(fork)
    tuned = evaluation_batch(job=job, model=FINE_TUNED, ended=6)
    base = evaluation_batch(job=job, model=BASE, ended=6)

    chat_server.responder = lambda body: replies.text("A")
    probe_set = probe_set_create(
        filters=TurnSelection(batches=(model_batch.id,)), per_episode=2, name="every kind"
    )
    image_run, text_run = (
        probe_runs.probe_run_inline(
            run=probe_runs.probe_run_create(
                probe_set=probe_set,
                endpoint_name=chat_endpoint.name,
                model="test-vlm",
                observation=observation,
                enqueue=False,
            ),
            workers=1,
        )
        for observation in ("image", "text")
    )
    return Studio(
        model_batch=model_batch,
        canceled_batch=canceled_batch,
        fork=fork,
        game=game,
        turn=turn,
        bulk_flag=bulk_flag,
        dataset=dataset,
        version=version,
        upload=upload,
        job=job,
        grpo_job=grpo_job,
        tuned=tuned,
        base=base,
        probe_set=probe_set,
        image_run=image_run,
        text_run=text_run,
        superuser=superuser,
        viewer=viewer,
    )


def _grpo_job(fork: Episode) -> TrainingJob:
    """A GRPO job (no dataset) with one iteration: the fork's batch stands for the episodes
    it played (renamed as the train worker names them, an RL reward and advantages given)."""
    submission = submission_build(config_text=GRPO_TOML.read_text(), provider="trl")
    job = training_services.training_job_create(submission=submission, enqueue=False)
    RolloutBatch.objects.filter(id=fork.batch_id).update(name=f"GRPO job {job.id}, iteration 1")
    Episode.objects.filter(id=fork.id).update(rl_reward=2.0)
    Turn.objects.filter(episode_id=fork.id).update(advantage=0.5)
    GrpoIteration.objects.create(
        job=job,
        number=1,
        batch_id=fork.batch_id,
        status=GrpoIteration.Status.COMPLETE,
        seeds=[fork.seed],
        group_size=2,
        reward="crafter",
        episodes=1,
        reward_mean=2.0,
        reward_low=1.0,
        reward_high=3.0,
        score=4.5,
        success_rates={"collect_wood": 100.0},
        loss=0.25,
        kl=0.01,
    )
    return job


def page_arguments(studio: Studio) -> tuple[dict[str, list], dict[str, dict[str, list]]]:
    """The values each URL parameter is visited with: by parameter name, and by pattern (its
    `namespace:name`, or its route when it has no name) where a name means another thing."""
    s = studio
    episodes = [
        *s.model_batch.episodes.order_by("seed"),
        *s.canceled_batch.episodes.all(),
        s.fork,
        s.game,
    ]
    by_parameter: dict[str, list] = {
        "batch_id": [s.model_batch.id, s.canceled_batch.id, s.fork.batch_id, s.game.batch_id],
        "episode_id": [e.id for e in episodes],
        "index": [0, 2],
        "turn_id": [s.turn.id],
        "field": sorted(TURN_TEXT_FIELDS),
        "sha256": [s.turn.frame.sha256],
        "import_id": [s.upload.id],
        "dataset_id": [s.dataset.id],
        "version_id": [s.version.id],
        "job_id": [s.job.id, s.grpo_job.id],
        "seed": [1, 0],
        "set_id": [s.probe_set.id],
        "run_id": [s.image_run.id, s.text_run.id],
        "answer_id": [s.image_run.answers.order_by("id").first().id],
        "app_label": sorted({model._meta.app_label for model in admin.site._registry}),
        "url": ["no-such-page/"],
    }
    episode_type = ContentType.objects.get_for_model(Episode)
    by_pattern: dict[str, dict[str, list]] = {
        "rollouts:turn_bulk_flag_detail": {"job_id": [s.bulk_flag.id]},
        "training:job_evaluate_base": {"batch_id": [s.tuned.id]},
        "admin:auth_user_password_change": {"id": [s.viewer.id]},
        "admin:view_on_site": {"content_type_id": [episode_type.id], "object_id": [s.fork.id]},
    }
    # Each registered model's own pages, at its first row: a kind with no row fails the crawl.
    for model in admin.site._registry:
        meta = model._meta
        first = model._default_manager.order_by("pk").values_list("pk", flat=True).first()
        if first is None:
            continue
        by_pattern[f"admin/{meta.app_label}/{meta.model_name}/<path:object_id>/"] = {
            "object_id": [first]
        }
        for page in ("change", "history", "delete"):
            by_pattern[f"admin:{meta.app_label}_{meta.model_name}_{page}"] = {"object_id": [first]}
    return by_parameter, by_pattern


def page_queries(studio: Studio) -> dict[str, list[str]]:
    """Query strings a pattern is visited with as well, for pages mostly made of them."""
    s = studio
    every_kind = f"{s.model_batch.id},{s.fork.batch_id},{s.game.batch_id}"
    return {
        "evaluation:compare": [
            f"?batches={s.base.id},{s.tuned.id}",
            f"?batches={every_kind}",
            f"?batches={s.base.id},{s.tuned.id}&format=json",
            f"?batches={s.base.id},{s.tuned.id}&format=csv",
        ],
        "evaluation:compare_seed": [f"?batches={s.base.id},{s.tuned.id}", f"?batches={every_kind}"],
        "evaluation:leaderboard": ["?include=forks"],
        "rollouts:turn_list": [
            f"?batch={s.model_batch.id}&achievement=collect_wood&reward=positive&sort=-reward",
            "?policy=human&q=move&flagged=only&has_error=no&sort=seed",
            "?model=test-vlm&seed=0&sort=batch",
        ],
        "rollouts:turns_bulk_flag": [f"?batch={s.model_batch.id}&set_flagged=1"],
        "rollouts:batch_create": [f"?from={s.model_batch.id}"],
        "rollouts:batch_estimate": ["?policy=openai&model=test-vlm&seeds=0-9&steps=20"],
        "rollouts:batch_detail": ["?sort=-seed"],
        "rollouts:episode_detail": ["?turn=2"],
        "rollouts:episode_turn": ["?whole=1"],
        "datasets:dataset_counts": [
            f"?batches={s.model_batch.id}&require_achievements=collect_wood"
            "&exclude_achievements=place_table&min_unique=1&min_reward=0&user_image=on"
            "&include_assistant=on&val_fraction=0.5&history_frames=2",
        ],
        "datasets:version_download": ["?file=validation"],
        "probes:compare": [f"?runs={s.image_run.id},{s.text_run.id}"],
        "probes:run_detail": ["?show=all", "?show=wrong&kind=facing"],
    }


def _patterns(resolver: URLResolver, prefix: str = "", namespace: str = "") -> Iterator:
    """(route, key) of every URL pattern: key is `namespace:name`, or the route unnamed."""
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            inner = entry.namespace or ""
            yield from _patterns(
                entry, route, f"{namespace}:{inner}".strip(":") if inner else namespace
            )
        elif isinstance(entry, URLPattern):
            key = f"{namespace}:{entry.name}".strip(":") if entry.name else route
            yield route, key


# A path converter's parameter (<int:batch_id>), or a regex's named group ((?P<url>.*)).
_PARAMETER = re.compile(r"<(?:\w+:)?(?P<route>\w+)>|\(\?P<(?P<regex>\w+)>[^)]*\)")


def crawl_urls(
    by_parameter: dict[str, list],
    by_pattern: dict[str, dict[str, list]],
    queries: dict[str, list[str]],
) -> tuple[list[str], list[str]]:
    """Every URL to visit (each pattern with every combination of its parameters' values,
    then with each of its query strings), and the patterns there is no value to visit with."""
    urls: list[str] = []
    missing: list[str] = []
    for route, key in _patterns(get_resolver()):
        names = [m.group("route") or m.group("regex") for m in _PARAMETER.finditer(route)]
        values = {n: by_pattern.get(key, {}).get(n) or by_parameter.get(n) for n in names}
        if not all(values.values()):
            missing.append(key)
            continue
        template = route.replace("^", "").replace("$", "")
        for chosen in itertools.product(*(values[n] for n in names)):
            given = dict(zip(names, chosen, strict=True))
            path = _PARAMETER.sub(
                lambda m, g=given: str(g[m.group("route") or m.group("regex")]), template
            )
            urls += ["/" + path + query for query in ["", *queries.get(key, [])]]
    return urls, missing


def test_a_page_without_a_value_to_visit_it_with_fails_the_crawl():
    urls, missing = crawl_urls({"batch_id": [5]}, {}, {"rollouts:batch_list": ["?page=2"]})
    assert {"rollouts:episode_detail", "training:job_detail", "probes:run_detail"} <= set(missing)
    assert "admin/rollouts/episode/<path:object_id>/" in missing
    assert {"rollouts:batch_list", "rollouts:batch_detail", "login"}.isdisjoint(missing)
    assert {"/rollouts/", "/rollouts/?page=2", "/rollouts/5/", "/rollouts/5/cancel/"} <= set(urls)


def test_every_page_answers(studio: Studio):
    by_parameter, by_pattern = page_arguments(studio)
    urls, missing = crawl_urls(by_parameter, by_pattern, page_queries(studio))
    assert missing == [], f"no object to visit these pages with: {missing}"
    for user in (studio.superuser, studio.viewer):
        client = Client(raise_request_exception=False)
        assert client.login(username=user.username, password=PASSWORD)
        failures: dict[str, str] = {}
        logged_out: list[str] = []
        for url in urls:
            # The studio's pages also as htmx asks for them (a partial of some); the admin's
            # are the same either way.
            asked = ({},) if url.startswith("/admin/") else ({}, {"HX-Request": "true"})
            for headers in asked:
                response = client.get(url, headers=headers)
                if response.status_code >= 500:
                    error = response.exc_info[1] if response.exc_info else response.status_code
                    failures[url + (" (htmx)" if headers else "")] = repr(error)
                elif response.status_code == 302 and "login/" in response.get("Location", ""):
                    logged_out.append(url)
                if response.streaming:
                    # Read to its end: the test client then closes it without closing the
                    # test's database connection.
                    b"".join(response.streaming_content)
        assert failures == {}, (
            f"{len(failures)} pages failed for {user.username} on {connection.vendor}:\n"
            + "\n".join(f"{url}: {error}" for url, error in failures.items())
        )
        # Each page was seen as the user sees it, not as the login page: only the admin's
        # are closed to a user who is not staff.
        if user.is_superuser:
            assert logged_out == []
        else:
            assert logged_out and all(url.startswith("/admin/") for url in logged_out)
    print(f"\n{len(urls)} URLs, as a superuser and a viewer, on {connection.vendor}")


def test_every_page_on_the_demos_sqlite(tmp_path):
    """The same crawl in a child pytest on `make demo`'s settings: an SQLite database, the
    filesystem broker, DEBUG=1, files under a var directory of its own."""
    if connection.vendor == "sqlite":
        pytest.skip("this is the run it starts")
    result = pytest_on_demo_settings(tmp_path, *ON_SQLITE_TOO)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
