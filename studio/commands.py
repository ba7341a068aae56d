"""What every management command shares: one-line errors with exit status 2, progress bars."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from studio.jobs import is_outage
from studio.untrusted import terminal_safe


class StudioCommand(BaseCommand):
    """Bad input is one clear line on stderr and exit status 2 (SPEC section 4); a database or
    task queue that cannot be reached is one line too, and exit status 1."""

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except Exception as exc:
            if not is_outage(exc):
                raise
            # One line, not the driver's traceback: what is down, and what to do.
            reason = terminal_safe(str(exc).strip().splitlines()[0][:300]) if str(exc) else ""
            raise CommandError(
                f"the database or the task queue is unreachable ({reason or type(exc).__name__}); "
                "nothing was lost: run it again once it is back",
                returncode=1,
            ) from None

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def error(message: str) -> None:
            sys.stderr.write(f"{subcommand}: error: {message}\n")
            sys.exit(2)

        parser.error = error  # type: ignore[method-assign]
        return parser


def usage_error(message: str) -> CommandError:
    return CommandError(message, returncode=2)


def progress_bar(*, total: int, desc: str, unit: str) -> tqdm:
    """A progress bar on a terminal (stderr), silent when piped."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not sys.stderr.isatty())
