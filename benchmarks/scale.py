"""The review pages at team scale: p50 / p95 server time per page at 100k turns and at N.

    python benchmarks/scale.py [--turns 10000000] [--small 100000] [--requests 20]

Uses a PostgreSQL database of its own (`studio_bench_scale`, or BENCH_DATABASE; dropped and
re-created). Turns are seeded with SQL (`generate_series`, no Python per row): batches of
1,000 episodes x 256 turns, three models, a frame per turn, ~0.1% flagged, ~0.5% failed,
`collect_wood` unlocked at turn 17 of every episode, `place_table` in a third of them and
`collect_diamond` in one turn in 100,003; plus one 10,000-turn episode (crafter's own
default length) with VLM-sized turns for the episode viewer.

The same pages are timed first at `--small` turns, then after growing the same database to
`--turns`, in one run: each page's ratio shows how its cost grows with the table. Timing is
in-process through Django's test client (the whole request: middleware, session, view,
queries, template), `--requests` times per page after one warm-up; `bytes` is the page's
size. The machine may be shared: compare ratios, not milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, bench_database, setup_django

EPISODE_TURNS = 256
EPISODES_PER_BATCH = 1_000
LONG_EPISODE_TURNS = 10_000
MODELS = ("model-a", "model-b", "model-c")
OBSERVATION = (
    "Step {index} of 256.\nHealth 9/9, food 8/9, drink 7/9, energy 9/9.\n"
    "Position (32, 32), facing down.\nInventory: wood=2, sapling=1.\n"
    "Achievements unlocked: collect_wood.\nLocal view (9 columns x 7 rows, you are in the "
    "centre):\n"
    + ("   grass    grass     tree    grass    water    grass    grass    sand    grass\n")
    * 7
)


def _turn_insert(
    *, first_batch: int, first_episode: int, first_frame: int, count: int
) -> list[str]:
    """SQL adding `count` turns (and their episodes' frames) numbered from 0, see docstring.

    Ids are explicit (episode = first_episode + g / 256, frame = first_frame + g), so turns,
    frames and episodes are three INSERT ... SELECT over one generate_series each.
    """
    episodes = -(-count // EPISODE_TURNS)
    sql = f"""
    INSERT INTO rollouts_rolloutbatch (id, name, policy, model, endpoint, seeds, step_limit,
        image_size, settings, status, episodes_total, episodes_finished, episodes_failed,
        model_calls, model_errors, model_retries, prompt_tokens, completion_tokens,
        created_at, crafter_version, numpy_version, opensimplex_version, error,
        prompt_version, system_prompt, endpoint_name)
    SELECT {first_batch} + b, 'scale ' || ({first_batch} + b), 'openai',
        (ARRAY{list(MODELS)!r})[1 + b % 3], 'http://127.0.0.1:9/v1', '[]', 256, 64, '{{}}',
        'finished', {EPISODES_PER_BATCH}, {EPISODES_PER_BATCH}, 0, 0, 0, 0, 0, 0,
        now() - (b || ' minutes')::interval, '1.8.3', '', '', '', 1, '', ''
    FROM generate_series(0, {(episodes - 1) // EPISODES_PER_BATCH}) AS b;

    INSERT INTO rollouts_episode (id, batch_id, seed, status, steps, total_reward,
        achievements, achievement_count, tool_calls, model_calls, model_errors,
        model_retries, bad_outputs, prompt_tokens, completion_tokens, error, attempts,
        claim_token, fork_prefix_turns, fork_with_correction, sample)
    SELECT {first_episode} + e, {first_batch} + e / {EPISODES_PER_BATCH},
        e % {EPISODES_PER_BATCH}, 'finished', 256, CASE WHEN e % 3 = 0 THEN 2 ELSE 1 END,
        CASE WHEN e % 3 = 0 THEN '{{"collect_wood": 17, "place_table": 97}}'::jsonb
             ELSE '{{"collect_wood": 17}}'::jsonb END,
        CASE WHEN e % 3 = 0 THEN 2 ELSE 1 END, 256, 256, 0, 0, 0, 0, 0, '', 1, '', 0, false, 0
    FROM generate_series(0, {episodes - 1}) AS e;

    INSERT INTO rollouts_frame (id, episode_id, step, sha256, image, width, height, state)
    SELECT {first_frame} + g, {first_episode} + g / {EPISODE_TURNS}, g % {EPISODE_TURNS},
        md5(g::text || 'a') || md5(g::text || 'b'),
        'frames/' || md5(g::text || 'a') || '.png', 64, 64,
        '{{"vitals": {{"health": 9, "food": 8, "drink": 7, "energy": 9}},
           "inventory": {{"wood": 2}}}}'::jsonb
    FROM generate_series(0, {count - 1}) AS g;

    INSERT INTO rollouts_turn (episode_id, "index", frame_id, observation_text,
        request_messages, model_text, reasoning_text, tool_calls, actions, reward,
        achievements_unlocked, error, error_kind, finish_reason, text_fallback,
        prompt_tokens, completion_tokens, latency_ms, retries, flagged, note, truncated)
    SELECT {first_episode} + g / {EPISODE_TURNS}, g % {EPISODE_TURNS}, {first_frame} + g,
        replace(%(observation)s, '{{index}}', (g % {EPISODE_TURNS})::text),
        jsonb_build_array(jsonb_build_object('role', 'user', 'content', jsonb_build_array(
            jsonb_build_object('type', 'text', 'text', 'the observation'),
            jsonb_build_object('type', 'image_url', 'image_url',
                jsonb_build_object('frame_step', g % {EPISODE_TURNS}))))),
        'I see a tree to the right, so I walk there and collect wood.', '',
        jsonb_build_array(jsonb_build_object('id', 'call_' || g, 'type', 'function',
            'function', jsonb_build_object('name', 'interact_many',
                'arguments', '{{"actions": ["move_right", "do"]}}'))),
        '["move_right", "do"]'::jsonb,
        CASE WHEN g % {EPISODE_TURNS} = 17 THEN 1 ELSE 0 END,
        CASE WHEN g % 100003 = 0 THEN '["collect_diamond"]'::jsonb
             WHEN g % {EPISODE_TURNS} = 17 THEN '["collect_wood"]'::jsonb
             WHEN g % {EPISODE_TURNS} = 97 AND (g / {EPISODE_TURNS}) % 3 = 0
                THEN '["place_table"]'::jsonb
             ELSE '[]'::jsonb END,
        CASE WHEN g % 211 = 0 THEN 'HTTP 429 from the endpoint' ELSE '' END,
        CASE WHEN g % 211 = 0 THEN 'http_429' ELSE '' END,
        'tool_calls', false, 1450, 60, 830, 0, g % 997 = 0, '', '{{}}'
    FROM generate_series(0, {count - 1}) AS g
    """
    return [statement for statement in sql.split(";") if statement.strip()]


def _next_ids(cursor) -> tuple[int, int, int]:
    ids = []
    for table in ("rollouts_rolloutbatch", "rollouts_episode", "rollouts_frame"):
        cursor.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {table}")
        ids.append(cursor.fetchone()[0])
    return ids[0], ids[1], ids[2]


def _reset_sequences(cursor) -> None:
    for table in (
        "rollouts_rolloutbatch",
        "rollouts_episode",
        "rollouts_frame",
        "rollouts_turn",
    ):
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
            f"(SELECT coalesce(max(id), 1) FROM {table}))"
        )


def seed_turns(count: int) -> float:
    """Add `count` turns with SQL; returns the seconds it took (ANALYZE included)."""
    from django.db import connection, transaction

    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        batch, episode, frame = _next_ids(cursor)
        for statement in _turn_insert(
            first_batch=batch, first_episode=episode, first_frame=frame, count=count
        ):
            if "%(observation)s" in statement:
                # `%` is the parameter marker: the SQL's modulo signs are doubled.
                cursor.execute(statement.replace(" % ", " %% "), {"observation": OBSERVATION})
            else:
                cursor.execute(statement)
        _reset_sequences(cursor)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return time.perf_counter() - started


def seed_long_episode() -> int:
    """One 10,000-turn episode of VLM-sized turns (its own batch); returns its id."""
    from django.db import connection

    from rollouts.tools import SYSTEM_PROMPT

    seed_turns(LONG_EPISODE_TURNS)  # ids are contiguous: the last episodes are this one's
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM rollouts_rolloutbatch")
        batch_id = cursor.fetchone()[0]
        cursor.execute("SELECT min(id) FROM rollouts_episode WHERE batch_id = %s", [batch_id])
        episode_id = cursor.fetchone()[0]
        # Re-home the batch's turns and frames onto one episode, as one long game.
        cursor.execute(
            "UPDATE rollouts_frame f SET episode_id = %(e)s, step = f.id - m.first "
            "FROM (SELECT min(f2.id) AS first FROM rollouts_frame f2 JOIN rollouts_episode e2 "
            "ON e2.id = f2.episode_id WHERE e2.batch_id = %(b)s) m "
            "WHERE f.episode_id IN (SELECT id FROM rollouts_episode WHERE batch_id = %(b)s)",
            {"e": episode_id, "b": batch_id},
        )
        cursor.execute(
            'UPDATE rollouts_turn t SET episode_id = %(e)s, "index" = f.step, '
            "request_messages = jsonb_build_array(jsonb_build_object('role', 'system', "
            "'content', %(prompt)s::text)) || t.request_messages "
            "FROM rollouts_frame f WHERE f.id = t.frame_id AND f.episode_id = %(e)s",
            {"e": episode_id, "prompt": SYSTEM_PROMPT},
        )
        cursor.execute(
            "DELETE FROM rollouts_episode WHERE batch_id = %s AND id <> %s",
            [batch_id, episode_id],
        )
        cursor.execute(
            "UPDATE rollouts_episode SET steps = %s WHERE id = %s",
            [LONG_EPISODE_TURNS, episode_id],
        )
        cursor.execute(
            "UPDATE rollouts_rolloutbatch SET episodes_total = 1, episodes_finished = 1, "
            "name = 'scale long episode' WHERE id = %s",
            [batch_id],
        )
    return episode_id


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def time_page(client, path: str, requests: int) -> dict[str, float]:
    response = client.get(path)  # warm-up, and the size
    if response.status_code != 200:
        raise RuntimeError(f"GET {path}: {response.status_code}")
    size = len(response.content)
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        client.get(path)
        times.append((time.perf_counter() - start) * 1000)
    return {
        "p50_ms": round(_percentile(times, 0.5), 1),
        "p95_ms": round(_percentile(times, 0.95), 1),
        "mean_ms": round(statistics.fmean(times), 1),
        "bytes": size,
    }


def pages(ids: dict[str, object]) -> dict[str, str]:
    """The pages timed at both sizes: the same addresses."""
    return {
        "batch_list": "/rollouts/",
        "batch_detail_1000_episodes": f"/rollouts/{ids['batch_id']}/",
        "turn_list": "/turns/",
        "turn_list_deep_page": f"/turns/?after={ids['deep_cursor']}",
        "turn_list_batch": f"/turns/?batch={ids['batch_id']}",
        "turn_list_model": f"/turns/?model={MODELS[1]}",
        "turn_list_flagged": "/turns/?flagged=only",
        "turn_list_errors": "/turns/?has_error=yes",
        "turn_list_achievement": "/turns/?achievement=place_table",
        "turn_list_rare_achievement": "/turns/?achievement=collect_diamond",
        "turn_list_combined": (
            f"/turns/?model={MODELS[0]}&flagged=exclude&has_error=no&achievement=collect_wood"
        ),
        "dataset_counts_all": "/datasets/counts/?name=x&flagged=any&format=studio",
        "dataset_counts_filtered": (
            "/datasets/counts/?name=x&flagged=exclude&format=studio&exclude_errors=on"
            "&require_achievements=place_table&history_frames=2"
        ),
        "episode_viewer_256_turns": f"/episodes/{ids['episode_id']}/",
        "episode_viewer_10000_turns": f"/episodes/{ids['long_episode_id']}/",
        "episode_viewer_turn_detail": f"/episodes/{ids['long_episode_id']}/turns/5000/",
    }


def deep_cursor(offset: int) -> str:
    """The turn list's cursor after `offset` rows (what following `next` that far gives)."""
    from rollouts.models import Turn
    from rollouts.selectors_review import TURN_LIST_ORDER
    from studio.pagination import _encode

    row = Turn.objects.order_by(*TURN_LIST_ORDER)[offset]
    return _encode(row, [(name.lstrip("-"), name.startswith("-")) for name in TURN_LIST_ORDER])


def measure(client, ids, requests: int, viewer_requests: int) -> dict[str, dict]:
    out = {}
    for name, path in pages(ids).items():
        out[name] = time_page(
            client, path, viewer_requests if name.startswith("episode_viewer") else requests
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000_000)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=20, help="per page, after a warm-up")
    parser.add_argument("--viewer-requests", type=int, default=5)
    args = parser.parse_args()
    if args.turns <= args.small:
        sys.exit("scale: --turns must be more than --small")

    import os

    os.environ.pop("DEBUG", None)
    database = bench_database("studio_bench_scale")
    setup_django(database)
    from django.contrib.auth.models import User
    from django.test import Client

    from rollouts.models import Episode

    started = time.perf_counter()
    long_episode_id = seed_long_episode()
    small_seconds = seed_turns(args.small - LONG_EPISODE_TURNS)
    batch = Episode.objects.exclude(id=long_episode_id).order_by("id").first().batch_id
    ids = {
        "batch_id": batch,
        "episode_id": Episode.objects.filter(batch_id=batch).order_by("id").first().id,
        "long_episode_id": long_episode_id,
        "deep_cursor": deep_cursor(args.small // 2),
    }
    user = User.objects.create_superuser("scale", password="scale-pass-123")
    client = Client()
    client.force_login(user)
    small = measure(client, ids, args.requests, args.viewer_requests)
    seed_seconds = time.perf_counter() - started

    grow_seconds = seed_turns(args.turns - args.small)
    large = measure(client, ids, args.requests, args.viewer_requests)

    with_ratio = {
        name: {
            f"at_{args.small}": small[name],
            f"at_{args.turns}": large[name],
            "p95_ratio": round(large[name]["p95_ms"] / max(small[name]["p95_ms"], 0.1), 2),
        }
        for name in small
    }
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        size = cursor.fetchone()[0]
    print(
        json.dumps(
            {
                "benchmark": "scale",
                "database": database,
                "turns_small": args.small,
                "turns_large": args.turns,
                "seed_seconds_small": round(seed_seconds, 1),
                "seed_seconds_small_sql": round(small_seconds, 1),
                "seed_seconds_growth": round(grow_seconds, 1),
                "database_bytes": size,
                "requests_per_page": args.requests,
                "target_p95_ms": 300,
                "pages": with_ratio,
                "over_300ms_p95_at_large": sorted(n for n, r in large.items() if r["p95_ms"] > 300),
                "note": "in-process Django test client on a shared 2-core machine",
            }
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
