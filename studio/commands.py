"""What every management command shares: what reaches the terminal, one error style, progress.

Every line a command prints goes through `TerminalOutput`: a batch's model name, a provider's
error, a file's name or content may hold escape sequences that retitle or clear a terminal,
and escaping them where the text is written, once, covers every command and every line
without each print remembering to. An error is `NAME: error: MESSAGE` on stderr (argparse's
own style, so a bad flag and a bad value read alike), one line per problem, exit non-zero.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from django.core.management.base import (
    BaseCommand,
    CommandError,
    CommandParser,
    OutputWrapper,
    SystemCheckError,
)
from tqdm import tqdm

from studio.jobs import is_outage
from studio.untrusted import terminal_safe


class TerminalOutput(OutputWrapper):
    """A command's stdout or stderr: every control character but the newline is escaped
    (`\\x1b`) before it is written; colours added after that (Django's styles) still work."""

    def write(self, msg: str = "", style_func: Any = None, ending: str | None = None) -> None:
        super().write(terminal_safe(msg, keep_lines=True), style_func, ending)


def _terminal_output(stream: OutputWrapper | TextIO) -> TerminalOutput:
    if isinstance(stream, TerminalOutput):
        return stream
    if isinstance(stream, OutputWrapper):
        wrapped = TerminalOutput(stream._out, ending=stream.ending)
        wrapped.style_func = stream.style_func
        return wrapped
    return TerminalOutput(stream)


def error_lines(command: str, message: str) -> list[str]:
    """A command's error as it prints it: one `NAME: error: ...` line per line of `message`."""
    return [f"{command}: error: {line}" for line in message.split("\n")]


class StudioCommand(BaseCommand):
    """Bad input is `NAME: error: ...` on stderr and exit status 2, as argparse says it; a
    database or task queue that cannot be reached is one line too, and exit status 1."""

    # Django assigns `self.stdout` and `self.stderr` itself (when built, and again in
    # `execute` for `call_command(stdout=...)`): each assignment is wrapped here, so no path
    # to the terminal bypasses the escaping.
    @property
    def stdout(self) -> TerminalOutput:
        return self._terminal_stdout

    @stdout.setter
    def stdout(self, stream: OutputWrapper | TextIO) -> None:
        self._terminal_stdout = _terminal_output(stream)

    @property
    def stderr(self) -> TerminalOutput:
        return self._terminal_stderr

    @stderr.setter
    def stderr(self, stream: OutputWrapper | TextIO) -> None:
        self._terminal_stderr = _terminal_output(stream)

    @property
    def command_name(self) -> str:
        return getattr(self, "_command_name", "") or type(self).__module__.rsplit(".", 1)[-1]

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return self._execute_saying_outages(*args, **options)
        except SystemCheckError:
            raise  # Django formats its own check report
        except CommandError as exc:
            if not self._called_from_command_line or options.get("traceback"):
                raise
            self.fail(str(exc), returncode=exc.returncode)
        except Exception:
            if not self._called_from_command_line or options.get("traceback"):
                raise
            # A bug: its traceback is shown, escaped like every other line (it may quote a
            # provider's answer or a file's content).
            self.stderr.write(traceback.format_exc().rstrip("\n"))
            sys.exit(1)

    def _execute_saying_outages(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except Exception as exc:
            if not is_outage(exc):
                raise
            # One line, not the driver's traceback: what is down, and what to do.
            reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise CommandError(
                f"the database or the task queue is unreachable ({reason or type(exc).__name__}); "
                "nothing was lost: run it again once it is back",
                returncode=1,
            ) from None

    def fail(self, message: str, *, returncode: int) -> None:
        """Print `message` as this command's error (one line per line) and exit."""
        for line in error_lines(self.command_name, message):
            self.stderr.write(line)
        sys.exit(returncode)

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        self._command_name = subcommand
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def error(message: str) -> None:
            self.fail(message, returncode=2)

        parser.error = error  # type: ignore[method-assign]
        return parser


def usage_error(message: str) -> CommandError:
    return CommandError(message, returncode=2)


def progress_bar(*, total: int | None, desc: str, unit: str) -> tqdm:
    """A progress bar on a terminal (stderr), silent when piped."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not sys.stderr.isatty())


@contextmanager
def beside_progress_bars() -> Iterator[None]:
    """Lines written inside it (through the command's stderr) do not tear a progress bar:
    the bars are cleared first and drawn again after."""
    with tqdm.external_write_mode(file=sys.stderr):
        yield
