"""Frames drawn by `rollouts.game.drawing` are the pixels crafter's own view code draws.

Whole games are compared with crafter's drawing in `test_crafter_env`; here each part of the
drawing meets crafter's code (and through it Pillow's) on inputs no game reaches in a test's
time: every 8-bit colour, random creature textures over random ground, any daylight.
"""

from __future__ import annotations

import numpy as np
import pytest
from crafter import engine

from rollouts.game import drawing

EVERY_COLOUR = (
    np.arange(2**24, dtype=np.uint32)[:, None] >> np.array([16, 8, 0], np.uint32) & 255
).astype(np.uint8)


def _crafters_light(canvas: np.ndarray, daylight: float, sleeping: bool) -> np.ndarray:
    """crafter's `LocalView._light` (and `_sleep`) on a (x, y, 3) canvas, as `Env.render`
    stores it: truncated to 8 bits."""
    view = engine.LocalView.__new__(engine.LocalView)
    lit = engine.LocalView._light(view, canvas, daylight)
    if sleeping:
        lit = engine.LocalView._sleep(view, lit)
    frame = np.zeros(canvas.shape, np.uint8)
    frame[:] = lit
    return frame


def _shaded(canvas: np.ndarray, daylight: float, sleeping: bool) -> np.ndarray:
    frame = np.zeros((canvas.shape[1], canvas.shape[0], 3), np.uint8)
    items = np.zeros((canvas.shape[0], 0, 3), np.uint8)
    drawing._shade(canvas, canvas, daylight, sleeping, items, frame, 0, 0)
    return frame.transpose(1, 0, 2)


@pytest.mark.parametrize("sleeping", [False, True])
def test_the_light_is_crafters_for_every_colour(sleeping):
    # Every 24-bit colour, by day (crafter's night noise is drawn before this part), through
    # Pillow's colour cut as crafter calls it.
    canvas = EVERY_COLOUR.reshape(4096, 4096, 3)
    daylight = 0.6180339887
    expected = _crafters_light(canvas, daylight, sleeping)
    got = _shaded(canvas, daylight, sleeping)
    assert np.array_equal(got, expected), int((got != expected).any(-1).sum())


def test_the_light_is_crafters_at_any_daylight():
    rng = np.random.default_rng(7)
    canvas = rng.integers(0, 256, (63, 49, 3), dtype=np.uint8)
    for daylight in [0.5, 0.51, 0.75, 0.999, 1.0, *rng.uniform(0.5, 1.0, 20)]:
        for sleeping in (False, True):
            expected = _crafters_light(canvas, daylight, sleeping)
            assert np.array_equal(_shaded(canvas, daylight, sleeping), expected), daylight


class _Textures:
    """crafter's `Textures.get` over a fixed set of arrays (random creatures)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def get(self, name, size):
        return self.arrays[name]


def test_creatures_are_blended_over_the_ground_as_crafter_blends_them():
    rng = np.random.default_rng(3)
    unit = (7, 7)
    ground = rng.integers(0, 256, (4, *unit, 3), dtype=np.uint8)
    atlas = np.concatenate([ground, np.full((1, *unit, 3), 127, np.uint8)])
    textures = {
        "ghost": rng.integers(0, 256, (*unit, 4), dtype=np.uint8),  # every alpha
        "shade": rng.integers(0, 256, (*unit, 4), dtype=np.uint8),
        "rock": rng.integers(0, 256, (*unit, 3), dtype=np.uint8),  # no alpha: copied
    }
    textures["ghost"][0, 0, 3], textures["ghost"][0, 1, 3] = 0, 255
    materials = rng.integers(0, 4, (12, 12), dtype=np.uint8)
    creatures = [(0, 0, "ghost"), (8, 6, "shade"), (3, 4, "rock"), (5, 2, "ghost")]
    corner = (-2, 7)  # two columns and some rows outside the world: grey
    sprites = drawing.Sprites(_Textures(textures), unit)
    cells = np.array([(x, y, sprites.of(name)) for x, y, name in creatures], np.int64)
    got = drawing._compose(materials, *corner, 9, 7, atlas, cells, sprites.pixels, sprites.alpha)

    # crafter's drawing: ground cell by cell (grey outside the world), then `_draw_alpha`.
    expected = np.full((9 * unit[0], 7 * unit[1], 3), 127, np.uint8)
    for x in range(9):
        for y in range(7):
            wx, wy = corner[0] + x, corner[1] + y
            if 0 <= wx < 12 and 0 <= wy < 12:
                engine._draw(expected, np.array([x, y]) * unit, ground[materials[wx, wy]])
    for x, y, name in creatures:
        engine._draw_alpha(expected, np.array([x, y]) * unit, textures[name])
    assert np.array_equal(got, expected)
    assert not np.array_equal(got[:7, :7], textures["ghost"][..., :3])  # it blended


def test_a_creature_texture_of_another_shape_is_drawn_by_crafter():
    unit = (7, 7)
    odd = {"big": np.zeros((9, 9, 4), np.uint8), "grey": np.zeros((7, 7), np.uint8)}
    sprites = drawing.Sprites(_Textures(odd), unit)
    assert sprites.of("big") is None and sprites.of("grey") is None
    frame = drawing.draw_frame(
        materials=np.zeros((12, 12), np.uint8),
        corner=(0, 0),
        grid=(9, 7),
        atlas=np.zeros((2, *unit, 3), np.uint8),
        sprites=sprites,
        creatures=[(1, 1, "big")],
        daylight=1.0,
        night=None,
        sleeping=False,
        items=np.zeros((63, 14, 3), np.uint8),
        size=(64, 64),
        border=(0, 0),
    )
    assert frame is None
