from django.apps import AppConfig


class ProbesConfig(AppConfig):
    """Vision checkpoints: multiple-choice questions on recorded frames, answered by the
    game's own state, asked of models, and exported as training rows."""

    name = "probes"
    verbose_name = "Vision checkpoints"

    def ready(self) -> None:
        # Registers the probe chunk job kind with the periodic requeue; and the probe set
        # exporter with curation's export commands (curation cannot import probes, a later
        # app).
        from curation import probe_exports
        from probes import jobs  # noqa: F401
        from probes.exporting import EXPORTER

        probe_exports.register(EXPORTER)
