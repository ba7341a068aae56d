"""Whether this worker has the training extra (`pip install -e '.[train]'`)."""

from __future__ import annotations

import importlib

EXTRA_MODULES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")
INSTALL = "pip install -e '.[train]'"


def extra_missing() -> str | None:
    """None when torch, transformers, trl, peft, accelerate and datasets import; else one
    line naming the first that does not."""
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            reason = str(exc).splitlines()[0][:200] if str(exc) else f"no module named {name!r}"
            return f"this worker lacks the training extra ({reason}): {INSTALL}"
    return None
