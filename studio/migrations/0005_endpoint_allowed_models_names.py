from django.db import migrations, models

import studio.model_names


def allowed_models_repair(apps, schema_editor):
    """Make every stored value fit the rule, never allowing more than it did: a list keeps its
    model names (the first 50); a row left with none (a string, a number, a list of no
    names) would allow any model, so it is also disabled, for an admin to look at again."""
    Endpoint = apps.get_model("studio", "Endpoint")
    for endpoint in Endpoint.objects.all():
        value = endpoint.allowed_models
        if studio.model_names.allowed_models_problem(value) is None:
            continue
        names = value if isinstance(value, list) else []
        kept = [name for name in names if studio.model_names.allowed_model_names([name])]
        kept = list(dict.fromkeys(kept))[: studio.model_names.MAX_ALLOWED_MODELS]
        endpoint.allowed_models = kept
        if not kept:
            endpoint.enabled = False
        endpoint.save(update_fields=["allowed_models", "enabled"])


class Migration(migrations.Migration):
    dependencies = [
        ("studio", "0004_endpoint_prices"),
    ]

    operations = [
        migrations.AlterField(
            model_name="endpoint",
            name="allowed_models",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text='Model ids users may pick, as a JSON list of names, e.g. ["gpt-4o-mini"]: at most 50 names of 1 to 200 characters. Empty ([]): any model.',
            ),
        ),
        migrations.RunPython(allowed_models_repair, migrations.RunPython.noop, elidable=False),
        migrations.AddConstraint(
            model_name="endpoint",
            constraint=models.CheckConstraint(
                condition=studio.model_names.AllowedModelsValid("allowed_models"),
                name="endpoint_allowed_models_names",
            ),
        ),
    ]
