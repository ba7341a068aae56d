"""A frame's PNG is, byte for byte, the file Pillow writes: its sha256 names the file, stores
identical frames once and checks a fork's replay, so it must never change."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from PIL import Image

from rollouts.game.crafter_env import ACTIONS, StudioEnv, decode_png, encode_png
from rollouts.game.png import encode_rgb
from rollouts.rollout_settings import MAX_IMAGE_SIZE, MIN_IMAGE_SIZE


def _pillows(frame: np.ndarray) -> bytes:
    """What the studio wrote before it encoded frames itself."""
    buffer = io.BytesIO()
    Image.fromarray(frame, "RGB").save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


@pytest.mark.parametrize("size", sorted({MIN_IMAGE_SIZE, 64, 96, 200, MAX_IMAGE_SIZE}))
def test_a_played_frame_is_the_file_pillow_writes(size):
    env = StudioEnv(seed=size, size=size, length=40)
    frames = [env.reset()]
    for step in range(40):
        frames.append(env.step(step % len(ACTIONS))[0])
    for frame in frames:
        assert encode_png(frame).png == _pillows(frame)


_RNG = np.random.default_rng(7)


@pytest.mark.parametrize(
    "frame",
    [
        _RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8),  # noise: no filter helps
        np.full((64, 64, 3), 77, np.uint8),  # solid: rows repeat (up), pixels repeat (sub)
        (np.arange(64 * 64 * 3) % 251).astype(np.uint8).reshape(64, 64, 3),
        np.zeros((1, 1, 3), np.uint8),
        _RNG.integers(0, 256, (7, 13, 3), dtype=np.uint8),
        # Over Pillow's 64 KB block once deflated: several IDAT chunks, cut where it cuts.
        _RNG.integers(0, 256, (300, 300, 3), dtype=np.uint8),
        # A row of over 16,384 pixels: the block grows to four bytes a pixel.
        _RNG.integers(0, 256, (12, 20_000, 3), dtype=np.uint8),
        # Not contiguous, as a slice of a larger frame is.
        _RNG.integers(0, 256, (40, 80, 3), dtype=np.uint8)[::2, 10:50],
    ],
    ids=["noise", "solid", "gradient", "1x1", "7x13", "several-idat", "wide-row", "strided"],
)
def test_any_rgb_image_is_the_file_pillow_writes(frame):
    encoded = encode_rgb(frame)
    assert encoded == _pillows(np.ascontiguousarray(frame))
    assert np.array_equal(decode_png(encoded), frame)


def test_the_first_frame_of_a_seed_keeps_the_hash_it_was_recorded_with():
    # Written down from Pillow 13's file for this frame, before frames were encoded here.
    frame = StudioEnv(seed=0).reset()
    assert hashlib.sha256(encode_png(frame).png).hexdigest() == FIRST_FRAME_SHA256


@pytest.mark.parametrize("shape", [(64, 64), (64, 64, 4), (0, 64, 3), (64, 64, 1)])
def test_it_refuses_what_is_not_an_rgb_frame(shape):
    with pytest.raises(ValueError, match="RGB frame"):
        encode_rgb(np.zeros(shape, np.uint8))


FIRST_FRAME_SHA256 = "cb2eb26be651ffba384848746a17910dcc25e00a3165cf72bac29182d77e4e5a"
