"""Where the episodes of `vlm_concurrency.py --timeline` wait: a timeline of every episode.

Workers started with `-A benchmarks.vlm_trace` are the ordinary `studio` app, with the
steps of an episode timed (wall clock, so that the processes' events line up) into
`$VLM_TRACE_DIR/<pid>.jsonl`: task received and started, claim, world generation, each
limiter wait, call and answer, each chunk of rows, the end; and each step's own CPU time in its
thread (`cpu_ms_per_episode`: what an episode costs a worker, step by step). Only this
benchmark loads it.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path

from studio.celery import app  # noqa: F401  the app `celery -A` looks for

_local = threading.local()
_lock = threading.Lock()
_file = None


def _emit(event: str, **fields) -> None:
    global _file
    record = {"t": time.time(), "e": event, "ep": getattr(_local, "episode", None), **fields}
    line = json.dumps(record) + "\n"
    with _lock:
        if _file is None:
            directory = Path(os.environ["VLM_TRACE_DIR"])
            _file = open(directory / f"{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
        _file.write(line)


def _timed(owner, name: str, event: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        _emit(event + "_start")
        cpu = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            # This thread's own CPU time in the step (inclusive of the steps inside it).
            _emit(event + "_end", cpu=time.thread_time() - cpu)

    setattr(owner, name, wrapper)


def install() -> None:
    from celery import signals

    from rollouts.game import crafter_env
    from rollouts.policies import rate_limit
    from rollouts.policies.openai import chat_client, policy
    from rollouts.recording import frame_store, recorder, services

    @signals.task_received.connect(weak=False)
    def received(request=None, **kwargs):
        if request is not None and request.name == "rollouts.tasks.episode_run":
            _emit("received", task_ep=request.args[0] if request.args else None)

    @signals.task_prerun.connect(weak=False)
    def prerun(task=None, args=None, **kwargs):
        if task is not None and task.name == "rollouts.tasks.episode_run":
            _local.episode = args[0]
            _local.cpu = time.thread_time()
            _emit("prerun")

    @signals.task_postrun.connect(weak=False)
    def postrun(task=None, **kwargs):
        if task is not None and task.name == "rollouts.tasks.episode_run":
            _emit("postrun", cpu=time.thread_time() - getattr(_local, "cpu", time.thread_time()))
            _local.episode = None

    _timed(services, "_episode_claim", "claim")  # with the episode read after it
    _timed(services, "build_policy", "policy")
    _timed(recorder.EpisodeRecorder, "_execute", "step")
    _timed(recorder, "text_observation", "text")
    _timed(policy, "build_messages", "messages")
    _timed(policy, "read_answer", "answer")
    _timed(services, "_episode_end_rows", "end")
    _timed(crafter_env.StudioEnv, "reset", "reset")
    _timed(chat_client.ChatClient, "_post", "post")
    _timed(policy.OpenAIPolicy, "decide", "decide")
    _timed(recorder.EpisodeRecorder, "_write_chunk", "write")
    _timed(frame_store.FrameStore, "write_many", "files")  # within `write`
    _timed(rate_limit.RedisLimiter, "try_acquire", "acquire")
    _timed(rate_limit.RedisLimiter, "release", "release")


def summarize(directory: Path, *, start: float) -> dict[str, object]:
    """Per-episode milestones (s after `start`) and where the time between them went."""
    events: dict[int, list[dict]] = {}
    received: dict[int, float] = {}
    for path in directory.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["e"] == "received" and record.get("task_ep") is not None:
                received.setdefault(record["task_ep"], record["t"] - start)
            elif record["ep"] is not None:
                events.setdefault(record["ep"], []).append(record)
    rows = []
    for episode, records in events.items():
        records.sort(key=lambda r: r["t"])

        def first(name, records=records):
            return next((r["t"] - start for r in records if r["e"] == name), None)

        def last(name, records=records):
            return next((r["t"] - start for r in reversed(records) if r["e"] == name), None)

        posts = [r["t"] - start for r in records if r["e"] == "post_start"]
        answers = [r["t"] - start for r in records if r["e"] == "post_end"]
        decides = [r["t"] - start for r in records if r["e"] == "decide_start"]
        rows.append(
            {
                "episode": episode,
                "received": received.get(episode),
                "prerun": first("prerun"),
                "claimed": first("claim_end"),
                "reset_done": first("reset_end"),
                "first_decide": decides[0] if decides else None,
                "first_post": posts[0] if posts else None,
                "posts": posts,
                "answers": answers,
                "write_start": first("write_start"),
                "write_end": last("write_end"),
                "end_done": first("end_end"),
                "postrun": first("postrun"),
            }
        )
    rows.sort(key=lambda r: r["prerun"] or 0)

    def spread(values):
        values = sorted(v for v in values if v is not None)
        if not values:
            return None
        pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
        return {
            "min": round(values[0], 3),
            "p50": round(pick(0.5), 3),
            "p90": round(pick(0.9), 3),
            "max": round(values[-1], 3),
        }

    def gaps(a, b):
        return spread([r[b] - r[a] for r in rows if r.get(a) is not None and r.get(b) is not None])

    # Between an answer and the next call: the game step, the rows kept, the next request.
    between = []
    for r in rows:
        between += [p - a for a, p in zip(r["answers"], r["posts"][1:], strict=False)]
    call_s = []
    for r in rows:
        call_s += [a - p for p, a in zip(r["posts"], r["answers"], strict=False)]
    # Each step's CPU time in its own thread, summed per episode, then the mean over episodes
    # (ms); `task` is the whole task, so what is in no named step is `task` minus the others.
    cpu: dict[str, float] = {}
    for records in events.values():
        for r in records:
            if "cpu" in r:
                name = "task" if r["e"] == "postrun" else r["e"].removesuffix("_end")
                cpu[name] = cpu.get(name, 0.0) + r["cpu"]
    return {
        "episodes_traced": len(rows),
        "cpu_ms_per_episode": {
            name: round(1000 * total / max(len(rows), 1), 2) for name, total in sorted(cpu.items())
        },
        "milestones_s": {
            name: spread([r[name] for r in rows])
            for name in (
                "received",
                "prerun",
                "claimed",
                "reset_done",
                "first_post",
                "write_end",
                "end_done",
                "postrun",
            )
        },
        "gaps_s": {
            "received_to_prerun": gaps("received", "prerun"),
            "prerun_to_claimed": gaps("prerun", "claimed"),
            "claimed_to_reset_done": gaps("claimed", "reset_done"),
            "reset_done_to_first_post": gaps("reset_done", "first_post"),
            "call_answer": spread(call_s),
            "answer_to_next_call": spread(between),
            "last_answer_to_rows_written": spread(
                [r["write_end"] - r["answers"][-1] for r in rows if r["answers"] and r["write_end"]]
            ),
            "rows_written_to_end_done": gaps("write_end", "end_done"),
        },
    }


if os.environ.get("VLM_TRACE_DIR"):
    from celery import signals

    @signals.worker_init.connect(weak=False)
    def _on_worker_init(**kwargs):
        import django

        django.setup()
        install()
