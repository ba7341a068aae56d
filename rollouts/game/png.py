"""PNG files of RGB frames, byte for byte as Pillow writes them, in about half its CPU time.

A frame's sha256 names its file, stores identical frames once and checks a fork's replay, so
the bytes of a frame must stay what they have been: Pillow's `Image.save(format="PNG",
compress_level=1)`. That is:
- each row filtered as Pillow's `ZipEncode.c` chooses: of none, up, sub and Paeth, tried in
  that order, the first with the least sum of distances from zero (bytes of 128 and more
  count as negative; average is tried only when optimizing, which the studio never asks);
- the rows deflated at level 1, with a 32 KB window, memory level 9 and zlib's filtered
  strategy;
- in IDAT chunks of Pillow's block size (`ImageFile._save`: the larger of 64 KB and four
  bytes per pixel of a row).

Pillow spends more than half of its CPU on a 64-pixel frame around the compression (the
image object, the plugin's chunks, the encoder's set-up), which this module leaves out. The
tests compare the bytes with Pillow's own, on crafter's frames and on noise, solid and
gradient images of many sizes.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
from numba import njit

SIGNATURE = b"\x89PNG\r\n\x1a\n"
COMPRESS_LEVEL = 1
# Pillow's `ImageFile.MAXBLOCK`: the most its encoder returns at once, one IDAT chunk each.
MAX_BLOCK = 65536
_BYTES_PER_PIXEL = 3
# PNG filter types; after none (0), Pillow tries these in this order (average, 3, only when
# it optimizes, which the studio never asks).
_SUB, _UP, _PAETH = 1, 2, 4
_TRIED = (_UP, _SUB, _PAETH)


def encode_rgb(frame: np.ndarray) -> bytes:
    """The PNG of an (height, width, 3) array of 8-bit RGB pixels."""
    if frame.ndim != 3 or frame.shape[2] != _BYTES_PER_PIXEL or 0 in frame.shape:
        raise ValueError(f"an RGB frame is (height, width, 3) pixels, not {frame.shape}")
    height, width = frame.shape[:2]
    pixels = np.ascontiguousarray(frame, dtype=np.uint8).reshape(height, width * 3)
    rows = _filtered_rows(pixels, np.empty((height, width * 3 + 1), np.uint8))
    deflate = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 15, 9, zlib.Z_FILTERED)
    data = deflate.compress(rows) + deflate.flush()
    block = max(MAX_BLOCK, width * 4)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return b"".join(
        [
            SIGNATURE,
            _chunk(b"IHDR", header),
            *(_chunk(b"IDAT", data[at : at + block]) for at in range(0, len(data), block)),
            _chunk(b"IEND", b""),
        ]
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@njit(cache=True, nogil=True)
def _filtered_rows(pixels, out):
    """Each row of `pixels` (height, width x 3) behind its filter byte, in `out`."""
    height, size = pixels.shape
    bpp = _BYTES_PER_PIXEL
    previous = np.zeros(size, np.uint8)
    filtered = np.empty((5, size), np.uint8)  # by filter type
    for y in range(height):
        row = pixels[y]
        chosen = 0
        least = 0
        for i in range(size):
            least += _distance(row[i])
        for kind in _TRIED:
            if least == 0:
                break
            total = 0
            for i in range(size):
                # The bytes to the left are 0 before the row starts (the PNG specification).
                a = np.int32(row[i - bpp]) if i >= bpp else 0
                c = np.int32(previous[i - bpp]) if i >= bpp else 0
                value = np.uint8(row[i] - _predicted(kind, a, np.int32(previous[i]), c))
                filtered[kind, i] = value
                total += _distance(value)
            if total < least:
                chosen, least = kind, total
        out[y, 0] = chosen
        out[y, 1:] = row if chosen == 0 else filtered[chosen]
        previous[:] = row
    return out


@njit(cache=True, inline="always")
def _predicted(kind, a, b, c):
    """What filter `kind` predicts a byte from: a to its left, b above it, c above a."""
    if kind == _SUB:
        return a
    if kind == _UP:
        return b
    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)  # Paeth, as Pillow writes it
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


@njit(cache=True, inline="always")
def _distance(value) -> int:
    v = np.int32(value)
    return v if v < 128 else 256 - v
