from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.migrations.operations import AddIndex, RemoveIndex


class AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    """CONCURRENTLY on PostgreSQL (a live table of millions of turns); a plain CREATE INDEX
    on SQLite, the demo's database, which has no such option."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            RemoveIndex.database_forwards(
                RemoveIndex(self.model_name, self.index.name),
                app_label,
                schema_editor,
                from_state,
                to_state,
            )


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction; it does not block recording.
    atomic = False

    dependencies = [
        ("rollouts", "0011_turn_viewer_indexes"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="turn",
            index=models.Index(
                condition=models.Q(("error_kind", ""), _negated=True),
                fields=["episode"],
                name="turn_episode_error_kind_idx",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="turn",
            index=models.Index(
                condition=models.Q(("latency_ms__gt", 0)),
                fields=["episode", "latency_ms"],
                name="turn_episode_latency_idx",
            ),
        ),
    ]
