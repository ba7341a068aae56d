from django.db import migrations, models


def _record_old_prompts(apps, schema_editor):
    """Batches played before prompts were versioned were sent version 1; keep its text."""
    RolloutBatch = apps.get_model("rollouts", "RolloutBatch")
    Turn = apps.get_model("rollouts", "Turn")
    for batch in RolloutBatch.objects.filter(policy="openai").iterator():
        request = (
            Turn.objects.filter(episode__batch=batch)
            .exclude(request_messages=[])
            .order_by("-episode_id", "-index")
            .values_list("request_messages", flat=True)
            .first()
        )
        text = ""
        for message in request or []:
            if isinstance(message, dict) and message.get("role") == "system":
                text = str(message.get("content") or "")
                break
        RolloutBatch.objects.filter(id=batch.id).update(prompt_version=1, system_prompt=text)


class Migration(migrations.Migration):
    dependencies = [
        ("rollouts", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="rolloutbatch",
            name="prompt_version",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="rolloutbatch",
            name="system_prompt",
            field=models.TextField(blank=True),
        ),
        migrations.RunPython(_record_old_prompts, migrations.RunPython.noop),
    ]
