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

        from celery import signals

        signals.celeryd_after_setup.connect(_name_worker, weak=False)
        signals.worker_ready.connect(_take_over_from_predecessor, weak=False)

        # Registers the job kinds with the periodic requeue.
        from rollouts import jobs  # noqa: F401


def _build_a_game(**kwargs) -> None:
    """A worker builds the game's textures and compiled kernels before its first episode."""
    from rollouts.game.crafter_env import warm_up

    warm_up()


def _name_worker(sender=None, **kwargs) -> None:
    """Claims record the worker's node name (see `rollouts.recording.claim_keeper`)."""
    from rollouts.recording import claim_keeper

    if sender:
        claim_keeper.name_worker(str(sender))


def _take_over_from_predecessor(sender=None, **kwargs) -> None:
    """A worker starting under a name that holds running episodes replaces a worker that is
    gone (a restart): it takes them over now, not once they go stale."""
    import logging

    from rollouts.recording import claim_keeper

    try:
        claim_keeper.take_over(claim_keeper.worker_name())
    except Exception:  # the database is down: the periodic requeue takes them over later
        logging.getLogger(__name__).warning("could not take over episodes", exc_info=True)
