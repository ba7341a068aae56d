"""crafter's world generation, the same worlds in a fraction of the time.

Stock `crafter.worldgen.generate_world` asks opensimplex for one noise value at a time
(~50,000 calls per world) and runs its per-cell rules in Python: ~150 ms of CPU even with
numba. Here the three noise fields every cell reads are computed for the whole 64 x 64 area
in one compiled loop over opensimplex's own `_noise3`, and the per-cell rules are compiled
too, computing the other fields only on the cells that read them, fed from a buffer of the
world's own random numbers so that they draw exactly the values crafter would, in the same
order. Worlds, creatures and the random state afterwards are stock crafter's, bit for bit
(tested on many seeds), in ~3 ms.

We do not use `OpenSimplex.noise3array`: it is a numba `parallel=True` kernel, and numba's
default threading layer aborts when two threads (a threaded Celery worker) launch one at
once. Our kernels run on the calling thread and let go of the GIL while they run (`nogil`):
a threaded worker's other episodes read their answers and send their next calls meanwhile.
"""

from __future__ import annotations

import numpy as np
import opensimplex
from crafter import constants, objects
from numba import njit
from opensimplex.internals import _noise3


@njit(cache=True, nogil=True)
def _noise_grid(xs, ys, z, perm, perm_grad_index3):  # pragma: no cover - compiled
    out = np.empty((xs.size, ys.size))
    for i in range(xs.size):
        for j in range(ys.size):
            out[i, j] = _noise3(xs[i], ys[j], z, perm, perm_grad_index3)
    return out


class _Fields:
    """crafter's `_simplex(x, y, z, sizes, normalize)` for every cell of the area at once."""

    def __init__(self, simplex: opensimplex.OpenSimplex, area: tuple[int, int]) -> None:
        self._simplex = simplex
        self._xs = np.arange(area[0])
        self._ys = np.arange(area[1])

    def __call__(self, z: float, sizes, normalize: bool = True):
        xs, ys = self._xs, self._ys
        if not isinstance(sizes, dict):
            sizes = {sizes: 1}
        value = 0
        for size, weight in sizes.items():
            noise = _noise_grid(
                xs / size,
                ys / size,
                float(z),
                self._simplex._perm,
                self._simplex._perm_grad_index3,
            )
            # The same float operations, in the same order, as crafter's scalar loop.
            value = value + weight * noise
        if normalize:
            value = value / sum(sizes.values())
        return value


# Material codes of the compiled kernel; mapped to the world's own material ids afterwards.
_MATERIALS = ("grass", "path", "coal", "iron", "diamond", "lava", "stone", "sand", "water", "tree")
GRASS, PATH, COAL, IRON, DIAMOND, LAVA, STONE, SAND, WATER, TREE = range(len(_MATERIALS))
COW, ZOMBIE, SKELETON = range(3)
# At most 3 random draws per cell for materials and 3 for creatures.
_DRAWS_PER_CELL = 6


@njit(cache=True, nogil=True)
def _noise(x, y, z, size, perm, perm_grad_index3):  # pragma: no cover - compiled
    """crafter's `_simplex(x, y, z, size)` for one size of weight 1 (`0 + 1 * n`, `/ 1`)."""
    return _noise3(x / size, y / size, z, perm, perm_grad_index3)


@njit(cache=True, nogil=True)
def _lay_out(start, water, mountain, dist, draws, perm, grad):  # pragma: no cover - compiled
    """crafter's per-cell rules; `draws` stands for the world's next uniform() values.

    The noise fields the rules read only on some cells (caves, tunnels, ores and lava in the
    mountains, sand by the water, trees on the grass) are computed on those cells only, as
    crafter does: about half the noise of computing every field everywhere. Noise draws no
    random numbers, so where it is computed changes nothing.

    Returns the material codes, the creatures to place (kind, x, y) in crafter's order, and
    how many draws crafter would have taken.
    """
    width, height = start.shape
    codes = np.empty((width, height), np.int8)
    tunnels = np.zeros((width, height), np.bool_)
    k = 0
    for x in range(width):
        for y in range(height):
            m, w = mountain[x, y], water[x, y]
            code = GRASS
            if start[x, y] > 0.5:
                code = GRASS
            elif m > 0.15:
                code = STONE
                if m > 0.3 and _noise(x, y, 6.0, 7, perm, grad) > 0.15:
                    code = PATH
                elif (
                    _noise(2 * x, y / 5, 7.0, 3, perm, grad) > 0.4
                    or _noise(x / 5, 2 * y, 7.0, 3, perm, grad) > 0.4
                ):
                    code = PATH
                    tunnels[x, y] = True
                else:
                    placed = False
                    if _noise(x, y, 1.0, 8, perm, grad) > 0:
                        k += 1
                        if draws[k - 1] > 0.85:
                            code, placed = COAL, True
                    if not placed and _noise(x, y, 2.0, 6, perm, grad) > 0.4:
                        k += 1
                        if draws[k - 1] > 0.75:
                            code, placed = IRON, True
                    if not placed and m > 0.18:
                        k += 1
                        if draws[k - 1] > 0.994:
                            code, placed = DIAMOND, True
                    if not placed and m > 0.3 and _noise(x, y, 6.0, 5, perm, grad) > 0.35:
                        code = LAVA
            elif 0.25 < w <= 0.35 and _noise(x, y, 4.0, 9, perm, grad) > -0.2:
                code = SAND
            elif w > 0.3:
                code = WATER
            elif _noise(x, y, 5.0, 7, perm, grad) > 0:
                k += 1
                if draws[k - 1] > 0.8:
                    code = TREE
            codes[x, y] = code
    spawns = np.empty((width * height, 3), np.int64)
    n = 0
    for x in range(width):
        for y in range(height):
            code = codes[x, y]
            # crafter.constants.walkable: grass, sand, path.
            if code != GRASS and code != SAND and code != PATH:
                continue
            d = dist[x, y]
            kind = -1
            if d > 3 and code == GRASS:
                k += 1
                if draws[k - 1] > 0.985:
                    kind = COW
            if kind < 0 and d > 10:
                k += 1
                if draws[k - 1] > 0.993:
                    kind = ZOMBIE
            if kind < 0 and code == PATH and tunnels[x, y]:
                k += 1
                if draws[k - 1] > 0.95:
                    kind = SKELETON
            if kind >= 0:
                spawns[n, 0], spawns[n, 1], spawns[n, 2] = kind, x, y
                n += 1
    return codes, spawns[:n], k


def generate_world(world, player) -> None:
    """Drop-in for `crafter.worldgen.generate_world`."""
    assert set(constants.walkable) == {"grass", "sand", "path"}, "crafter changed walkable"
    simplex = opensimplex.OpenSimplex(seed=world.random.randint(0, 2**31 - 1))
    area = world.area
    field = _Fields(simplex, area)
    xs, ys = np.arange(area[0]), np.arange(area[1])
    px, py = player.pos
    # Element-wise numpy float64 arithmetic rounds exactly as crafter's scalar code does.
    dist = np.sqrt((xs[:, None] - px) ** 2 + (ys[None, :] - py) ** 2)
    start = 4 - dist
    start = start + 2 * field(8, 3)
    start = 1 / (1 + np.exp(-start))
    water = field(3, {15: 1, 5: 0.15}, False) + 0.1
    water = water - 2 * start
    mountain = field(0, {15: 1, 5: 0.3})
    mountain = mountain - (4 * start + 0.3 * water)
    # Draw more uniforms than crafter can take, lay the world out, then rewind the random
    # state and advance it by exactly what crafter would have drawn, one value per draw.
    saved = world.random.get_state()
    draws = world.random.random_sample(_DRAWS_PER_CELL * area[0] * area[1])
    codes, spawns, used = _lay_out(
        start, water, mountain, dist, draws, simplex._perm, simplex._perm_grad_index3
    )
    world.random.set_state(saved)
    world.random.random_sample(used)
    ids = np.array([world._mat_ids[name] for name in _MATERIALS], world._mat_map.dtype)
    world._mat_map[:, :] = ids[codes]
    for kind, x, y in spawns.tolist():
        if kind == COW:
            world.add(objects.Cow(world, (x, y)))
        elif kind == ZOMBIE:
            world.add(objects.Zombie(world, (x, y), player))
        else:
            world.add(objects.Skeleton(world, (x, y), player))
