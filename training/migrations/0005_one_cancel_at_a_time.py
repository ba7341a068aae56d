from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0004_event_loss_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="cancel_token",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="trainingjob",
            name="cancel_held_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="trainingjob",
            name="cancel_tries",
            field=models.PositiveSmallIntegerField(default=0),
        ),
    ]
