"""crafter's world and views as `StudioEnv` builds them: reproducible, and drawn once per
process where crafter draws every time.

* The world's random state is seeded as `np.random.RandomState(seed)` seeds it, without first
  seeding a generator from the OS's entropy that is thrown away.
* The night-time grain of the local view draws from a generator of its own, keyed by
  (episode seed, step), never from the world's: stock crafter's draws from the world's, so
  rendering at another size changed the world.
* Whole frames are drawn by `rollouts.game.drawing` (the same pixels as crafter's), and what
  depends only on the textures (the ground atlas, the creatures' sprites, each inventory) is
  drawn once for every env of the process.
"""

from __future__ import annotations

import collections
import copy
import functools
import secrets
from collections.abc import Callable
from typing import Any

import numpy as np
from crafter import constants, engine

from rollouts.game import drawing


class _BlankSeedSequence(np.random.bit_generator.ISeedSequence):
    """A seed sequence of zeros, for an MT19937 that is re-seeded straight away."""

    def generate_state(self, n_words, dtype=np.uint32):
        return np.zeros(n_words, dtype)


def random_state(seed: int) -> np.random.RandomState:
    """`np.random.RandomState(seed)`, the same state, made faster.

    `RandomState(seed)` first seeds a new MT19937 from the OS's entropy through a
    SeedSequence (nearly all of its time), then throws that away for the legacy seeding of
    `seed`. `RandomState.seed(seed)` is that legacy seeding; it sets the whole generator
    state (and clears the cached Gaussian), whatever the state before.
    """
    random = np.random.RandomState(np.random.MT19937(_BlankSeedSequence()))
    random.seed(seed)
    return random


class StudioWorld(engine.World):
    """crafter's `World`, whose `reset` makes its random generator faster (the same state).

    crafter builds two `RandomState`s for a new env: one from entropy in `World.__init__`
    (drawn from by nothing: `StudioEnv.reset` seeds the world first) and the seeded one of
    `reset`; only the second is needed, and it is built by `random_state`.
    """

    def reset(self, seed=None):
        # crafter's World.reset, with `random_state` for `np.random.RandomState`.
        self.random = random_state(secrets.randbits(32) if seed is None else seed)
        self.daylight = 0.0
        self._chunks = collections.defaultdict(set)
        self._objects = [None]
        self._mat_map = np.zeros(self.area, np.uint8)
        self._obj_map = np.zeros(self.area, np.uint32)


class ReproducibleLocalView(engine.LocalView):
    """Night noise from its own generator, keyed by (seed, step), never the world's.

    It also draws whole frames faster than crafter's views, with the same pixels (`frame`,
    `rollouts.game.drawing`): the ground of all cells at once from a texture atlas, and only the
    creatures inside the view (crafter draws cell by cell and looks at every creature of the
    world).
    """

    noise_key: tuple[int, int] = (0, 0)

    def frame(self, player, unit, items: np.ndarray, size, border) -> np.ndarray | None:
        """The whole frame `Env.render` draws with this view and `items`, the inventory's;
        None for textures of another shape than crafter's (then draw as crafter does)."""
        ux, uy = int(unit[0]), int(unit[1])
        atlas = self._ground_atlas(ux, uy)
        if atlas is None:
            return None
        world = self._world
        grid = int(self._grid[0]), int(self._grid[1])
        x0 = int(player.pos[0]) - int(self._offset[0])
        y0 = int(player.pos[1]) - int(self._offset[1])
        # The creatures in view: each has a cell of its own, so the order they are drawn in
        # (crafter's is the world's) does not change the pixels.
        left, top = max(x0, 0), max(y0, 0)
        ids = world._obj_map[left : x0 + grid[0], top : y0 + grid[1]]
        creatures = [
            (left + x - x0, top + y - y0, world._objects[index].texture)
            for x, y, index in zip(*np.nonzero(ids), ids[ids != 0].tolist(), strict=True)
        ]
        daylight = world.daylight
        night = None
        if daylight < 0.5:  # `LocalView._light`: the night view has noise

            def night(canvas: np.ndarray) -> np.ndarray:
                return self._noise(canvas, 2 * (0.5 - daylight), 0.5).astype(np.uint8)

        return drawing.draw_frame(
            materials=world._mat_map,
            corner=(x0, y0),
            grid=grid,
            atlas=atlas,
            sprites=_shared_sprites(self._textures, ux, uy),
            creatures=creatures,
            daylight=daylight,
            night=night,
            sleeping=player.sleeping,
            items=items,
            size=(int(size[0]), int(size[1])),
            border=(int(border[0]), int(border[1])),
        )

    def _ground_atlas(self, ux: int, uy: int) -> np.ndarray | None:
        """One (ux, uy, 3) texture per material id, then the grey of cells outside the world."""
        key = (id(self._textures), ux, uy, len(self._world._mat_names))
        cached = getattr(self, "_atlas", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        names = self._world._mat_names
        names = tuple(names[i] for i in range(len(names)))
        atlas = _shared_ground_atlas(self._textures, ux, uy, names)
        self._atlas = (key, atlas)
        return atlas

    def _noise(self, canvas: np.ndarray, amount: float, stddev: float) -> np.ndarray:
        rng = np.random.default_rng(self.noise_key)
        noise = rng.uniform(32, 127, canvas.shape[:2])[..., None]
        mask = amount * self._vignette(canvas.shape, stddev)[..., None]
        return (1 - mask) * canvas + mask * noise


# Drawings that depend only on the textures, the unit and what is drawn, shared by every env
# of the process, so that a new env's first frame does not draw them again. Plain dict get
# and set (atomic under the GIL) of read-only arrays, so a threaded worker's episodes can
# share them; two threads missing at once both draw the same pixels and one copy stays.
# The textures object is part of each entry, so that its id is not reused while it is keyed.
_ATLASES: dict[tuple, tuple[Any, np.ndarray | None]] = {}
_INVENTORIES: dict[tuple, tuple[Any, np.ndarray]] = {}
_SPRITES: dict[tuple, tuple[Any, drawing.Sprites]] = {}
# Distinct inventories drawn, at most (~2.6 KB each at 64 px, ~42 KB at 256 px).
_INVENTORIES_KEPT = 256


def _drawn_once(cache: dict, key: tuple, textures, draw: Callable[[], Any], kept: int = 64):
    """`cache`'s drawing for `key` (which starts with `id(textures)`), drawn by `draw` when
    missing; the cache is emptied once it holds `kept` of them."""
    entry = cache.get(key)
    if entry is not None and entry[0] is textures:
        return entry[1]
    drawn = draw()
    if len(cache) >= kept:
        cache.clear()
    cache[key] = (textures, drawn)
    return drawn


def _shared_ground_atlas(textures, ux: int, uy: int, names: tuple) -> np.ndarray | None:
    """`ReproducibleLocalView`'s atlas for these textures, unit and material names; None for
    textures of another shape than crafter's (the view then draws as crafter does)."""

    def draw() -> np.ndarray | None:
        tiles = [textures.get(name, (ux, uy)) for name in names]
        if not all(t.ndim == 3 and t.shape[:2] == (ux, uy) and t.dtype == np.uint8 for t in tiles):
            return None
        grey = np.full((ux, uy, 3), 127, np.uint8)
        atlas = np.stack([t[..., :3] for t in tiles] + [grey])
        atlas.flags.writeable = False
        return atlas

    return _drawn_once(_ATLASES, (id(textures), ux, uy, names), textures, draw)


def _shared_sprites(textures, ux: int, uy: int) -> drawing.Sprites:
    """The creatures' textures drawn so far at this unit, for every env of the process."""
    return _drawn_once(
        _SPRITES, (id(textures), ux, uy), textures, lambda: drawing.Sprites(textures, (ux, uy))
    )


class RememberingItemView(engine.ItemView):
    """crafter's inventory view, drawn once per distinct inventory (it changes rarely) for
    every env of the process."""

    def __call__(self, inventory, unit) -> np.ndarray:
        textures = self._textures
        ux, uy = int(unit[0]), int(unit[1])
        grid = (int(self._grid[0]), int(self._grid[1]))
        key = (id(textures), grid, tuple(inventory.items()), ux, uy)

        def draw() -> np.ndarray:
            canvas = super(RememberingItemView, self).__call__(inventory, unit)
            canvas.flags.writeable = False
            return canvas

        return _drawn_once(_INVENTORIES, key, textures, draw, kept=_INVENTORIES_KEPT)


def without_textures(view: Any) -> Any:
    clone = copy.copy(view)
    clone._textures = None
    # What the view drew from the textures goes too (the snapshot stays small). `_drawn` is
    # the inventory cache of views made before it was shared by the process.
    clone.__dict__.pop("_atlas", None)
    clone.__dict__.pop("_drawn", None)
    return clone


@functools.cache
def shared_textures() -> engine.Textures:
    return engine.Textures(constants.root / "assets")
