"""Indexes in the turn list's sort orders, so that every sort with any filter reads a page off
an index in its order at ten million turns (see rollouts.review.selectors.turn_list_page).

Sorted by seed or batch, the list walks the episodes in that order (two small indexes on
episodes); by turn index (either way) or reward, the turns (four indexes on turns, with the
flag and the reward beside their keys: a page's keys, (episode, index), come from the index
alone). Without them every matching turn was sorted for each page: a model's 3.3 million
turns by seed, 1.9-5.6 s.

CONCURRENTLY on PostgreSQL, as 0012: building must not block recording on a live table.
"""

import importlib

from django.db import migrations, models

AddIndexConcurrentlyOnPostgres = importlib.import_module(
    "rollouts.migrations.0012_turn_batch_page_indexes"
).AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("rollouts", "0014_turn_selection_indexes"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="episode",
            index=models.Index(fields=["seed", "id"], name="episode_seed_order_idx"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="episode",
            index=models.Index(fields=["batch", "id"], name="episode_batch_order_idx"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="turn",
            index=models.Index(
                fields=["index", "episode"],
                include=["flagged", "reward"],
                name="turn_sort_index_idx",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="turn",
            index=models.Index(
                fields=["-index", "episode"],
                include=["flagged", "reward"],
                name="turn_sort_index_desc_idx",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="turn",
            index=models.Index(
                fields=["reward", "episode", "index"],
                include=["flagged"],
                name="turn_sort_reward_idx",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="turn",
            index=models.Index(
                fields=["episode", "reward", "index"],
                include=["flagged"],
                name="turn_episode_reward_idx",
            ),
        ),
    ]
