"""The library versions the studio's crafter fixes are written against, checked at start-up.

`rollouts.game.crafter_env` and `rollouts.game.crafter_views` re-implement
`crafter.Env.__init__`, `reset`, `step`, `_balance_object`, `World.reset` and
`LocalView._noise` from crafter 1.8.3's source, and `rollouts.game.worldgen` re-implements
`World.add` for new creatures, calls opensimplex's private `opensimplex.internals._noise3(x,
y, z, perm, perm_grad_index3)` and builds the permutation arrays of 0.4.5.1's private `_init`
itself. Another release may change any of
these without notice, and the symptom would be silently different worlds (episodes no longer
reproducible, datasets that claim games that did not happen), not an error. So the process
refuses to start on any other version.

This module imports neither crafter nor opensimplex: the check must speak before an import
of a changed library fails with a less helpful message.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# Also pinned in pyproject.toml; change both together, after re-running the reproducibility
# and world-generation tests (rollouts/tests/test_crafter_env.py) on the new release.
PINNED_VERSIONS: dict[str, str] = {"crafter": "1.8.3", "opensimplex": "0.4.5.1"}


class LibraryMismatch(RuntimeError):
    """The installed crafter or opensimplex is not the one the studio's fixes are written for."""


def library_pins_check(*, installed: dict[str, str | None] | None = None) -> None:
    """Raise LibraryMismatch, naming every mismatch, unless the pinned versions run."""
    if installed is None:
        installed = {name: _installed_version(name) for name in PINNED_VERSIONS}
    wrong = [
        f"{name} {installed.get(name) or 'not installed'} (need {name}=={pinned})"
        for name, pinned in PINNED_VERSIONS.items()
        if installed.get(name) != pinned
    ]
    if wrong:
        raise LibraryMismatch(
            "The studio's crafter fixes (rollouts/game/crafter_env.py, rollouts/game/worldgen.py) "
            f"are written against exact library versions; found {', '.join(wrong)}. "
            "Run: pip install " + " ".join(f"{n}=={v}" for n, v in PINNED_VERSIONS.items())
        )
    # The private opensimplex kernel worldgen compiles against; present since 0.4.
    from opensimplex import internals

    if not callable(getattr(internals, "_noise3", None)):
        raise LibraryMismatch(
            "opensimplex.internals._noise3 is missing: rollouts/game/worldgen.py needs it "
            f"(pip install opensimplex=={PINNED_VERSIONS['opensimplex']})"
        )


def _installed_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None
