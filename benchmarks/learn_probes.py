"""Does a tiny VLM trained through the studio learn to see? Probe accuracy on held-out seeds,
trained against its own untrained start and against chance, end to end through the studio.

Every step is one of the studio's own commands, run as a user runs them (`manage.py ...`):

1. `rollout --inline`: `random` and `scripted` episodes on the training seeds and on the
   held-out seeds (`--train-seeds`, `--held-seeds`; no seed in both).
2. `probe_set --balance`: a set on each (`--kinds`; balanced, so a yes / no kind is exactly
   even and chance is clear); the held-out set samples `--held-per-episode` frames a game.
3. `export_jsonl --probe-set` of the training set, then `import_jsonl`: its rows as a dataset.
   Two changes to the file between them, both read from the exported row itself: each row
   says it offered no tools (`"tools": []`: a probe question offers none, so the trained
   prompt has no tool block), and with `--reply text` (the default) the assistant's letter
   becomes the text of the choice it names, which `probe_run` reads as naming that choice
   (see "Why text replies" below). Nothing else here knows an answer.
4. `submit_training --provider trl --dataset D --wait`, full fine-tuning of a tiny Qwen2-VL
   built from scratch (`training.open_models.tiny`, seed `--model-seed`), for `--train-steps`
   optimizer steps of `--batch` rows (the time bound), on a `celery -A studio worker -Q
   train` process started here beside a core worker (`-Q celery`), with one torch thread.
5. `serve_model JOB` (transformers serve, CPU): the trained model as endpoint
   `trl-job-<id>`; the untrained start served the same way (the same engine functions) as
   endpoint `tiny-untrained`.
6. `probe_run --inline` of the whole held-out set: the trained model with the frame
   (`image`), without it (`none`, the control that the image is what it learned from), and
   the untrained start (`image`), which never stops on its own but is asked for a few tokens
   a question (`probes.asking.ANSWER_MAX_TOKENS`), so it too answers every question.
7. Per kind, over every held-out question, one not answered with a choice counting as wrong
   (`unanswered_counts_as_wrong`; `answered` says how many were): each run's accuracy with
   its 95% Wilson interval, chance (the mean of 1 / choices), and the trained run's paired
   difference to the untrained start and to the control, with the probe pages' 95% paired
   bootstrap (`probes.results.paired_difference`).

The goal, per kind: the trained model's interval above chance and above the untrained
start's interval; met overall when at least three kinds meet it.

Why text replies: a probe row's reply is the letter of the right choice, and the choices are
shuffled per question. From scratch, the letter is an exclusive-or of what the frame shows
and where the right choice sits in the list; neither alone says anything about the letter,
so a tiny model's loss stays at the coin-flip level (`--reply letter` reproduces it). The
choice's own text depends on the frame alone.

    python benchmarks/learn_probes.py [--kinds night asleep threat_near] [--train-steps 300]
        [--batch 16] [--learning-rate 2e-3] [--reply text|letter] [--keep]

Reads BENCH_DATABASE (default `studio_bench_learn`, created and migrated here),
CELERY_BROKER_URL (default redis://127.0.0.1:6379/14). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_database, setup_django  # noqa: E402

KINDS = ("night", "asleep", "threat_near")
POLICIES = ("random", "scripted")
UNTRAINED = "tiny-untrained"
READY_SECONDS = 600.0


class Studio:
    """The studio's commands as a user runs them: `manage.py NAME ...` in a process of its
    own, its last line the JSON summary."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, str(ROOT / "manage.py"), *args]

    def run(self, *args: str, ok: tuple[int, ...] = (0,)) -> dict:
        done = subprocess.run(
            self.argv(*args), cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        if done.returncode not in ok:
            raise SystemExit(f"learn_probes: {args[0]} failed ({done.returncode}): {done.stderr}")
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {}

    def start(self, *args: str, name: str, argv: list[str] | None = None) -> subprocess.Popen:
        """`argv` (default: `manage.py *args`) in a session of its own, logged to `name`."""
        out = (self.logs / f"{name}.log").open("w")
        return subprocess.Popen(
            argv or self.argv(*args),
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process's session (it started one), then SIGKILL."""
    import signal

    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)
            return


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- data ------------------------------------------------------------------------------------


def record(studio: Studio, args) -> dict[str, list[int]]:
    """Batch ids of each side: the training seeds' and the held-out seeds'."""
    batches: dict[str, list[int]] = {"train": [], "held": []}
    for side, seeds in (("train", args.train_seeds), ("held", args.held_seeds)):
        for policy in POLICIES:
            summary = studio.run(
                "rollout", "--policy", policy, "--seeds", seeds, "--inline",
                "--steps", str(args.episode_steps), "--name", f"learn_probes {side} {policy}",
            )  # fmt: skip
            batches[side].append(summary["batch_id"])
    return batches


def probe_sets(studio: Studio, batches: dict[str, list[int]], args) -> dict[str, dict]:
    common = ["--kinds", *args.kinds, "--balance"]
    train = studio.run(
        "probe_set", "--batch", *map(str, batches["train"]), *common, "--seed", "0",
        "--name", "learn_probes training seeds",
    )  # fmt: skip
    held = studio.run(
        "probe_set", "--batch", *map(str, batches["held"]), *common, "--seed", "1",
        "--per-episode", str(args.held_per_episode), "--name", "learn_probes held-out seeds",
    )  # fmt: skip
    return {"train": train, "held": held}


def rows_rewritten(source: Path, target: Path, *, reply: str) -> int:
    """The exported rows, each offering no tools, with `reply` "text" the letter replaced
    by the text of the choice it names (the row's own choices). Returns the rows."""
    from probes.prompting import LETTERS

    rows = 0
    with source.open() as lines, target.open("w") as out:
        for line in lines:
            row = json.loads(line)
            row["tools"] = []
            if reply == "text":
                answer = row["messages"][-1]
                choices = row["metadata"]["choices"]
                answer["content"] = choices[LETTERS.index(answer["content"])]
            out.write(json.dumps(row) + "\n")
            rows += 1
    return rows


def training_dataset(studio: Studio, set_id: int, scratch: Path, *, reply: str) -> dict:
    exported, imported = scratch / "probe-rows.jsonl", scratch / "probe-rows-import.jsonl"
    studio.run("export_jsonl", "--probe-set", str(set_id), "--output", str(exported))
    rows = rows_rewritten(exported, imported, reply=reply)
    summary = studio.run("import_jsonl", str(imported), "--name", "learn_probes training rows")
    return {"dataset_id": summary["dataset_id"], "rows": rows}


# --- training and serving --------------------------------------------------------------------

TRL_TOML = """\
[job]
model = "{model}"
modalities = ["text", "image"]
seed = {seed}

[hyperparameters]
n_epochs = 1
max_steps = {steps}
train_kind = "fft"
per_device_batch = {batch}
gradient_accumulation_steps = 1
learning_rate = {learning_rate}
warmup_ratio = 0.05
logging_steps = 10
save_steps = {steps}
"""


@contextlib.contextmanager
def workers(studio: Studio) -> Iterator[None]:
    """A core worker (submissions, polls) and a train worker (the run), each one process."""
    base = ["-m", "celery", "-A", "studio", "worker", "--pool", "solo", "--loglevel", "WARNING"]
    started = [
        studio.start(
            name=f"worker-{queue}",
            argv=[sys.executable, *base, "-Q", queue, "-n", f"learn-{queue}@%h"],
        )
        for queue in ("celery", "train")
    ]
    try:
        yield
    finally:
        for process in started:
            stop(process)


def train(studio: Studio, dataset_id: int, base_model: Path, scratch: Path, args) -> dict:
    config = scratch / "learn_probes.toml"
    config.write_text(
        TRL_TOML.format(
            model=base_model,
            seed=args.model_seed,
            steps=args.train_steps,
            batch=args.batch,
            learning_rate=args.learning_rate,
        )
    )
    started = time.monotonic()
    with workers(studio):
        summary = studio.run(
            "submit_training", "--provider", "trl", "--dataset", str(dataset_id),
            "--config", str(config), "--wait",
        )  # fmt: skip
    summary["minutes"] = round((time.monotonic() - started) / 60, 2)
    return summary


@contextlib.contextmanager
def trained_served(studio: Studio, job_id: int) -> Iterator[tuple[str, str]]:
    """`serve_model JOB` until the block ends: (endpoint name, model name)."""
    from studio.models import Endpoint
    from training.models import TrainingJob

    port = free_port()
    process = studio.start(
        "serve_model", str(job_id), "--port", str(port), "--device", "cpu",
        "--engine", "transformers", name="serve-trained",
    )  # fmt: skip
    name = f"trl-job-{job_id}"
    model = TrainingJob.objects.get(id=job_id).fine_tuned_model
    try:
        deadline = time.monotonic() + READY_SECONDS
        while not Endpoint.objects.filter(name=name, base_url__contains=f":{port}/").exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"learn_probes: serve_model {job_id} did not start")
            time.sleep(1)
        yield name, model
    finally:
        stop(process)


@contextlib.contextmanager
def untrained_served(base_model: Path, logs: Path) -> Iterator[tuple[str, str]]:
    """The untrained start served as the trained one is (the serving module's engine)."""
    from training.open_models import serving

    options = serving.ServeOptions(port=free_port(), engine="transformers", device="cpu")
    with tempfile.TemporaryDirectory(prefix="learn-untrained-") as tmp:
        launch = serving.engine_launch("transformers", base_model, UNTRAINED, options, Path(tmp))
        log = logs / "serve-untrained.log"
        process = serving.engine_start(launch, log)
        try:
            url = serving.base_url_of(options.host, options.port)
            serving.engine_wait_ready(process, url, UNTRAINED, log, READY_SECONDS)
            serving.served_endpoint_save(name=UNTRAINED, base_url=url, model=UNTRAINED)
            yield UNTRAINED, UNTRAINED
        finally:
            serving.engine_stop(process)


# --- asking and comparing --------------------------------------------------------------------


def probe_run(studio: Studio, set_id: int, served: tuple[str, str], observation: str) -> dict:
    """`probe_run --inline` of the whole set: the run's id and how it ended."""
    from probes.models import ProbeRun

    endpoint, model = served
    before = ProbeRun.objects.order_by("-id").values_list("id", flat=True).first() or 0
    started = time.monotonic()
    # Exit 1 is a run that failed (its answers so far are kept and counted below).
    studio.run(
        "probe_run", str(set_id), "--endpoint", endpoint, "--model", model,
        "--observation", observation, "--concurrency", "2", "--inline", ok=(0, 1),
    )  # fmt: skip
    run = ProbeRun.objects.filter(id__gt=before).order_by("id").first()
    if run is None:
        raise SystemExit(f"learn_probes: probe_run on {endpoint} created no run")
    return {
        "run_id": run.id,
        "status": run.status,
        "minutes": round((time.monotonic() - started) / 60, 2),
    }


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, tuple | list):
        return [_rounded(v) for v in value]
    return value


def right_per_question(set_id: int, run_ids: dict[str, int]) -> dict[str, dict]:
    """Per kind: each question's chance (1 / its choices) and, per run, whether it named
    the right choice. A question a run did not answer with a choice (an error, an unparsed
    answer, or no answer stored) counts as wrong; `answered` says how many it did answer."""
    from probes.models import ProbeQuestion
    from probes.selectors_runs import run_answer_records

    kinds: dict[str, dict] = {}
    questions = ProbeQuestion.objects.filter(probe_set_id=set_id).order_by("index")
    for qid, kind, choices in questions.values_list("id", "kind", "choices"):
        entry = kinds.setdefault(kind, {"ids": [], "chance": [], "runs": {}})
        entry["ids"].append(qid)
        entry["chance"].append(1 / len(choices))
    for name, run_id in run_ids.items():
        records = {r.question_id: r for r in run_answer_records(run_id=run_id)}
        for entry in kinds.values():
            got = [records.get(qid) for qid in entry["ids"]]
            entry["runs"][name] = {
                "right": [bool(r and r.correct) for r in got],
                "answered": sum(bool(r and r.answered) for r in got),
            }
    return kinds


def _accuracy(right: list[bool], answered: int) -> dict:
    from evaluation.statistics import wilson_interval

    n, hits = len(right), sum(right)
    return {
        "right": hits,
        "answered": answered,
        "accuracy": _rounded(hits / n) if n else None,
        "interval": _rounded(wilson_interval(hits, n)),
    }


def _paired(base: list[bool], other: list[bool]) -> dict:
    """`other` minus `base` on the same questions, with the probe pages' paired bootstrap."""
    from probes.results import paired_difference

    both = [(b, o) for b, o in zip(base, other, strict=True)]
    counts = [both.count(pair) for pair in ((True, True), (True, False), (False, True))]
    difference, interval = paired_difference(*counts, len(both) - sum(counts))
    return {
        "difference": _rounded(difference),
        "interval": _rounded(interval),
        "above_zero": interval[0] > 0,
        "only_trained_right": counts[2],
        "only_base_right": counts[1],
    }


def per_kind(set_id: int, run_ids: dict[str, int], kinds: tuple[str, ...]) -> dict[str, dict]:
    """Each kind, over every held-out question: the trained run against chance, against the
    untrained start and against the no-image control."""
    found = right_per_question(set_id, run_ids)
    out = {}
    for kind in [k for k in kinds if k in found] + sorted(set(found) - set(kinds)):
        entry = found[kind]
        runs = {name: _accuracy(r["right"], r["answered"]) for name, r in entry["runs"].items()}
        right = {name: r["right"] for name, r in entry["runs"].items()}
        chance = sum(entry["chance"]) / len(entry["chance"])
        trained_low = runs["trained"]["interval"][0]
        above_chance = trained_low > chance
        excludes = trained_low > runs["untrained"]["interval"][1]
        vs_control = _paired(right["no_image"], right["trained"])
        out[kind] = {
            "questions": len(entry["ids"]),
            "chance": _rounded(chance),
            **runs,
            "trained_minus_untrained": _paired(right["untrained"], right["trained"]),
            "trained_minus_no_image": vs_control,
            "above_chance": above_chance,
            "interval_excludes_untrained": excludes,
            "above_no_image": vs_control["above_zero"],
            "goal_met": above_chance and excludes,
        }
    return out


# --- the benchmark ---------------------------------------------------------------------------


def environment(scratch: Path) -> dict[str, str]:
    database = bench_database("studio_bench_learn")
    base = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
    os.environ.update(
        {
            "STUDIO_MEDIA_ROOT": str(scratch / "media"),
            "STUDIO_MODEL_CACHE_DIR": str(scratch / "model-cache"),
            "CELERY_BROKER_URL": os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/14"),
            "SECRET_KEY": os.environ.get("SECRET_KEY", "benchmark-only"),
            "OPENAI_API_KEY": "",
            # Tiny models on a shared CPU: one thread each trains and answers faster than
            # threads contending for the same cores.
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    setup_django(database)  # sets DATABASE_URL
    return {**os.environ, "DATABASE_URL": f"{base}/{database}", "PYTHONPATH": str(ROOT)}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS))
    parser.add_argument("--train-seeds", default="0-39")
    parser.add_argument("--held-seeds", default="10000-10019")
    parser.add_argument("--episode-steps", type=int, default=300)
    parser.add_argument("--held-per-episode", type=int, default=20)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--model-seed", type=int, default=0)
    parser.add_argument("--reply", choices=("text", "letter"), default="text")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return parser.parse_args()


def report(kinds: dict, args, dataset: dict, sets: dict, job: dict, runs: dict, started, scratch):
    """The one JSON object printed."""
    untrained = [k["untrained"] for k in kinds.values()]
    return {
        "kinds": kinds,
        "unanswered_counts_as_wrong": True,
        "goal_met_kinds": [kind for kind, k in kinds.items() if k["goal_met"]],
        "above_chance_kinds": [kind for kind, k in kinds.items() if k["above_chance"]],
        "above_chance_and_no_image_kinds": [
            kind for kind, k in kinds.items() if k["above_chance"] and k["above_no_image"]
        ],
        "untrained_answered": sum(u["answered"] for u in untrained),
        "untrained_asked": sum(k["questions"] for k in kinds.values()),
        "goal_met": sum(k["goal_met"] for k in kinds.values()) >= 3,
        "train_steps": args.train_steps,
        "batch": args.batch,
        "learning_rate": args.learning_rate,
        "reply": args.reply,
        "training_rows": dataset["rows"],
        "held_out_questions": sets["held"]["questions"],
        "training": job,
        "runs": runs,
        "total_minutes": round((time.monotonic() - started) / 60, 2),
        "scratch": str(scratch) if args.keep else None,
    }


def main() -> None:
    args = arguments()
    args.kinds = tuple(args.kinds)
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="learn-probes-"))
    (scratch / "logs").mkdir()
    studio = Studio(environment(scratch), scratch / "logs")
    from training.open_models.tiny import build_tiny_vlm

    base_model = build_tiny_vlm(scratch / "tiny-untrained", seed=args.model_seed)
    say = lambda line: print(f"learn_probes: {line}", file=sys.stderr, flush=True)  # noqa: E731
    batches = record(studio, args)
    say(f"recorded batches {batches}")
    sets = probe_sets(studio, batches, args)
    say(f"probe sets {sets['train']['set_id']} (train), {sets['held']['set_id']} (held out)")
    dataset = training_dataset(studio, sets["train"]["set_id"], scratch, reply=args.reply)
    say(f"dataset {dataset}")
    job = train(studio, dataset["dataset_id"], base_model, scratch, args)
    say(f"training {job}")
    held = sets["held"]["set_id"]
    runs = {}
    with trained_served(studio, job["job_id"]) as served:
        runs["trained"] = probe_run(studio, held, served, "image")
        runs["no_image"] = probe_run(studio, held, served, "none")
    with untrained_served(base_model, studio.logs) as served:
        runs["untrained"] = probe_run(studio, held, served, "image")
    kinds = per_kind(held, {name: run["run_id"] for name, run in runs.items()}, args.kinds)
    print(json.dumps(report(kinds, args, dataset, sets, job, runs, started, scratch)))
    if not args.keep:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
