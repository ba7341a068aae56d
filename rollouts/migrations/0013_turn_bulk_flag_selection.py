"""Bulk flags store their filter as `rollouts.review.turn_selection.TurnSelection` JSON.

They stored the turn list's own filter (`TurnFilters`: batch_id, model, achievement, ...)
until the turn list and datasets shared one selection. A job's filter is read again when
the worker (re)starts it and for its link back to the list, so each stored one is rewritten
once to the selection that picks the same turns: every turn (fork prefixes and text-fallback
turns included, as the turn list shows them) narrowed by the same conditions.
"""

from django.db import migrations


def turn_filters_to_selection(old: dict) -> dict:
    """The TurnSelection JSON for a TurnFilters JSON (a stored selection is kept as is)."""
    if "include_fork_prefix" in old:  # every TurnSelection JSON has it, no TurnFilters had
        return old

    def one(key: str) -> list:
        value = old.get(key)
        return [] if value in (None, "") else [value]

    return {
        "batches": one("batch_id"),
        "models": one("model"),
        "policies": one("policy"),
        "seeds": one("seed"),
        "turn_unlocked": one("achievement"),
        "reward": old.get("reward") or "any",
        "search": old.get("search") or "",
        "flagged": old.get("flagged") or "any",
        "has_error": old.get("has_error") or "any",
        "include_text_fallback": True,
        "include_fork_prefix": True,
    }


def forwards(apps, schema_editor) -> None:
    TurnBulkFlag = apps.get_model("rollouts", "TurnBulkFlag")
    for job in TurnBulkFlag.objects.only("id", "filters").iterator():
        new = turn_filters_to_selection(job.filters or {})
        if new != job.filters:
            TurnBulkFlag.objects.filter(id=job.id).update(filters=new)


class Migration(migrations.Migration):
    dependencies = [("rollouts", "0012_turn_batch_page_indexes")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
