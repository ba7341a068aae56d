"""crafter's frames drawn in two compiled passes, pixel for pixel as crafter's views draw them.

crafter 1.8.3 draws a frame (`Env.render`) as:
- the local view (`LocalView.__call__`): each cell's ground texture (alpha dropped; grey 127
  outside the world), then each creature in view blended over it in float32
  (`_draw_alpha`: `alpha * texture + (1 - alpha) * current`, times 255, truncated);
- its light (`LocalView._light`): a night version of the view (at night with noise first),
  its colour cut to 40% by Pillow (`ImageEnhance.Color(...).enhance(0.4)`, that is the
  greyscale `L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16` blended with the pixel in
  C float: `L + 0.4f * (v - L)`, truncated), tinted halfway to (0, 16, 64) in float64, then
  mixed with the view by the daylight in float64;
- asleep (`LocalView._sleep`): that, truncated, greyed wholly (enhance(0.0) is `L`) and
  tinted halfway to (0, 0, 16);
- beside the inventory (`ItemView`), truncated to 8 bits in a canvas of the frame's size,
  transposed to (height, width).

Here `_compose` draws the local view's ground and creatures, and `_shade` everything after it,
each pixel in one pass, with the same operations in the same order and precision: far less
CPU than crafter's views, or than numpy's and Pillow's overhead on small arrays (figures in
`docs/benchmarks.md`). The
tests compare every frame of long games (night, sleep, creatures) with crafter's own drawing,
and the light with crafter's (and so Pillow's) over all 2**24 colours.

The kernels keep the interpreter lock (no `nogil`): they run for microseconds, and the 16
episodes of a threaded worker share its lock. Letting go of it and taking it back would cost
two hand-overs a call, and the episode a wait for the lock, for no parallel work: a busy
host's cores are taken by the other workers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

# `LocalView._light` and `_sleep`: the colour kept by `ImageEnhance.Color` and the tints.
NIGHT_COLOUR = 0.4
NIGHT_TINT = (0.0, 16.0, 64.0)
SLEEP_TINT = (0.0, 0.0, 16.0)
TINT_AMOUNT = 0.5


class Sprites:
    """The textures of the creatures drawn so far at one unit, in one array for `_compose`:
    (count, ux, uy, 4) RGBA (RGB textures padded; `alpha[i]` says which blend)."""

    def __init__(self, textures: Any, unit: tuple[int, int]) -> None:
        self.textures = textures
        self.unit = unit
        self.index: dict[str, int] = {}
        self.pixels = np.zeros((0, unit[0], unit[1], 4), np.uint8)
        self.alpha = np.zeros(0, np.bool_)
        self._lock = threading.Lock()

    def of(self, name: str) -> int | None:
        """The index of texture `name`; None if it is not (ux, uy) RGB or RGBA bytes."""
        found = self.index.get(name)
        if found is not None:
            return found
        with self._lock:  # a new creature texture: a few per process
            if name not in self.index:
                texture = self.textures.get(name, self.unit)
                shape = getattr(texture, "shape", ())
                if shape[:2] != self.unit or shape[2:] not in ((3,), (4,)):
                    return None
                if texture.dtype != np.uint8:
                    return None
                padded = np.zeros((1, *self.unit, 4), np.uint8)
                padded[0, ..., : texture.shape[-1]] = texture
                # The arrays first, then the name: a thread that finds the name finds them.
                self.pixels = np.concatenate([self.pixels, padded])
                self.alpha = np.append(self.alpha, texture.shape[-1] == 4)
                self.index[name] = len(self.index)
            return self.index[name]


def draw_frame(
    *,
    materials: np.ndarray,
    corner: tuple[int, int],
    grid: tuple[int, int],
    atlas: np.ndarray,
    sprites: Sprites,
    creatures: list[tuple[int, int, str]],
    daylight: float,
    night: Callable[[np.ndarray], np.ndarray] | None,
    sleeping: bool,
    items: np.ndarray,
    size: tuple[int, int],
    border: tuple[int, int],
) -> np.ndarray | None:
    """The (height, width, 3) frame crafter's `Env.render` draws, of `size` (x, y); None if a
    creature's texture is not of the atlas's shape (then draw as crafter does).

    `materials`: the world's material ids (x, y); `corner`: the world cell at the view's top
    left; `grid`: the local view's cells (x, y); `atlas`: (materials + 1, ux, uy, 3) ground
    textures, grey last; `creatures`: the cell in view (from the corner) and texture name of
    each creature there; `night`: at night, the 8-bit night view (with its noise) of the
    composed view, before its colour is cut (None: the view itself); `items`: the inventory
    view; `border`: where the views start in the frame (x, y).
    """
    cells = np.empty((len(creatures), 3), np.int64)
    for i, (x, y, name) in enumerate(creatures):
        sprite = sprites.of(name)
        if sprite is None:
            return None
        cells[i] = x, y, sprite
    x0, y0 = corner
    canvas = _compose(materials, x0, y0, *grid, atlas, cells, sprites.pixels, sprites.alpha)
    dark = canvas if night is None else night(canvas)
    frame = np.zeros((size[1], size[0], 3), np.uint8)
    _shade(canvas, dark, float(daylight), bool(sleeping), items, frame, border[0], border[1])
    return frame


@njit(cache=True)
def _compose(materials, x0, y0, cells_x, cells_y, atlas, cells, sprites, alpha):
    """The local view before its light: ground, then creatures (`LocalView.__call__`)."""
    ux, uy = atlas.shape[1], atlas.shape[2]
    area_x, area_y = materials.shape
    outside = atlas.shape[0] - 1
    canvas = np.empty((cells_x * ux, cells_y * uy, 3), np.uint8)
    for cx in range(cells_x):
        for cy in range(cells_y):
            wx, wy = x0 + cx, y0 + cy
            inside = 0 <= wx < area_x and 0 <= wy < area_y
            tile = atlas[materials[wx, wy] if inside else outside]
            canvas[cx * ux : (cx + 1) * ux, cy * uy : (cy + 1) * uy] = tile
    scale = np.float32(255)
    one = np.float32(1)
    for k in range(cells.shape[0]):
        px, py, sprite = cells[k, 0] * ux, cells[k, 1] * uy, cells[k, 2]
        texture = sprites[sprite]
        for i in range(ux):
            for j in range(uy):
                if not alpha[sprite]:
                    for c in range(3):
                        canvas[px + i, py + j, c] = texture[i, j, c]
                    continue
                # `_draw_alpha`, in float32 as numpy computes it.
                a = np.float32(texture[i, j, 3]) / scale
                for c in range(3):
                    t = np.float32(texture[i, j, c]) / scale
                    current = np.float32(canvas[px + i, py + j, c]) / scale
                    blended = a * t + (one - a) * current
                    canvas[px + i, py + j, c] = np.uint8(scale * blended)
    return canvas


@njit(cache=True, inline="always")
def _grey(r, g, b):
    # Pillow's RGB to L (ITU-R 601-2 luma, rounded in 16.16 fixed point).
    return (np.int64(r) * 19595 + np.int64(g) * 38470 + np.int64(b) * 7471 + 0x8000) >> 16


@njit(cache=True)
def _shade(canvas, dark, daylight, sleeping, items, frame, border_x, border_y):
    """`LocalView._light` (and `_sleep`), then `Env.render`'s canvas, transposed, in `frame`."""
    width, height = canvas.shape[0], canvas.shape[1]
    night_share = 1.0 - daylight
    for y in range(height):
        for x in range(width):
            shade = dark[x, y]
            grey = _grey(shade[0], shade[1], shade[2])
            r = _lit(canvas[x, y, 0], shade[0], grey, NIGHT_TINT[0], daylight, night_share)
            g = _lit(canvas[x, y, 1], shade[1], grey, NIGHT_TINT[1], daylight, night_share)
            b = _lit(canvas[x, y, 2], shade[2], grey, NIGHT_TINT[2], daylight, night_share)
            if sleeping:  # enhance(0.0) leaves L itself, then the sleep tint
                asleep = np.float64(_grey(np.uint8(r), np.uint8(g), np.uint8(b)))
                r = _tinted(asleep, SLEEP_TINT[0])
                g = _tinted(asleep, SLEEP_TINT[1])
                b = _tinted(asleep, SLEEP_TINT[2])
            pixel = frame[border_y + y, border_x + x]
            pixel[0], pixel[1], pixel[2] = np.uint8(r), np.uint8(g), np.uint8(b)
    for x in range(items.shape[0]):
        for y in range(items.shape[1]):
            frame[border_y + height + y, border_x + x] = items[x, y]


@njit(cache=True, inline="always")
def _lit(value, dark, grey, tint, daylight, night_share):
    """One channel of `LocalView._light`: the night view's (`dark`, of luma `grey`) colour
    cut by Pillow (C float, truncated), tinted, mixed with `value` by the daylight."""
    cut = np.uint8(np.float32(grey) + np.float32(NIGHT_COLOUR) * np.float32(np.int64(dark) - grey))
    night = _tinted(np.float64(cut), tint)
    return daylight * np.float64(value) + night_share * night


@njit(cache=True, inline="always")
def _tinted(value, tint):
    # `LocalView._tint`: (1 - amount) * canvas + amount * color, in float64.
    return (1.0 - TINT_AMOUNT) * value + TINT_AMOUNT * tint
