"""The development SECRET_KEY, generated once into a file only its owner can read."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


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
