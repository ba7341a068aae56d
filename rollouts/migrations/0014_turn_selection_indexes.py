"""Indexes for every turn-list filter at ten million turns (PostgreSQL only).

The turn list reads a page in (episode desc, index) order and stops at 51 rows; each filter
gets an index in that order holding only its matching turns, so a page costs the same at any
table size, however rare the match:

- "Unlocked": one partial index per achievement (`achievements_unlocked @> '["name"]'`,
  the query's own condition). The GIN index of 0008 found the matches but not in page order:
  the planner joined every match against the episodes (136 / 288 ms p50 / p95 at a million
  turns, growing with the table). A partial index holds a turn per unlock, a few per episode.
- reward > 0 and reward < 0 (= 0 is most turns: the list's own order index serves it).
- The search box (model text, note, observation text, `icontains`, which PostgreSQL runs as
  `UPPER(col) LIKE UPPER('%q%')`): trigram GIN indexes on `UPPER(col)` (pg_trgm), so a
  rare word no longer reads every turn.

SQLite (the demo's database) has no jsonb, GIN or pg_trgm and keeps its plain indexes.
CONCURRENTLY: on a live table of millions of turns, building must not block recording.
"""

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations

# crafter 1.8.3's achievements (rollouts.game.crafter_env.ACHIEVEMENTS; a test checks they agree).
ACHIEVEMENTS = (
    "collect_coal", "collect_diamond", "collect_drink", "collect_iron", "collect_sapling",
    "collect_stone", "collect_wood", "defeat_skeleton", "defeat_zombie", "eat_cow",
    "eat_plant", "make_iron_pickaxe", "make_iron_sword", "make_stone_pickaxe",
    "make_stone_sword", "make_wood_pickaxe", "make_wood_sword", "place_furnace", "place_plant",
    "place_stone", "place_table", "wake_up",
)  # fmt: skip

_PAGE_ORDER = '(episode_id DESC, "index")'
INDEXES: tuple[tuple[str, str], ...] = (
    *(
        (
            f"turn_unlocked_{name}_idx",
            f"{_PAGE_ORDER} WHERE achievements_unlocked @> '[\"{name}\"]'::jsonb",
        )
        for name in ACHIEVEMENTS
    ),
    ("turn_list_reward_positive_idx", f"{_PAGE_ORDER} WHERE reward > 0"),
    ("turn_list_reward_negative_idx", f"{_PAGE_ORDER} WHERE reward < 0"),
    ("turn_model_text_trgm", "USING gin (UPPER(model_text) gin_trgm_ops)"),
    ("turn_note_trgm", "USING gin (UPPER(note) gin_trgm_ops)"),
    ("turn_observation_text_trgm", "USING gin (UPPER(observation_text) gin_trgm_ops)"),
)
# 0008's GIN index on achievements_unlocked served only the "Unlocked" filter.
_REPLACED_GIN = ("turn_unlocked_gin", "USING gin (achievements_unlocked jsonb_path_ops)")


def _create(schema_editor, name: str, definition: str) -> None:
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON rollouts_turn {definition}"
    )


def indexes_create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, definition in INDEXES:
        _create(schema_editor, name, definition)
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {_REPLACED_GIN[0]}")


def indexes_drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    _create(schema_editor, *_REPLACED_GIN)
    for name, _definition in INDEXES:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [("rollouts", "0013_turn_bulk_flag_selection")]

    operations = [
        # No-op on other databases; pg_trgm is a trusted extension (PostgreSQL 13+): the
        # database's owner may create it.
        TrigramExtension(),
        migrations.RunPython(indexes_create, indexes_drop, elidable=False),
    ]
