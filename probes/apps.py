from django.apps import AppConfig


class ProbesConfig(AppConfig):
    """Vision checkpoints: multiple-choice questions on recorded frames, answered by the
    game's own state, asked of models, and exported as training rows."""

    name = "probes"
    verbose_name = "Vision checkpoints"
