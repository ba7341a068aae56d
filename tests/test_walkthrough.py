"""The README's "Your first fine-tune", run as written, and `manage.py` beside `make demo`.

The walkthrough's fenced `bash` blocks, in order, are one bash script. Only the lines that
export the servers' URLs and the key are left out (the README tells the reader to set them);
this test sets those variables instead: a local chat server, a local OpenAI-compatible
fine-tuning server, a test key. A real Celery worker plays the batches and submits the job,
as `make demo`'s worker does for a reader. A command that fails, or does not end with the
JSON line the next one reads, stops the script, and the test with it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from rollouts.models import Episode, RolloutBatch
from rollouts.tests.openai_server import tool_call
from studio.models import Endpoint
from studio.testing import ROOT, manage, subprocess_env
from training.models import TrainingJob
from training.tests.servers import OpenAIFineTuningServer, succeeding_script

README = ROOT / "README.md"
WALKTHROUGH = "## Your first fine-tune"
# What the reader sets from the README's own lines, and this test gives instead.
GIVEN = ("CHAT_URL", "TRAIN_URL", "OPENAI_API_KEY")
KEY = "sk-walkthrough-SECRET-5e0c1d"
TUNED = "ft:gpt-4o-2024-08-06:studio:crafter:walk1"
# Eight actions a call (the most a tool call takes), so that 64 steps are 8 calls.
ACTIONS = ("move_left", "do", "move_up", "do", "move_right", "do", "move_down", "do")


def walkthrough_blocks(text: str) -> list[str]:
    """The fenced `bash` blocks between the walkthrough's heading and the next section."""
    assert WALKTHROUGH in text, f"README.md has no {WALKTHROUGH!r}"
    section = re.split(r"^## ", text.split(WALKTHROUGH, 1)[1], flags=re.M)[0]
    return re.findall(r"^```bash\n(.*?)^```$", section, flags=re.M | re.S)


def walkthrough_script(text: str) -> tuple[str, set[str]]:
    """The blocks as one script without the lines that export GIVEN; and which it exported."""
    kept, given = [], set()
    for line in "\n".join(walkthrough_blocks(text)).splitlines():
        exported = re.match(r"export (\w+)=", line)
        if exported and exported.group(1) in GIVEN:
            given.add(exported.group(1))
            continue
        kept.append(line)
    return "\n".join(kept) + "\n", given


def test_it_keeps_the_readme_a_newcomers_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    script, given = walkthrough_script(text)
    assert given == set(GIVEN), "the walkthrough must tell the reader to export each of them"
    for command in ("rollout", "submit_training", "compare_batches"):
        assert f"python manage.py {command}" in script
    # Every picture, page and section it points to is there (the browser tests take the
    # pictures), and so is everything the reference pages point to.
    for page in (README, *sorted((ROOT / "docs").glob("*.md"))):
        for target, anchor in re.findall(r"\]\(([^)#\s:]*)(?:#([^)\s]+))?\)", page.read_text()):
            where = (page.parent / target).resolve() if target else page
            assert where.exists(), f"{page.name}: {target}"
            if anchor:
                assert anchor in headings_of(where), f"{page.name}: {target}#{anchor}"


def headings_of(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub makes them."""
    titles = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_first_fine_tune_as_written(
    celery_worker, chat_server, media_storage, cache_of_its_own, settings, monkeypatch
):
    chat_server.default = tool_call(*ACTIONS)
    trainer = OpenAIFineTuningServer()
    trainer.script = succeeding_script(model=TUNED)
    trainer.start()
    # The worker (this process) reads the key where a reader's `make demo` would.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    settings.STUDIO_TRAINING_MAX_RETRIES = 3
    script, _ = walkthrough_script(README.read_text(encoding="utf-8"))
    env = subprocess_env(
        CHAT_URL=chat_server.url,
        TRAIN_URL=trainer.base_url,
        OPENAI_API_KEY=KEY,
        STUDIO_MEDIA_ROOT=media_storage,
        STUDIO_CACHE_PREFIX=cache_of_its_own,
        # `submit_training --wait` asks the provider every second, not every 15.
        STUDIO_TRAINING_POLL_SECONDS="1",
    )
    env.pop("DEBUG", None)
    try:
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        trainer.stop()
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"

    chat, endpoint = Endpoint.objects.get(name="chat"), Endpoint.objects.get(name="trainer")
    assert (chat.kind, chat.base_url, chat.api_key_env) == (
        "chat",
        chat_server.url,
        "OPENAI_API_KEY",
    )
    assert (endpoint.kind, endpoint.base_url) == ("openai", trainer.base_url)

    base, base_eval, tuned_eval = RolloutBatch.objects.order_by("id")
    assert [b.model for b in (base, base_eval, tuned_eval)] == ["gpt-4o-2024-08-06"] * 2 + [TUNED]
    assert base.seeds == list(range(10)) and tuned_eval.seeds == list(range(10, 20))
    for batch in (base, base_eval, tuned_eval):
        statuses = set(batch.episodes.values_list("status", flat=True))
        assert statuses == {Episode.Status.FINISHED}, (batch.name, statuses)
    asked = {r.body.get("model") for r in chat_server.requests}
    assert asked == {"gpt-4o-2024-08-06", TUNED}

    job = TrainingJob.objects.get()
    assert (job.status, job.fine_tuned_model) == (TrainingJob.Status.SUCCEEDED, TUNED)
    (remote,) = trainer.jobs.values()
    assert remote.body["model"] == "gpt-4o-2024-08-06"
    assert {r["authorization"] for r in trainer.requests} == {f"Bearer {KEY}"}

    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]
    assert {"status": "dry_run", "provider": "openai"}.items() <= lines[0].items()
    # The comparison's table names both batches; the page's address ends the script.
    assert f"{base_eval.id}" in done.stdout and f"{tuned_eval.id}" in done.stdout
    assert done.stdout.rstrip().endswith(f"/compare/?batches={base_eval.id},{tuned_eval.id}")


def test_it_runs_a_command_beside_the_demo_with_make_manage(transactional_db, media_storage):
    env = subprocess_env(STUDIO_MEDIA_ROOT=media_storage)
    env.pop("SECRET_KEY")  # the demo's settings bring their own, from var/
    done = subprocess.run(
        ["make", "-s", "manage", "ARGS=rollout --policy scripted --seeds 0-1 --steps 3 --inline"],
        cwd=ROOT,
        env={**env, "STUDIO_VAR_DIR": str(Path(media_storage).parent / "var")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert (summary["episodes"], summary["finished"]) == (2, 2)
    assert RolloutBatch.objects.get(id=summary["batch_id"]).seeds == [0, 1]


def test_it_says_in_one_line_that_a_command_needs_a_secret_key():
    env = {k: v for k, v in subprocess_env().items() if k not in {"SECRET_KEY", "DEBUG"}}
    done = manage("rollout", "--policy", "scripted", "--inline", env=env)
    assert done.returncode == 2
    assert done.stderr.startswith("manage.py: error: SECRET_KEY must be set when DEBUG is off.")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
