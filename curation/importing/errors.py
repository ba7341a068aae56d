"""How an import says no: one error per line, and the file refused as a whole."""

from __future__ import annotations

# Line errors kept (and shown) per import; the count says how many there were in all.
MAX_ERRORS = 100


class LineError(ValueError):
    """What is wrong with one line, said in a way that names the place."""


class ImportFailed(Exception):
    """The file has errors; nothing was imported. `errors` hold 'line N: ...' strings."""

    def __init__(self, errors: list[str], total: int) -> None:
        self.errors = errors
        self.total = total
        more = f" (showing the first {len(errors)})" if total > len(errors) else ""
        super().__init__(f"{total} error(s) in the file, nothing imported{more}")
