"""The Crafter environment as the studio plays it: reproducible and observable (see
`docs/recording.md`, "Reproducible games").

Stock crafter 1.8.3 is not reproducible in two ways, both fixed by this env and its views
(`rollouts.game.crafter_views`) and nowhere else:

* `Env._balance_object` picks a creature to despawn from a list built by iterating a `set`,
  whose order follows memory addresses, so the same seed plays differently in two processes.
  We order those creatures by position.
* `LocalView._noise` (the night-time grain) draws from the world's random state, so rendering
  at 64 px consumes different numbers than at 256 px and the world itself diverges. Here the
  noise has its own generator, seeded from (episode seed, step), and never touches the world.

Stepping is faster than crafter's too (`StudioEnv.step`: the same updates, without numpy's
overhead per creature) and so is drawing (`rollouts.game.drawing`: the same pixels).

World generation is fast: opensimplex 0.4 compiles its kernels with numba when it is
importable, and `rollouts.game.worldgen` computes whole noise fields at once instead of one value
per call. The worlds are stock crafter's, bit for bit.
"""

from __future__ import annotations

import collections
import functools
import io
from dataclasses import dataclass
from typing import Any

import crafter
import numpy as np
from crafter import constants, engine, objects
from PIL import Image

from rollouts.game import worldgen
from rollouts.game.crafter_views import (
    RememberingItemView,
    ReproducibleLocalView,
    StudioWorld,
    shared_textures,
    without_textures,
)
from rollouts.game.png import encode_rgb

# The play page's snapshots (pickles in Django's cache) name these classes by the names they
# had here: a snapshot written before they moved still loads.
_StudioWorld = StudioWorld
_ReproducibleLocalView = ReproducibleLocalView
_RememberingItemView = RememberingItemView

AREA = (64, 64)
VIEW = (9, 9)
# The local view is 9 x 7 cells; the bottom two rows of the 9 x 9 grid show the inventory.
LOCAL_VIEW_GRID = (9, 7)

ACTIONS: tuple[str, ...] = (
    "noop",
    "move_left",
    "move_right",
    "move_up",
    "move_down",
    "do",
    "sleep",
    "place_stone",
    "place_table",
    "place_furnace",
    "place_plant",
    "make_wood_pickaxe",
    "make_stone_pickaxe",
    "make_iron_pickaxe",
    "make_wood_sword",
    "make_stone_sword",
    "make_iron_sword",
)
ACTION_INDEX: dict[str, int] = {name: i for i, name in enumerate(ACTIONS)}
assert tuple(constants.actions) == ACTIONS, "crafter changed its action list"

# crafter's own key map (crafter/run_gui.py), as browser `KeyboardEvent.key` values, plus
# `n` for noop (crafter's window plays noop when no key is down). The play page and the
# relabel picker of the episode viewer both use it.
KEY_MAP: tuple[tuple[str, str], ...] = (
    ("w", "move_up"),
    ("a", "move_left"),
    ("s", "move_down"),
    ("d", "move_right"),
    (" ", "do"),
    ("Tab", "sleep"),
    ("r", "place_stone"),
    ("t", "place_table"),
    ("f", "place_furnace"),
    ("p", "place_plant"),
    ("1", "make_wood_pickaxe"),
    ("2", "make_stone_pickaxe"),
    ("3", "make_iron_pickaxe"),
    ("4", "make_wood_sword"),
    ("5", "make_stone_sword"),
    ("6", "make_iron_sword"),
    ("n", "noop"),
)
assert sorted(a for _, a in KEY_MAP) == sorted(ACTIONS), "every action has one key"

ACHIEVEMENTS: tuple[str, ...] = tuple(sorted(constants.achievements))
VITALS: tuple[str, ...] = ("health", "food", "drink", "energy")
FACING_NAMES = {(-1, 0): "left", (1, 0): "right", (0, -1): "up", (0, 1): "down"}


class StudioEnv(crafter.Env):
    """`crafter.Env(area=(64, 64), size=(S, S), length=L, seed=seed)`, made reproducible.

    `semantic`: `step`'s info carries crafter's semantic map of the world, as crafter's
    does. The studio records none, and drawing it costs a good part of a step; without it
    the info has no "semantic".
    """

    def __init__(
        self, *, seed: int, size: int = 64, length: int = 256, semantic: bool = False
    ) -> None:
        # crafter.Env.__init__, but with textures shared by every episode of the process
        # (loading them costs as much as dozens of steps) and the reproducible local view.
        view = np.array(VIEW)
        self._area = AREA
        self._view = view
        self._size = np.array((size, size))
        self._reward = True
        self._length = length
        self._seed = seed
        self._episode = 0
        self._world = StudioWorld(AREA, constants.materials, (12, 12))
        self._textures = shared_textures()
        item_rows = int(np.ceil(len(constants.items) / view[0]))
        self._local_view = ReproducibleLocalView(
            self._world, self._textures, [view[0], view[1] - item_rows]
        )
        self._item_view = RememberingItemView(self._textures, [view[0], item_rows])
        self._sem_view = engine.SemanticView(
            self._world,
            [
                objects.Player,
                objects.Cow,
                objects.Zombie,
                objects.Skeleton,
                objects.Arrow,
                objects.Plant,
            ],
        )
        self._semantic = semantic
        self._step = None
        self._player = None
        self._last_health = None
        self._unlocked = None
        self.reward_range = None
        self.metadata = None

    def reset(self) -> np.ndarray:
        # crafter.Env.reset, with the fast world generation (the same worlds).
        center = (self._world.area[0] // 2, self._world.area[1] // 2)
        self._episode += 1
        self._step = 0
        self._world.reset(seed=hash((self._seed, self._episode)) % (2**31 - 1))
        self._update_time()
        self._player = objects.Player(self._world, center)
        self._last_health = self._player.health
        self._world.add(self._player)
        self._unlocked = set()
        worldgen.generate_world(self._world, self._player)
        return self._obs()

    def step(self, action: int):
        # crafter.Env.step, but the creatures near enough to move are found with their
        # distance to the player (crafter's `Player.distance`: the L1 norm) in Python
        # integers. numpy's overhead on 2-vectors, once per creature of the whole world,
        # took a tenth of a recorded step. The same creatures update, in the same order, each
        # measured from where the player then stands.
        self._step += 1
        self._update_time()
        player = self._player
        player.action = constants.actions[action]
        reach = 2 * max(self._view)
        px, py = player.pos.tolist()
        for obj in self._world.objects:
            ox, oy = obj.pos.tolist()
            if abs(ox - px) + abs(oy - py) < reach:
                obj.update()
                px, py = player.pos.tolist()  # only an update moves anything
        if self._step % 10 == 0:
            for chunk, objs in self._world.chunks.items():
                self._balance_chunk(chunk, objs)
        obs = self._obs()
        reward = (player.health - self._last_health) / 10
        self._last_health = player.health
        unlocked = {
            name
            for name, count in player.achievements.items()
            if count > 0 and name not in self._unlocked
        }
        if unlocked:
            self._unlocked |= unlocked
            reward += 1.0
        dead = player.health <= 0
        over = self._length and self._step >= self._length
        done = dead or over
        info = {
            "inventory": player.inventory.copy(),
            "achievements": player.achievements.copy(),
            "discount": 1 - float(dead),
            "player_pos": player.pos,
            "reward": reward,
        }
        if self._semantic:
            info["semantic"] = self._sem_view()
        if not self._reward:
            reward = 0.0
        return obs, reward, done, info

    def close(self) -> None:
        """Let go of the world's creatures: the env cannot be played on after this.

        Each creature holds its world, which holds it. Left as they are, an ended episode's
        world (~150 objects in cycles) waits for Python's cyclic collector, and in a worker
        that plays episodes all day it adds to the full collections, which hold the GIL
        over the whole heap while its other episodes wait.
        Without the world's lists nothing is in a cycle, and it is freed at once.
        """
        world = self._world
        world._objects = [None]
        world._chunks = collections.defaultdict(set)

    def render(self, size: Any = None) -> np.ndarray:
        # crafter.Env.render, drawn by `rollouts.game.drawing` (the same pixels).
        self._local_view.noise_key = (int(self._seed), int(self._step or 0))
        frame_size = np.array(self._size if size is None else size)
        unit = frame_size // self._view
        border = (frame_size - unit * self._view) // 2
        items = self._item_view(self._player.inventory, unit)
        frame = self._local_view.frame(self._player, unit, items, frame_size, border)
        return super().render(size) if frame is None else frame

    def _balance_object(
        self,
        chunk,
        objs,
        cls,
        material,
        span_dist,
        despan_dist,
        spawn_prob,
        despawn_prob,
        ctor,
        target_fn,
    ) -> None:
        # Same as crafter's, but `objs` (a set) is ordered by position before indexing.
        xmin, xmax, ymin, ymax = chunk
        random = self._world.random
        creatures = sorted(
            (obj for obj in objs if isinstance(obj, cls)), key=lambda o: (o.pos[0], o.pos[1])
        )
        mask = self._world.mask(*chunk, material)
        target_min, target_max = target_fn(len(creatures), mask.sum())
        if len(creatures) < int(target_min) and random.uniform() < spawn_prob:
            xs = np.tile(np.arange(xmin, xmax)[:, None], [1, ymax - ymin])
            ys = np.tile(np.arange(ymin, ymax)[None, :], [xmax - xmin, 1])
            xs, ys = xs[mask], ys[mask]
            i = random.randint(0, len(xs))
            pos = np.array((xs[i], ys[i]))
            empty = self._world[pos][1] is None
            away = self._player.distance(pos) >= span_dist
            if empty and away:
                self._world.add(ctor(pos))
        elif len(creatures) > int(target_max) and random.uniform() < despawn_prob:
            obj = creatures[random.randint(0, len(creatures))]
            away = self._player.distance(obj.pos) >= despan_dist
            if away:
                self._world.remove(obj)

    # --- snapshots (the play page keeps a game between key presses) ----------------------

    def __getstate__(self) -> dict[str, Any]:
        # The textures are shared by the process and slow to load: a snapshot leaves them out
        # (it stays small) and takes the process's own when loaded.
        state = self.__dict__.copy()
        state["_textures"] = None
        state["_local_view"] = without_textures(self._local_view)
        state["_item_view"] = without_textures(self._item_view)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_semantic", False)  # a snapshot from before the option
        textures = shared_textures()
        self._textures = textures
        self._local_view._textures = textures
        self._item_view._textures = textures

    # --- what the studio records about the game -------------------------------------------

    @property
    def step_count(self) -> int:
        return int(self._step or 0)

    @property
    def length(self) -> int:
        return int(self._length)

    def unlocked(self) -> list[str]:
        return sorted(name for name, n in self._player.achievements.items() if n > 0)

    def state(self) -> dict[str, Any]:
        """The game state at this step, as stored on each frame (JSON-ready)."""
        player = self._player
        inventory = {k: int(v) for k, v in player.inventory.items()}
        return {
            "step": self.step_count,
            "vitals": {k: inventory[k] for k in VITALS},
            "inventory": {k: v for k, v in inventory.items() if k not in VITALS and v},
            "position": [int(player.pos[0]), int(player.pos[1])],
            "facing": FACING_NAMES[tuple(int(x) for x in player.facing)],
            "sleeping": bool(player.sleeping),
            "daylight": round(float(self._world.daylight), 4),
            "achievements": self.unlocked(),
        }

    def local_map(self) -> list[list[str]]:
        """Names of what is in each cell of the local view, rows top to bottom."""
        world, player = self._world, self._player
        names = world._mat_names
        gx, gy = LOCAL_VIEW_GRID
        px, py = int(player.pos[0]), int(player.pos[1])
        x0, y0 = px - gx // 2, py - gy // 2
        # The window as Python lists, read once: indexing numpy cell by cell costs more.
        xa, xb, ya, yb = max(x0, 0), min(x0 + gx, AREA[0]), max(y0, 0), min(y0 + gy, AREA[1])
        materials = world._mat_map[xa:xb, ya:yb].tolist()
        ids = world._obj_map[xa:xb, ya:yb].tolist()
        rows: list[list[str]] = []
        for y in range(y0, y0 + gy):
            row = []
            for x in range(x0, x0 + gx):
                if not (xa <= x < xb and ya <= y < yb):
                    row.append("void")
                    continue
                obj = world._objects[ids[x - xa][y - ya]]
                if obj is None:
                    row.append(names[materials[x - xa][y - ya]])
                else:
                    row.append("you" if obj is player else type(obj).__name__.lower())
            rows.append(row)
        return rows


def text_observation(env: StudioEnv, state: dict[str, Any] | None = None) -> str:
    """The text observation: what a text-only agent needs to play (`docs/recording.md`).

    `state`, when given, is `env.state()` at this step (a recorder has it already).
    """
    state = env.state() if state is None else state
    v = state["vitals"]
    inventory = ", ".join(f"{k}={n}" for k, n in state["inventory"].items()) or "empty"
    achievements = ", ".join(state["achievements"]) or "none"
    x, y = state["position"]
    map_lines = "\n".join(" ".join(f"{cell:>8}" for cell in row) for row in env.local_map())
    return (
        f"Step {state['step']} of {env.length}.\n"
        f"Health {v['health']}/9, food {v['food']}/9, drink {v['drink']}/9, "
        f"energy {v['energy']}/9.\n"
        f"Position ({x}, {y}), facing {state['facing']}"
        f"{', asleep' if state['sleeping'] else ''}.\n"
        f"Inventory: {inventory}.\n"
        f"Achievements unlocked: {achievements}.\n"
        f"Local view ({LOCAL_VIEW_GRID[0]} columns x {LOCAL_VIEW_GRID[1]} rows, "
        f"you are in the centre):\n{map_lines}"
    )


def warm_up() -> None:
    """Build, play and draw one game: what every episode of a process needs first (the
    textures, the world generator's compiled kernels, tens of thousands of objects) is then
    ready before the first episode."""
    env = StudioEnv(seed=0)
    encode_png(env.reset())
    env.step(ACTION_INDEX["noop"])
    env.close()


@dataclass(frozen=True)
class EncodedFrame:
    png: bytes
    width: int
    height: int


def encode_png(frame: np.ndarray) -> EncodedFrame:
    """Lossless PNG of the RGB array crafter returned; the same array gives the same bytes,
    those Pillow writes at compression level 1 (`rollouts.game.png`). Level 1: frames are small
    and many; compression past this buys little and costs time."""
    height, width = frame.shape[:2]
    return EncodedFrame(png=encode_rgb(frame), width=width, height=height)


def decode_png(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as image:
        return np.asarray(image.convert("RGB"))


def library_versions() -> dict[str, str]:
    """The versions a batch records: those this process loaded (read once, at its first
    batch: each read parses three packages' metadata)."""
    return dict(_library_versions())


@functools.cache
def _library_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("crafter", "numpy", "opensimplex")}


def numba_enabled() -> bool:
    """True when opensimplex compiled its kernels with numba (fast world generation)."""
    from opensimplex import internals

    return hasattr(internals._extrapolate3, "py_func")


__all__ = [
    "ACHIEVEMENTS",
    "ACTIONS",
    "ACTION_INDEX",
    "KEY_MAP",
    "StudioEnv",
    "decode_png",
    "encode_png",
    "library_versions",
    "numba_enabled",
    "text_observation",
]
