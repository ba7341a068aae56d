"""The README's "Your first fine-tune", run as written on `make demo`'s own settings, and
`manage.py` beside `make demo`.

The walkthrough's fenced `bash` blocks, in order, are one bash script. Only the lines that
export the servers' URLs and the key are left out (the README tells the reader to set them);
this test sets those variables instead: a local chat server, a local OpenAI-compatible
fine-tuning server, a test key. It runs where a reader runs it: beside the demo's own
processes (`studio.demo.Demo`: its web server, worker and scheduler) on the demo's settings,
a SQLite file and the filesystem broker under a var directory of its own. A command that
fails, or does not end with the JSON line the next one reads, stops the script, and the test
with it. Then the pages the walkthrough names are opened, logged in as `demo`, on that server.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import socket
import sqlite3
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from rollouts.models import Episode, RolloutBatch
from rollouts.tests.openai_server import tool_call
from studio.demo import Demo
from studio.models import Endpoint
from studio.testing import ROOT, manage, subprocess_env, wait_until
from training.models import TrainingJob
from training.tests.servers import OpenAIFineTuningServer, succeeding_script

README = ROOT / "README.md"
WALKTHROUGH = "## Your first fine-tune"
# What the reader sets from the README's own lines, and this test gives instead.
GIVEN = ("CHAT_URL", "TRAIN_URL", "OPENAI_API_KEY")
KEY = "sk-walkthrough-SECRET-5e0c1d"
TUNED = "ft:gpt-4o-2024-08-06:studio:crafter:walk1"
MODEL = "gpt-4o-2024-08-06"
# Eight actions a call (the most a tool call takes), so that 64 steps are 8 calls.
ACTIONS = ("move_left", "do", "move_up", "do", "move_right", "do", "move_down", "do")
DEMO_PASSWORD = "walkthrough-demo-pass-1"
# What points a process at the test's PostgreSQL, Redis and media: the demo has none of it.
NOT_THE_DEMOS = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "STUDIO_MEDIA_ROOT",
    "STUDIO_CACHE_PREFIX",
    "SECRET_KEY",
    "OPENAI_BASE_URL",
)


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
    for command in ("endpoint", "rollout", "dataset_create", "submit_training", "compare_batches"):
        assert f"python manage.py {command}" in script
    # Every step is a command: nothing for a newcomer to paste into a Python shell.
    assert "manage.py shell" not in script
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


def test_it_runs_the_first_fine_tune_as_written_on_the_demos_settings(
    chat_server, tmp_path, monkeypatch
):
    chat_server.default = tool_call(*ACTIONS)
    trainer = OpenAIFineTuningServer()
    trainer.script = succeeding_script(model=TUNED)
    trainer.start()
    var_dir = tmp_path / "var"
    port = _free_port()
    # The demo's processes inherit this environment, as `make demo`'s do a reader's shell.
    for name in [*NOT_THE_DEMOS, *(k for k in os.environ if k.startswith("DJANGO_"))]:
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "DEBUG": "1",
        "STUDIO_VAR_DIR": str(var_dir),
        "DEMO_PASSWORD": DEMO_PASSWORD,
        # The worker reads the key where a reader's `make demo` would.
        "OPENAI_API_KEY": KEY,
        # The scheduler asks the provider every second, not every 15.
        "STUDIO_TRAINING_POLL_SECONDS": "1",
        "STUDIO_TRAINING_MAX_RETRIES": "3",
        # An export clears what an earlier attempt at its version left in the temporary
        # folder, found by the version's id alone: another test's version 1 is not this one.
        "TMPDIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    for step in (("migrate", "--noinput", "-v0"), ("demo_setup",)):  # `make demo`'s steps
        done = manage(*step, env=dict(os.environ))
        assert done.returncode == 0, done.stderr
    script, _ = walkthrough_script(README.read_text(encoding="utf-8"))
    demo = Demo(port=str(port), var_dir=var_dir)
    demo.start()
    try:
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + script],
            cwd=ROOT,
            env={**os.environ, "CHAT_URL": chat_server.url, "TRAIN_URL": trainer.base_url},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        rows = DemoDatabase(var_dir / "studio.sqlite3")
        base, base_eval, tuned_eval = rows.model_batches()
        job = rows.job()
        pages = pages_opened(
            port,
            [
                f"/rollouts/{base['id']}/",
                f"/datasets/{rows.dataset_id()}/",
                f"/training/{job['id']}/",
                f"/compare/?batches={base_eval['id']},{tuned_eval['id']}",
            ],
        )
    finally:
        demo.stop()
        trainer.stop()

    assert rows.endpoints() == {
        "chat": ("chat", chat_server.url, "OPENAI_API_KEY"),
        "trainer": ("openai", trainer.base_url, "OPENAI_API_KEY"),
    }
    assert [b["model"] for b in (base, base_eval, tuned_eval)] == [MODEL, MODEL, TUNED]
    assert base["seeds"] == list(range(10)) and tuned_eval["seeds"] == list(range(10, 20))
    for batch in (base, base_eval, tuned_eval):
        assert rows.episode_statuses(batch["id"]) == {Episode.Status.FINISHED}, batch["name"]
    assert {r.body.get("model") for r in chat_server.requests} == {MODEL, TUNED}

    assert (job["status"], job["model"], job["fine_tuned_model"]) == (
        TrainingJob.Status.SUCCEEDED,
        MODEL,
        TUNED,
    )
    (remote,) = trainer.jobs.values()
    assert remote.body["model"] == MODEL
    assert remote.body["suffix"] == "crafter"
    assert {r["authorization"] for r in trainer.requests} == {f"Bearer {KEY}"}

    # A line the script reads with `last` is shown on stderr; the others go to stdout.
    said = (done.stdout + done.stderr).splitlines()
    lines = [json.loads(line) for line in said if line.startswith('{"')]
    created = [line for line in lines if "endpoint" in line]
    assert [(e["endpoint"], e["created"]) for e in created] == [("chat", True), ("trainer", True)]
    # 10 episodes of 64 steps at 8 actions a call: 80 turns.
    (dataset,) = [line for line in lines if "dataset_id" in line]
    assert dataset == {"dataset_id": rows.dataset_id(), "turns": 80, "episodes": 10}
    (dry_run,) = [line for line in lines if line.get("status") == "dry_run"]
    assert dry_run["provider"] == "openai"
    # OpenAI's own config: nothing in it that OpenAI does not take.
    assert "not sent" not in done.stdout
    assert KEY not in done.stdout and KEY not in done.stderr
    # The comparison's table names both batches; the page's address ends the script.
    assert f"{base_eval['id']}" in done.stdout and f"{tuned_eval['id']}" in done.stdout
    assert done.stdout.rstrip().endswith(f"/compare/?batches={base_eval['id']},{tuned_eval['id']}")

    batch_page, dataset_page, job_page, compare_page = pages
    assert "base model, training seeds" in batch_page
    assert "first fine-tune" in dataset_page
    assert 'class="loss-chart"' in job_page and '<polyline class="train"' in job_page
    assert TUNED in job_page
    assert "base model, held-out seeds" in compare_page
    assert "fine-tuned, held-out seeds" in compare_page


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DemoDatabase:
    """The demo's SQLite file, read as it is (this test's own database is PostgreSQL)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _all(self, sql: str, *params: object) -> list[sqlite3.Row]:
        with sqlite3.connect(self.path) as db:
            db.row_factory = sqlite3.Row
            return db.execute(sql, params).fetchall()

    def endpoints(self) -> dict[str, tuple[str, str, str]]:
        table = Endpoint._meta.db_table
        found = self._all(f"SELECT name, kind, base_url, api_key_env FROM {table}")
        return {row[0]: tuple(row[1:]) for row in found if row[0] in ("chat", "trainer")}

    def model_batches(self) -> list[dict]:
        table = RolloutBatch._meta.db_table
        found = self._all(
            f"SELECT id, name, model, seeds FROM {table} WHERE model != '' ORDER BY id"
        )
        return [{**dict(row), "seeds": json.loads(row["seeds"])} for row in found]

    def episode_statuses(self, batch_id: int) -> set[str]:
        table = Episode._meta.db_table
        found = self._all(f"SELECT DISTINCT status FROM {table} WHERE batch_id = ?", batch_id)
        return {row[0] for row in found}

    def job(self) -> dict:
        table = TrainingJob._meta.db_table
        (row,) = self._all(f"SELECT id, status, model, fine_tuned_model FROM {table}")
        return dict(row)

    def dataset_id(self) -> int:
        from curation.models import Dataset

        (row,) = self._all(f"SELECT id FROM {Dataset._meta.db_table}")
        return row[0]


def pages_opened(port: int, paths: list[str]) -> list[str]:
    """Each page's HTML, logged in as `demo` on the demo's own web server; each must be a 200."""
    base = f"http://127.0.0.1:{port}"
    cookies = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(cookies))

    def answers() -> bool:
        try:
            return browser.open(f"{base}/login/", timeout=10).status == 200
        except OSError:
            return False

    wait_until(answers, timeout=60, every=0.5, what="the demo's web server to answer")
    token = next(c.value for c in cookies if c.name == "csrftoken")
    form = {"username": "demo", "password": DEMO_PASSWORD, "csrfmiddlewaretoken": token}
    landed = browser.open(f"{base}/login/", urllib.parse.urlencode(form).encode(), timeout=60)
    assert landed.url == f"{base}/rollouts/", landed.url  # logged in: redirected past the form
    pages = []
    for path in paths:
        try:
            page = browser.open(base + path, timeout=120)
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{path}: {error.code}\n{error.read().decode()[-3000:]}") from None
        assert page.status == 200, path
        pages.append(page.read().decode())
    return pages


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
