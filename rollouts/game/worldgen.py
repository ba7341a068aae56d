"""crafter's world generation, the same worlds in a fraction of the time.

Stock `crafter.worldgen.generate_world` asks opensimplex for one noise value at a time (tens
of thousands of calls per world) and runs its per-cell rules in Python. Here the three noise
fields every cell reads are computed for the whole 64 x 64 area in one compiled loop over
opensimplex's own `_noise3`, and the per-cell rules are compiled too, computing the other
fields only on the cells that read them, fed from a buffer of the world's own random numbers
so that they draw exactly the values crafter would, in the same order. Worlds, creatures and
the random state afterwards are stock crafter's, bit for bit (tested on many seeds); the
figures are in `docs/benchmarks.md`. opensimplex's permutation arrays are built here too
(`permutation`, tested against opensimplex's own `_init`), which `OpenSimplex(seed)` builds
slowly.

We do not use `OpenSimplex.noise3array`: it is a numba `parallel=True` kernel, and numba's
default threading layer aborts when two threads (a threaded Celery worker) launch one at
once. Our kernels run on the calling thread and let go of the GIL while they run (`nogil`):
a threaded worker's other episodes read their answers and send their next calls meanwhile.
"""

from __future__ import annotations

import numpy as np
from crafter import constants, objects
from numba import njit
from opensimplex.constants import GRADIENTS3
from opensimplex.internals import _noise3

# opensimplex's 64-bit linear congruential generator (`opensimplex.internals._init`).
_LCG_MUL = 6364136223846793005
_LCG_ADD = 1442695040888963407
_MASK64 = 2**64 - 1
# `_init`'s gradient index of each permutation entry, with its own expression.
_GRAD_INDEX3 = np.array([int((p % (len(GRADIENTS3) / 3)) * 3) for p in range(256)], np.int64)


def permutation(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`opensimplex.internals._init(seed)`: the (perm, perm_grad_index3) int64 arrays.

    `OpenSimplex(seed)` is slow to build them: `_init` wraps each step to 64 bits with a
    ctypes `c_int64` and writes numpy elements one at a time. The same steps on plain Python
    ints are an order of magnitude faster. The generator's state is kept unsigned
    (multiplication and addition modulo 2**64 give the same bits either way); `_init` reads
    it as signed for the modulo.
    """
    seed = (seed * _LCG_MUL + _LCG_ADD) & _MASK64
    seed = (seed * _LCG_MUL + _LCG_ADD) & _MASK64
    seed = (seed * _LCG_MUL + _LCG_ADD) & _MASK64
    source = list(range(256))
    perm = [0] * 256
    for i in range(255, -1, -1):
        seed = (seed * _LCG_MUL + _LCG_ADD) & _MASK64
        signed = seed - 2**64 if seed >= 2**63 else seed
        # Python's `%` by a positive number is never negative: `_init`'s `if r < 0` never runs.
        r = (signed + 31) % (i + 1)
        perm[i] = source[r]
        source[r] = source[i]
    perm_array = np.array(perm, np.int64)
    return perm_array, _GRAD_INDEX3[perm_array]


@njit(cache=True, nogil=True)
def _noise_grid(xs, ys, z, perm, perm_grad_index3):  # pragma: no cover - compiled
    out = np.empty((xs.size, ys.size))
    for i in range(xs.size):
        for j in range(ys.size):
            out[i, j] = _noise3(xs[i], ys[j], z, perm, perm_grad_index3)
    return out


class _Fields:
    """crafter's `_simplex(x, y, z, sizes, normalize)` for every cell of the area at once."""

    def __init__(self, perm: np.ndarray, grad: np.ndarray, area: tuple[int, int]) -> None:
        self._perm = perm
        self._grad = grad
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
                self._perm,
                self._grad,
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
# Worlds take about 6,000 draws (at most 7,260 over 400 seeds) of the 24,576 a world could
# take: drawing this many first, and all the rest only when they run out, is cheaper.
_FIRST_DRAWS = 8192


@njit(cache=True, nogil=True)
def _noise(x, y, z, size, perm, perm_grad_index3):  # pragma: no cover - compiled
    """crafter's `_simplex(x, y, z, size)` for one size of weight 1 (`0 + 1 * n`, `/ 1`)."""
    return _noise3(x / size, y / size, z, perm, perm_grad_index3)


@njit(cache=True, nogil=True)
def _draw(draws, k):  # pragma: no cover - compiled
    """The k-th of the world's next uniform() values (from 1); past the buffer, -1.0, which
    no rule takes: `_lay_out` then reports that it ran out, and the world is laid out again."""
    return draws[k - 1] if k <= draws.size else -1.0


@njit(cache=True, nogil=True)
def _lay_out(start, water, mountain, dist, draws, perm, grad):  # pragma: no cover - compiled
    """crafter's per-cell rules; `draws` stands for the world's next uniform() values.

    Returns the material codes, the creatures to place (kind, x, y) in crafter's order, and
    how many draws crafter would have taken; -1 instead if `draws` ran out.
    """
    codes, tunnels, k = _lay_out_materials(start, water, mountain, draws, perm, grad)
    spawns, n, k = _place_creatures(codes, tunnels, dist, draws, k)
    if k > draws.size:
        return codes, spawns[:0], -1  # what was laid out past the buffer is not the world
    return codes, spawns[:n], k


@njit(cache=True, nogil=True)
def _lay_out_materials(start, water, mountain, draws, perm, grad):  # pragma: no cover - compiled
    """Every cell's material, in crafter's order of cells and draws; also which path cells are
    tunnels (skeletons spawn there) and how many draws were taken.

    The noise fields the rules read only on some cells (caves, tunnels, ores and lava in the
    mountains, sand by the water, trees on the grass) are computed on those cells only, as
    crafter does: about half the noise of computing every field everywhere. Noise draws no
    random numbers, so where it is computed changes nothing.
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
                        if _draw(draws, k) > 0.85:
                            code, placed = COAL, True
                    if not placed and _noise(x, y, 2.0, 6, perm, grad) > 0.4:
                        k += 1
                        if _draw(draws, k) > 0.75:
                            code, placed = IRON, True
                    if not placed and m > 0.18:
                        k += 1
                        if _draw(draws, k) > 0.994:
                            code, placed = DIAMOND, True
                    if not placed and m > 0.3 and _noise(x, y, 6.0, 5, perm, grad) > 0.35:
                        code = LAVA
            elif 0.25 < w <= 0.35 and _noise(x, y, 4.0, 9, perm, grad) > -0.2:
                code = SAND
            elif w > 0.3:
                code = WATER
            elif _noise(x, y, 5.0, 7, perm, grad) > 0:
                k += 1
                if _draw(draws, k) > 0.8:
                    code = TREE
            codes[x, y] = code
    return codes, tunnels, k


@njit(cache=True, nogil=True)
def _place_creatures(codes, tunnels, dist, draws, k):  # pragma: no cover - compiled
    """The creatures crafter places after the materials, drawing on from draw `k`: (kind, x, y)
    rows, how many, and the draws taken by then."""
    width, height = codes.shape
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
                if _draw(draws, k) > 0.985:
                    kind = COW
            if kind < 0 and d > 10:
                k += 1
                if _draw(draws, k) > 0.993:
                    kind = ZOMBIE
            if kind < 0 and code == PATH and tunnels[x, y]:
                k += 1
                if _draw(draws, k) > 0.95:
                    kind = SKELETON
            if kind >= 0:
                spawns[n, 0], spawns[n, 1], spawns[n, 2] = kind, x, y
                n += 1
    return spawns, n, k


def generate_world(world, player) -> None:
    """Drop-in for `crafter.worldgen.generate_world`."""
    assert set(constants.walkable) == {"grass", "sand", "path"}, "crafter changed walkable"
    # What `opensimplex.OpenSimplex(seed=...)` would build, without its slow `_init`.
    perm, grad = permutation(world.random.randint(0, 2**31 - 1))
    area = world.area
    field = _Fields(perm, grad, area)
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
    # Draw the uniforms crafter will take (more than enough: `used < 0` otherwise, then as
    # many as crafter can take), lay the world out, then rewind the random state and advance
    # it by exactly what crafter would have drawn, one value per draw. The draws are a prefix
    # of the world's stream, so a longer buffer only adds values the layout did not read.
    saved = world.random.get_state()
    draws = world.random.random_sample(_FIRST_DRAWS)
    codes, spawns, used = _lay_out(start, water, mountain, dist, draws, perm, grad)
    if used < 0:
        world.random.set_state(saved)
        draws = world.random.random_sample(_DRAWS_PER_CELL * area[0] * area[1])
        codes, spawns, used = _lay_out(start, water, mountain, dist, draws, perm, grad)
    world.random.set_state(saved)
    world.random.random_sample(used)
    ids = np.array([world._mat_ids[name] for name in _MATERIALS], world._mat_map.dtype)
    world._mat_map[:, :] = ids[codes]
    for kind, x, y in spawns.tolist():
        if kind == COW:
            _add(world, objects.Cow(world, (x, y)), x, y)
        elif kind == ZOMBIE:
            _add(world, objects.Zombie(world, (x, y), player), x, y)
        else:
            _add(world, objects.Skeleton(world, (x, y), player), x, y)


# crafter's `World.chunk_key` of each chunk, by (chunk size, area, chunk column, chunk row).
# Its answer depends on nothing else (its numbers are numpy or Python ints by the chunk, too).
_CHUNK_KEYS: dict[tuple, tuple] = {}


def _add(world, obj, x: int, y: int) -> None:
    """`world.add(obj)` for a creature just made at (x, y), without crafter's overhead (numpy
    scalars and `chunk_key` on a 2-vector), for each of a world's creatures. The same
    index, maps and chunk (the chunk key itself is crafter's). crafter's `add` also replaces
    `obj.pos` by a copy of itself: the creature's own new array serves as well."""
    assert world._obj_map[x, y] == 0
    index = len(world._objects)
    world._objects.append(obj)
    world._obj_map[x, y] = index
    size = world._chunk_size
    where = (tuple(size), tuple(world.area), x // size[0], y // size[1])
    chunk = _CHUNK_KEYS.get(where)
    if chunk is None:
        chunk = _CHUNK_KEYS[where] = world.chunk_key(obj.pos)
    world._chunks[chunk].add(obj)
