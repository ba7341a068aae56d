from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


class RolloutsConfig(AppConfig):
    name = "rollouts"

    def ready(self) -> None:
        # Web, worker and every command start here: none may run on an unpinned crafter.
        from rollouts.game.library_pins import LibraryMismatch, library_pins_check

        try:
            library_pins_check()
        except LibraryMismatch as exc:
            raise ImproperlyConfigured(str(exc)) from None

        from studio.celery import worker_warm_up

        worker_warm_up.connect(_build_a_game, weak=False)

        # Registers the job kinds with the periodic requeue and a restarted worker's
        # take-over (`studio.jobs.take_over_all`).
        from rollouts import jobs  # noqa: F401


def _build_a_game(**kwargs) -> None:
    """A worker builds the game's textures and compiled kernels before its first episode."""
    from rollouts.game.crafter_env import warm_up

    warm_up()
