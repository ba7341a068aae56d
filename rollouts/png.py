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

Pillow spent ~120 us of CPU on a 64-pixel frame, more than half of it around the
compression (the image object, the plugin's chunks, the encoder's set-up); here ~58 us. The
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
    up = np.empty(size, np.uint8)
    sub = np.empty(size, np.uint8)
    paeth = np.empty(size, np.uint8)
    for y in range(height):
        row = pixels[y]
        chosen = 0
        least = 0
        for i in range(size):
            least += _distance(row[i])
        if least > 0:
            total = 0
            for i in range(size):
                up[i] = np.uint8(row[i] - previous[i])
                total += _distance(up[i])
            if total < least:
                chosen, least = 2, total
        if least > 0:
            total = 0
            for i in range(size):
                sub[i] = row[i] if i < bpp else np.uint8(row[i] - row[i - bpp])
                total += _distance(sub[i])
            if total < least:
                chosen, least = 1, total
        if least > 0:
            total = 0
            for i in range(size):
                if i < bpp:
                    paeth[i] = np.uint8(row[i] - previous[i])
                else:
                    a = np.int32(row[i - bpp])
                    b = np.int32(previous[i])
                    c = np.int32(previous[i - bpp])
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    predicted = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    paeth[i] = np.uint8(row[i] - predicted)
                total += _distance(paeth[i])
            if total < least:
                chosen, least = 4, total
        out[y, 0] = chosen
        source = row if chosen == 0 else up if chosen == 2 else sub if chosen == 1 else paeth
        out[y, 1:] = source
        previous[:] = row
    return out


@njit(cache=True, inline="always")
def _distance(value) -> int:
    v = np.int32(value)
    return v if v < 128 else 256 - v
