"""The development SECRET_KEY, generated once into a file only its owner can read, and
what happens without one when DEBUG is off."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import NoReturn

from django.core.exceptions import ImproperlyConfigured

MISSING = "SECRET_KEY must be set when DEBUG is off."
# What a person at a shell beside `make demo` wants instead (the Makefile's demo sets DEBUG=1).
HINT = 'Set it, or run beside `make demo` on its settings: make manage ARGS="..." (or DEBUG=1).'


def secret_key_from_file(path: Path) -> str:
    """Read the key at `path`, creating it (mode 0600) when missing; tighten a looser file.

    Anyone who reads this key can forge session cookies, so the file is created with its
    mode already 0600 (never written first and restricted after) whatever the umask.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


def secret_key_missing(argv0: str | None = None) -> NoReturn:
    """Refuse to start: one line and exit status 2 for a `manage.py` command, a usage error
    like any other; ImproperlyConfigured for a server (gunicorn stops booting workers on an
    exception, where it would restart a worker that exited)."""
    if Path(sys.argv[0] if argv0 is None else argv0).name == "manage.py":
        sys.stderr.write(f"manage.py: error: {MISSING} {HINT}\n")
        raise SystemExit(2)
    raise ImproperlyConfigured(MISSING)
