"""What writing one split of a Hugging Face export produced (the card describes each)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SplitResult:
    name: str
    rows: int = 0
    images: int = 0
    episodes: int = 0
    bytes: int = 0
    shards: int = 0
    parquet: list[str] = field(default_factory=list)
    arrow: list[str] = field(default_factory=list)
    _last_episode: Any = None
