"""`serve_model` for real: a succeeded trl job's stored model served by `transformers serve`
in a child of the command, named as an endpoint, then played by the studio as any endpoint:
the OpenAI policy with the frame's image (`rollout`), a training job's Evaluate, `probe_run`.

The model is a tiny Qwen2-VL that answers every request with the studio's tool call moving
left (`served_models.answering_tiny_vlm`), so what is expected of each answer is known
without the studio's code: each turn's action is `move_left`, and each probe question
(which offers no tool and asks for a letter) is an answer naming no choice.
"""

from __future__ import annotations

import json
import re

import pytest

from evaluation import services as evaluation_services
from probes.models import ProbeQuestion
from probes.services import probe_set_create
from rollouts.models import Episode, Turn
from rollouts.policies.endpoints import endpoint_settings
from rollouts.recording import services as rollout_services
from rollouts.review.turn_selection import TurnSelection
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import record_batch
from studio.models import Endpoint
from studio.testing import run_command
from training.models import TrainingJob
from training.tests import served_models
from training.tests.served_models import MOVE_LEFT_CALL

STEPS = 3


@pytest.fixture(scope="module")
def served(django_db_setup, django_db_blocker, tmp_path_factory):
    chain = ["<tool_call>", MOVE_LEFT_CALL, "</tool_call>"]
    root = tmp_path_factory.mktemp("served")
    with served_models.served_for_module(django_db_blocker, root, chain) as server:
        yield server


@pytest.fixture
def ready(served, db):
    return served_models.ready(served)


def test_serve_model_names_the_endpoint_and_says_so_in_one_line(ready):
    url = f"http://127.0.0.1:{ready.port}/v1"
    assert ready.lines == [
        f"Serving {ready.model} with transformers: endpoint {ready.model} → {url} (chat, no key)"
    ]
    endpoint = ready.endpoint()
    assert (endpoint.kind, endpoint.base_url, endpoint.api_key_env) == ("chat", url, "")
    assert endpoint.allowed_models == [ready.model] and endpoint.enabled


def test_an_episode_plays_the_served_tool_calls_from_the_frame_image(ready):
    settings = RolloutSettings(
        policy="openai",
        model=ready.model,
        seeds=(1,),
        steps=STEPS,
        **endpoint_settings(ready.endpoint()),
    )
    assert settings.observation_mode == "image_text"
    batch = rollout_services.batch_run_inline(settings=settings)
    episode = Episode.objects.get(batch=batch)
    assert (batch.status, episode.status) == ("finished", "finished")
    turns = list(Turn.objects.filter(episode=episode).order_by("index"))
    assert len(turns) == STEPS
    for turn in turns:
        assert turn.actions == ["move_left"], (turn.error_kind, turn.model_text[:200])
        assert turn.error_kind == "" and not turn.text_fallback
        [call] = turn.tool_calls
        assert call["function"]["name"] == "interact_many"
        assert json.loads(call["function"]["arguments"]) == {"actions": ["move_left"]}
        sent = turn.request_messages[-1]["content"]
        assert [part["type"] for part in sent].count("image_url") == 1


def test_evaluate_plays_the_fine_tuned_model_on_held_out_seeds_through_the_endpoint(ready):
    job = TrainingJob.objects.get(id=ready.job.id)
    batch, created = evaluation_services.evaluation_batch_create(
        job=job, endpoint=ready.endpoint(), count=1, steps=STEPS, enqueue=False
    )
    assert created and batch.model == ready.model and batch.endpoint_name == ready.model
    batch = rollout_services.batch_play_inline(batch=batch)
    episode = Episode.objects.get(batch=batch)
    assert (batch.status, episode.status, episode.steps) == ("finished", "finished", STEPS)
    actions = list(Turn.objects.filter(episode=episode).values_list("actions", flat=True))
    assert actions == [["move_left"]] * STEPS


def test_a_probe_run_completes_against_it_each_tool_call_an_error(ready):
    recorded = record_batch(seeds=(2,), steps=3)
    probe_set = probe_set_create(
        filters=TurnSelection(batches=(recorded.id,)), kinds=["night", "asleep"], seed=3
    )
    questions = ProbeQuestion.objects.filter(probe_set=probe_set).count()
    assert questions == 6  # three frames shown with a turn, two questions each
    outcome = run_command(
        "probe_run",
        str(probe_set.id),
        "--endpoint",
        ready.model,
        "--model",
        ready.model,
        "--inline",
    )
    assert outcome.code == 0, outcome.stderr
    summary = outcome.summary
    assert (summary["questions"], summary["answered"], summary["errors"]) == (6, 0, 6)
    assert summary["accuracy"] is None


def test_sigterm_stops_the_engine_and_every_process_it_started(ready):
    engine = served_models.descendants(ready.child.pid)
    assert len(engine) >= 2  # transformers serve and the process its model runs in
    assert ready.stop() == 0
    assert served_models.wait_gone(engine) == set()
    assert ready.lines[-1] == "Stopped."


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "job: no training job {id}"),
        ("synth", "job: training job {id} was trained by 'synth', not trl"),
        ("running", "job: training job {id} has no trained model yet (running)"),
        ("unstored", "job {id} has no stored model (no manifest.json)"),
        ("vllm", "engine: vLLM is not installed here (pip install vllm)"),
        ("name", "endpoint: 'not a slug!' is not a name (letters, digits, - and _)"),
        ("taken", "endpoint: 'trainer' is already a synth endpoint"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(db, case, message):
    job = served_models.trl_job(status="running" if case == "running" else "succeeded")
    if case == "synth":
        TrainingJob.objects.filter(id=job.id).update(provider="synth")
    job_id = job.id + 1000 if case == "missing" else job.id
    args = {
        "vllm": ["--engine", "vllm"],
        "name": ["--endpoint", "not a slug!"],
        "taken": ["--endpoint", "trainer"],
    }.get(case, [])
    Endpoint.objects.create(name="trainer", kind="synth", base_url="http://127.0.0.1:9/api")
    outcome = run_command("serve_model", str(job_id), "--port", "9", *args)
    assert outcome.code == 2, (outcome.stdout, outcome.stderr)
    assert re.fullmatch(
        re.escape(f"serve_model: error: {message.format(id=job_id)}") + r".*\n",
        outcome.stderr,
        re.DOTALL,
    ), outcome.stderr
    assert not Endpoint.objects.filter(name=f"trl-job-{job_id}").exists()
    assert Endpoint.objects.get(name="trainer").kind == "synth"
    assert outcome.stdout == ""


def test_a_succeeded_trl_jobs_page_says_how_to_serve_it(client, submitter):
    job = served_models.trl_job()
    client.force_login(submitter)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert 'id="serve-it"' in page
    assert f'<code id="serve-command">python manage.py serve_model {job.id} ' in page
    running = served_models.trl_job(status="running")
    assert 'id="serve-it"' not in client.get(f"/training/{running.id}/").content.decode()
