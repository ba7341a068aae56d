from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _seed_endpoints(sender, **kwargs) -> None:
    from studio.endpoints import endpoints_seed_defaults

    endpoints_seed_defaults()


class StudioConfig(AppConfig):
    name = "studio"

    def ready(self) -> None:
        # Connects the login throttle's signal receivers.
        from studio import login_throttle  # noqa: F401

        # OPENAI_BASE_URL / SYNTH_BACKEND_URL seed a default endpoint of each kind.
        post_migrate.connect(_seed_endpoints, sender=self)
