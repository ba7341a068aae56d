from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _seed_endpoints(sender, stdout=None, **kwargs) -> None:
    import sys

    from studio.endpoints import endpoints_seed_defaults

    # Said at every verbosity (`make demo` migrates with -v0): calls may be billed there.
    out = stdout or sys.stdout
    endpoints_seed_defaults(say=lambda line: out.write(line + "\n"))


def _name_worker(sender=None, **kwargs) -> None:
    from studio import claim_keeper

    if sender:
        claim_keeper.name_worker(str(sender))


def _take_over_from_predecessor(sender=None, **kwargs) -> None:
    """A worker starting under a name that holds running jobs (episodes, probe chunks)
    replaces a worker that is gone (a restart): it takes them over now, not once they go
    stale. The apps registered their keepers in their `ready()`."""
    import logging

    from studio import claim_keeper, jobs

    try:
        jobs.take_over_all(claim_keeper.worker_name())
    except Exception:  # the database is down: the periodic requeue takes them over later
        logging.getLogger(__name__).warning("could not take over jobs", exc_info=True)


class StudioConfig(AppConfig):
    name = "studio"

    def ready(self) -> None:
        # Connects the login throttle's signal receivers.
        from studio import login_throttle  # noqa: F401

        # OPENAI_BASE_URL / SYNTH_BACKEND_URL seed a default endpoint of each kind.
        post_migrate.connect(_seed_endpoints, sender=self)

        # A worker records its node name on its claims, and takes over at start what a worker
        # of the same name held (`studio.claim_keeper`).
        from celery import signals

        signals.celeryd_after_setup.connect(_name_worker, weak=False)
        signals.worker_ready.connect(_take_over_from_predecessor, weak=False)
