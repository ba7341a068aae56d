"""What checking an import file found: the plan its write follows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Plan:
    lines: int = 0
    groups: dict[tuple, list[tuple[int, int | None]]] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)
    tools: list[dict[str, Any]] | None = None
    tools_line: int = 0
    image_size: int | None = None
    # line -> (batch_id, episode_id, turn, sha256 of the answer text, sha256 of the image)
    origins: dict[int, tuple[int, int, int, str, str]] = field(default_factory=dict)
    sha256: str = ""  # of the whole file: the same file imported twice is refused
    # lines left out because their turns are already in the studio (skip_existing)
    skipped: set[int] = field(default_factory=set)
    skip_existing: bool = False  # as asked: the write checks the file again with it
