"""The review pages at team scale: p50 / p95 server time per page at 100k turns and at N.

    python benchmarks/scale.py [--turns 10000000] [--small 100000] [--requests 20]
                               [--reuse | --fresh] [--prepare-only | --measure-only]
                               [--pages PATTERN ...]

Two PostgreSQL databases of its own, seeded once and kept between runs: `studio_scale_100k`
(`--small`) and `studio_scale_10m` (`--turns`; other sizes get `studio_scale_<turns>`, or
BENCH_DATABASE). A database that already holds its turn count (recorded in its `scale_seed`
table when seeding finished) is reused and only migrated, so new indexes apply (the
migration's time is printed); `--fresh` drops and re-seeds both. Writing SEEDED_10M at the
checkout's root says the 10-million database is ready.

Turns are seeded with SQL (`generate_series`, no Python per row), in transactions of four
batches, with the turn and frame tables' indexes and constraints dropped during the load and
built after, then VACUUM ANALYZE: batches of 1,000 episodes x 256 turns, three models, a
frame per turn, ~0.1% flagged, ~0.5% failed, `collect_wood` unlocked at turn 17 of every
episode, `place_table` in a third of them and `collect_diamond` in one turn in 100,003; one
10,000-turn episode (crafter's own default length) with VLM-sized turns for the episode
viewer; and two finished batches of 1,000 episodes on seeds 0-999 (episodes only) for the
comparison page.

The same pages are timed against both databases in one run (each in a process of its own):
each page's ratio shows how its cost grows with the table. Timing is in-process through
Django's test client (the whole request: middleware, session, view, queries, template),
`--requests` times per page after one warm-up; `cpu_p50_ms` is this process's CPU time per
request (load-independent; the database's work is not in it); `bytes` is the page's size.
`_uncached` rows empty the cache before each request (the comparison's and leaderboard's
statistics are cached per set of episodes, a long ended episode's index per episode). The
machine may be shared: compare ratios.

The turn list is timed with each filter (and none) in each of its sort orders too
(`turn_list_model_by_seed`, `turn_list_by_reward_desc` for `sort=-reward`). `--pages`
times only the pages whose names match a pattern (`--pages 'turn_list*_by_*'`);
`--measure-only` times the databases as they are (no seeding, no migration).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, use_own_cache

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


def _bulk_session(cursor) -> None:
    """Session settings for loading: no wait for the WAL flush, room to sort index builds."""
    cursor.execute("SET synchronous_commit = off")
    cursor.execute("SET maintenance_work_mem = '1GB'")
    cursor.execute("SET max_parallel_maintenance_workers = 2")


def seed_turns(count: int, first_ids: tuple[int, int, int] | None = None) -> float:
    """Add `count` turns with SQL, one transaction; returns the seconds it took.

    `first_ids` (batch, episode, frame) when the caller knows them: while the tables have no
    primary key index (a bulk load), max(id) would read the whole table. Sequences are then
    the caller's to reset."""
    from django.db import connection, transaction

    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")
        batch, episode, frame = first_ids or _next_ids(cursor)
        for statement in _turn_insert(
            first_batch=batch, first_episode=episode, first_frame=frame, count=count
        ):
            if "%(observation)s" in statement:
                # `%` is the parameter marker: the SQL's modulo signs are doubled.
                cursor.execute(statement.replace(" % ", " %% "), {"observation": OBSERVATION})
            else:
                cursor.execute(statement)
        if first_ids is None:
            _reset_sequences(cursor)
    return time.perf_counter() - started


# The big tables: their indexes and constraints are dropped for the load and built after.
_LOADED_TABLES = ("rollouts_frame", "rollouts_turn")


def _drop_indexes(cursor) -> tuple[list[str], list[str]]:
    """Drop the indexes and constraints of (and foreign keys into) the turn and frame tables;
    returns the statements that re-create them: (indexes, constraints in order)."""
    tables = ", ".join(f"'{t}'::regclass" for t in _LOADED_TABLES)
    cursor.execute(
        f"""SELECT conname, conrelid::regclass::text, pg_get_constraintdef(oid), contype
        FROM pg_constraint
        WHERE (conrelid IN ({tables}) OR confrelid IN ({tables})) AND contype IN ('p', 'u', 'f')
        ORDER BY contype = 'f' DESC"""
    )
    constraints = cursor.fetchall()
    for name, table, _definition, _kind in constraints:  # foreign keys first
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    cursor.execute(
        f"""SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        FROM pg_index i WHERE i.indrelid IN ({tables})"""
    )
    indexes = cursor.fetchall()
    for name, _definition in indexes:
        cursor.execute(f"DROP INDEX {name}")
    rebuild_constraints = [
        f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}'
        for name, table, definition, kind in sorted(constraints, key=lambda c: c[3] == "f")
    ]
    return [definition for _name, definition in indexes], rebuild_constraints


def bulk_seed(count: int, chunk: int = 4 * EPISODES_PER_BATCH * EPISODE_TURNS) -> dict:
    """Seed `count` turns into an empty, migrated database: the long episode with the
    indexes in place, then the rest in chunks of whole batches with the turn and frame
    indexes dropped, then indexes and constraints rebuilt, VACUUM ANALYZE. Seconds per
    phase."""
    from django.db import connection

    timings: dict[str, float] = {}
    started = time.perf_counter()
    long_episode_id = seed_long_episode()
    with connection.cursor() as cursor:
        _bulk_session(cursor)
        batch, episode, frame = _next_ids(cursor)
        indexes, constraints = _drop_indexes(cursor)
    remaining = count - LONG_EPISODE_TURNS
    done = 0
    load_started = time.perf_counter()
    while done < remaining:
        step = min(chunk, remaining - done)  # whole batches but for the last
        seed_turns(step, (batch, episode, frame))
        episodes = -(-step // EPISODE_TURNS)
        batch += -(-episodes // EPISODES_PER_BATCH)
        episode += episodes
        frame += step
        done += step
        print(
            f"scale: {done:,} / {remaining:,} turns loaded "
            f"({time.perf_counter() - load_started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    timings["load_seconds"] = round(time.perf_counter() - load_started, 1)
    build_started = time.perf_counter()
    with connection.cursor() as cursor:
        _bulk_session(cursor)
        for statement in indexes + constraints:
            cursor.execute(statement)
            print(f"scale: {statement[:90]} done", file=sys.stderr, flush=True)
        _reset_sequences(cursor)
    timings["index_seconds"] = round(time.perf_counter() - build_started, 1)
    vacuum_started = time.perf_counter()
    with connection.cursor() as cursor:
        # What autovacuum would do on a table this old: visibility map (index-only scans),
        # hint bits, statistics.
        cursor.execute("VACUUM (ANALYZE)")
    timings["vacuum_analyze_seconds"] = round(time.perf_counter() - vacuum_started, 1)
    timings["seed_seconds"] = round(time.perf_counter() - started, 1)
    timings["long_episode_id"] = long_episode_id
    return timings


def seed_long_episode() -> int:
    """One 10,000-turn episode of VLM-sized turns (its own batch); returns its id."""
    from django.db import connection

    from rollouts.game.tools import SYSTEM_PROMPT

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


def time_page(client, path: str, requests: int, *, uncached: bool = False) -> dict[str, float]:
    """p50 / p95 / mean server time of `requests` GETs after a warm-up, and the process's CPU
    time per request (p50: what the page costs here whatever the machine's load; the
    database's work is in another process). `uncached`: the cache is emptied before each."""
    from django.core.cache import cache

    response = client.get(path)  # warm-up, and the size
    if response.status_code != 200:
        raise RuntimeError(f"GET {path}: {response.status_code}")
    size = len(response.content)
    times, cpu = [], []
    for _ in range(requests):
        if uncached:
            cache.clear()
        start, start_cpu = time.perf_counter(), time.process_time()
        client.get(path)
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return {
        "p50_ms": round(_percentile(times, 0.5), 1),
        "p95_ms": round(_percentile(times, 0.95), 1),
        "mean_ms": round(statistics.fmean(times), 1),
        "cpu_p50_ms": round(_percentile(cpu, 0.5), 1),
        "bytes": size,
    }


def pages(ids: dict[str, object]) -> dict[str, str]:
    """The pages timed at both sizes: the same addresses. Each turn-list filter (and none)
    also in every other sort order of the list: `turn_list_model_by_seed`,
    `turn_list_by_reward_desc` (`sort=-reward`), ..."""
    from rollouts.review.selectors import TURN_SORTS

    table = _pages(ids)
    filtered = {
        name: path
        for name, path in table.items()
        if name.startswith("turn_list") and name != "turn_list_deep_page"
    }
    for name, path in filtered.items():
        for sort in TURN_SORTS:
            if sort:
                suffix = f"{sort.lstrip('-')}{'_desc' if sort.startswith('-') else ''}"
                table[f"{name}_by_{suffix}"] = f"{path}{'&' if '?' in path else '?'}sort={sort}"
    return table


def _pages(ids: dict[str, object]) -> dict[str, str]:
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
        "compare_2x1000_episodes": f"/compare/?batches={ids['compare']}",
        # The statistics are cached per set of episodes: the first view after they change.
        "compare_2x1000_episodes_uncached": f"/compare/?batches={ids['compare']}",
        "leaderboard": "/leaderboard/",
        "leaderboard_uncached": "/leaderboard/",
        "episode_viewer_256_turns": f"/episodes/{ids['episode_id']}/",
        "episode_viewer_10000_turns": f"/episodes/{ids['long_episode_id']}/",
        # A long ended episode's index is cached: the first view of it, or after a day.
        "episode_viewer_10000_turns_uncached": f"/episodes/{ids['long_episode_id']}/",
        "episode_viewer_turn_detail": f"/episodes/{ids['long_episode_id']}/turns/5000/",
    }


def deep_cursor(offset: int) -> str:
    """The turn list's cursor after `offset` rows (what following `next` that far gives)."""
    from rollouts.models import Turn
    from rollouts.review.selectors import TURN_LIST_ORDER
    from studio.pagination import _encode

    row = Turn.objects.order_by(*TURN_LIST_ORDER)[offset]
    return _encode(row, [(name.lstrip("-"), name.startswith("-")) for name in TURN_LIST_ORDER])


def measure(
    client, ids, requests: int, viewer_requests: int, only: list[str] | None = None
) -> dict[str, dict]:
    """Time the pages, or those whose names match one of the `only` patterns (fnmatch)."""
    out = {}
    for name, path in pages(ids).items():
        if only and not any(fnmatch.fnmatchcase(name, pattern) for pattern in only):
            continue
        out[name] = time_page(
            client,
            path,
            viewer_requests if name.startswith("episode_viewer") else requests,
            uncached=name.endswith("_uncached"),
        )
    return out


# --- databases kept between runs -----------------------------------------------------------

SMALL_DATABASE = "studio_scale_100k"
LARGE_DATABASE = "studio_scale_10m"
MARKER_10M = ROOT / "SEEDED_10M"


def _postgres_base() -> str:
    return os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")


def _seeded_turns(database: str) -> int | None:
    """The turn count recorded when seeding `database` finished; None: missing or unfinished."""
    import psycopg

    base = _postgres_base()
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone():
            return None
    with psycopg.connect(f"{base}/{database}", autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass('scale_seed')").fetchone()[0]:
            return None
        row = conn.execute("SELECT turns FROM scale_seed").fetchone()
        return row[0] if row else None


def _recreate(database: str) -> None:
    import psycopg

    with psycopg.connect(f"{_postgres_base()}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')


def _django(database: str) -> None:
    """Point Django at `database` as it is (no drop, no migrate)."""
    os.environ["DATABASE_URL"] = f"{_postgres_base()}/{database}"
    use_own_cache()
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    os.environ.pop("DEBUG", None)
    import django

    django.setup()


def prepare(database: str, turns: int, fresh: bool) -> dict:
    """Make `database` hold `turns` seeded turns, migrated to this checkout: kept from an
    earlier run when it holds them (migrate only), else dropped and seeded."""
    from_before = None if fresh else _seeded_turns(database)
    reused = from_before == turns
    if not reused:
        _recreate(database)
    _django(database)
    from django.core.management import call_command
    from django.db import connection

    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    migrate_seconds = time.perf_counter() - started
    result: dict[str, object] = {
        "database": database,
        "turns": turns,
        "reused": reused,
        "migrate_seconds": round(migrate_seconds, 1),
    }
    if reused:
        with connection.cursor() as cursor:
            cursor.execute("SELECT seed_seconds, seeded_at FROM scale_seed")
            seconds, seeded_at = cursor.fetchone()
        result |= {"seed_seconds": seconds, "seeded_at": seeded_at.isoformat()}
    else:
        result |= bulk_seed(turns)
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE TABLE scale_seed (turns bigint, seed_seconds float, "
                "seeded_at timestamptz DEFAULT now())"
            )
            cursor.execute(
                "INSERT INTO scale_seed (turns, seed_seconds) VALUES (%s, %s)",
                [turns, result["seed_seconds"]],
            )
    ensure_compare_batches()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        result["database_bytes"] = cursor.fetchone()[0]
    return result


COMPARE_NAMES = ("scale compare base", "scale compare tuned")


def ensure_compare_batches() -> list[int]:
    """Two finished batches of 1,000 episodes on seeds 0-999 (episodes only: the comparison
    reads no turn), the same in every database; added when missing. Achievements are drawn
    per (batch, seed, achievement) from a hash, easier ones (every 4th) more often."""
    from django.db import connection

    from rollouts.game.crafter_env import ACHIEVEMENTS

    ids = []
    with connection.cursor() as cursor:
        for skill, name in zip((25, 35), COMPARE_NAMES, strict=True):
            cursor.execute("SELECT id FROM rollouts_rolloutbatch WHERE name = %s", [name])
            row = cursor.fetchone()
            if row:
                ids.append(row[0])
                continue
            cursor.execute(
                """INSERT INTO rollouts_rolloutbatch (name, policy, model, endpoint, seeds,
                    step_limit, image_size, settings, status, episodes_total,
                    episodes_finished, episodes_failed, model_calls, model_errors,
                    model_retries, prompt_tokens, completion_tokens, created_at,
                    crafter_version, numpy_version, opensimplex_version, error,
                    prompt_version, system_prompt, endpoint_name)
                VALUES (%s, 'openai', %s, 'http://127.0.0.1:9/v1', '[]', 256, 64, '{}',
                    'finished', 1000, 1000, 0, 0, 0, 0, 0, 0, now() - interval '1 year',
                    '1.8.3', '', '', '', 1, '', '') RETURNING id""",
                [name, name.split()[-1]],
            )
            batch_id = cursor.fetchone()[0]
            cursor.execute(
                """INSERT INTO rollouts_episode (batch_id, seed, status, steps, total_reward,
                    achievements, achievement_count, tool_calls, model_calls, model_errors,
                    model_retries, bad_outputs, prompt_tokens, completion_tokens, error,
                    attempts, claim_token, fork_prefix_turns, fork_with_correction, sample)
                SELECT %(batch)s, s, 'finished', 256, u.n, u.a, u.n, 0, 0, 0, 0, 0, 0, 0, '',
                    1, '', 0, false, 0
                FROM generate_series(0, 999) AS s,
                LATERAL (
                    SELECT coalesce(jsonb_object_agg(name, 10 * i), '{}'::jsonb) AS a,
                        count(*) AS n
                    FROM unnest(%(names)s::text[]) WITH ORDINALITY AS x(name, i)
                    WHERE ('x' || substr(md5(%(batch)s || ':' || s || ':' || name), 1, 4))
                        ::bit(16)::int %% 100
                        < CASE WHEN i %% 4 = 1 THEN %(skill)s ELSE %(skill)s * 2 / 5 END
                ) AS u""",
                {"batch": batch_id, "names": list(ACHIEVEMENTS), "skill": skill},
            )
            ids.append(batch_id)
            cursor.execute("ANALYZE rollouts_episode")
            cursor.execute("ANALYZE rollouts_rolloutbatch")
    return ids


def _ids() -> dict[str, object]:
    """The rows the pages are about, found in a seeded database."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM rollouts_rolloutbatch WHERE name = 'scale long episode' ")
        long_batch = cursor.fetchone()[0]
        cursor.execute(
            "SELECT min(id) FROM rollouts_rolloutbatch WHERE name LIKE 'scale %%' "
            "AND name NOT LIKE 'scale compare%%' AND id <> %s",
            [long_batch],
        )
        first = cursor.fetchone()[0]
        cursor.execute(
            "SELECT id FROM rollouts_rolloutbatch WHERE name = ANY(%s) ORDER BY id",
            [list(COMPARE_NAMES)],
        )
        base, tuned = (row[0] for row in cursor.fetchall())
        cursor.execute("SELECT min(id) FROM rollouts_episode WHERE batch_id = %s", [first])
        episode = cursor.fetchone()[0]
        cursor.execute("SELECT id FROM rollouts_episode WHERE batch_id = %s", [long_batch])
        long_episode = cursor.fetchone()[0]
        cursor.execute("SELECT turns FROM scale_seed")
        turns = cursor.fetchone()[0]
    return {
        "batch_id": first,
        "compare": f"{base},{tuned}",
        "episode_id": episode,
        "long_episode_id": long_episode,
        "deep_cursor": deep_cursor(min(turns // 2, 50_000)),
    }


def measure_database(
    database: str, requests: int, viewer_requests: int, only: list[str] | None = None
) -> dict:
    """Time every page (or the `only` ones) against `database` (prepared), as the superuser
    `scale`."""
    _django(database)
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.filter(username="scale").first() or User.objects.create_superuser(
        "scale", password="scale-pass-123"
    )
    client = Client()
    client.force_login(user)
    return measure(client, _ids(), requests, viewer_requests, only)


def _child(*args: str) -> dict:
    """Run this script's `args` in a process of its own (one Django set-up per database);
    its last stdout line is its JSON result."""
    completed = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *args],
        cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000_000)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=20, help="per page, after a warm-up")
    parser.add_argument("--viewer-requests", type=int, default=5)
    keep = parser.add_mutually_exclusive_group()
    keep.add_argument(
        "--reuse",
        action="store_true",
        help="keep a database that already holds its turn count, migrate it (the default)",
    )
    keep.add_argument("--fresh", action="store_true", help="drop and re-seed both databases")
    parser.add_argument("--prepare-only", action="store_true", help="seed / migrate, time nothing")
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="time the databases as they are: no seeding, no migration (seeded earlier)",
    )
    parser.add_argument(
        "--pages",
        nargs="+",
        metavar="PATTERN",
        help="time only the pages whose names match (shell-style: 'turn_list_*_by_seed*')",
    )
    parser.add_argument("--only-database", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=("prepare", "measure"), help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "prepare":
        count = args.turns
        print(json.dumps(prepare(args.database, count, args.fresh), default=str))
        return
    if args.child == "measure":
        timed = measure_database(args.database, args.requests, args.viewer_requests, args.pages)
        print(json.dumps(timed))
        return
    if args.measure_only and (args.prepare_only or args.fresh):
        sys.exit("scale: --measure-only times the databases as they are")
    if args.turns <= args.small:
        sys.exit("scale: --turns must be more than --small")
    large_name = os.environ.get("BENCH_DATABASE") or (
        LARGE_DATABASE if args.turns == 10_000_000 else f"studio_scale_{args.turns}"
    )
    small_name = SMALL_DATABASE if args.small == 100_000 else f"studio_scale_{args.small}"
    sizes = [(large_name, args.turns), (small_name, args.small)]
    if args.only_database:
        sizes = [size for size in sizes if size[0] == args.only_database]
    prepared = {}
    for name, count in [] if args.measure_only else sizes:
        flags = ["--fresh"] if args.fresh else []
        prepared[name] = _child(
            "--child", "prepare", "--database", name, "--turns", str(count), *flags
        )
        if name == LARGE_DATABASE:
            MARKER_10M.write_text(json.dumps(prepared[name], default=str) + "\n")
        print(f"scale: {json.dumps(prepared[name], default=str)}", file=sys.stderr, flush=True)
    if args.prepare_only:
        print(json.dumps({"benchmark": "scale", "prepared": prepared}))
        return

    timed, load = {}, {}
    for name, _count in sizes:
        load[name] = {"before": _load()}
        timed[name] = _child(
            "--child",
            "measure",
            "--database",
            name,
            "--requests",
            str(args.requests),
            "--viewer-requests",
            str(args.viewer_requests),
            *(["--pages", *args.pages] if args.pages else []),
        )
        load[name]["after"] = _load()
    small, large = timed.get(small_name, {}), timed.get(large_name, {})
    with_ratio = {
        name: {
            f"at_{args.small}": small.get(name),
            f"at_{args.turns}": large.get(name),
            "p95_ratio": (
                round(large[name]["p95_ms"] / max(small[name]["p95_ms"], 0.1), 2)
                if name in small and name in large
                else None
            ),
        }
        for name in {**small, **large}
    }
    print(
        json.dumps(
            {
                "benchmark": "scale",
                "turns_small": args.small,
                "turns_large": args.turns,
                "databases": prepared,
                "load_average": load,
                "requests_per_page": args.requests,
                "target_p95_ms": 300,
                "pages": with_ratio,
                "over_300ms_p95_at_large": sorted(n for n, r in large.items() if r["p95_ms"] > 300),
                "note": "in-process Django test client on a shared 2-core machine",
            },
            default=str,
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
