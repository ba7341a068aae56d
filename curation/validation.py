"""Provider limits for multimodal fine-tuning files (OpenAI's documented ones), and a report.

Used by `export_jsonl --format openai` (on the rows as they are built, before anything is
written) and by anything about to upload a file (`validate_openai_file`). Every violation is
kept with its row number (1-based line), never just the first.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import warnings
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from curation.row_formats.openai import MIN_TRAIN_ROWS as OPENAI_MIN_TRAIN_ROWS
from studio.errors import plain_error

MAX_IMAGES_PER_ROW = 10
MAX_IMAGE_BYTES = 10 * 1024 * 1024
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
IMAGE_MODES = ("RGB", "RGBA")
# OpenAI refuses a smaller training file; declared with the openai row format.
MIN_ROWS = OPENAI_MIN_TRAIN_ROWS
MAX_FILE_BYTES = 512 * 1024 * 1024
# Pixel cap when decoding untrusted images (decompression bombs): 8192 x 8192.
MAX_IMAGE_PIXELS = 8192 * 8192
# Text tokens: 4 characters each, counting the JSON of the row but not its image data
# (a deliberate overestimate); images as OpenAI bills them.
CHARS_PER_TOKEN = 4
DATA_URL_PREFIXES = {
    "data:image/png;base64,": "PNG",
    "data:image/jpeg;base64,": "JPEG",
    "data:image/jpg;base64,": "JPEG",
    "data:image/webp;base64,": "WEBP",
}


@dataclass(frozen=True)
class ImageInfo:
    size_bytes: int
    format: str
    mode: str
    width: int
    height: int


class ImageError(ValueError):
    """An image could not be decoded or breaks a hard safety limit."""


def decode_data_url(url: Any, *, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The bytes of a `data:image/...;base64,` URL; refuses anything else, and oversized data."""
    if not isinstance(url, str):
        raise ImageError("image_url.url is not a string")
    if not url.startswith("data:"):
        raise ImageError("image URL is not a data: URL (remote images are not fetched)")
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise ImageError("data URL is not base64")
    # Base64 is 4/3 the size: refuse before decoding what would be too large anyway.
    if len(payload) > (max_bytes * 4) // 3 + 4:
        raise ImageError(f"image larger than {max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"data URL is not valid base64 ({exc})") from exc
    if len(data) > max_bytes:
        raise ImageError(f"image larger than {max_bytes} bytes")
    return data


def probe_image(data: bytes, *, full_decode: bool = False) -> ImageInfo:
    """Format, mode and size from the header (or a full decode), with a pixel limit."""
    if not full_decode:
        info = _plain_png_header(data)
        if info is not None:
            return info
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise ImageError(
                        f"image of {width}x{height} pixels is over the limit of "
                        f"{MAX_IMAGE_PIXELS} pixels"
                    )
                if full_decode:
                    image.load()
                return ImageInfo(
                    size_bytes=len(data),
                    format=str(image.format),
                    mode=str(image.mode),
                    width=width,
                    height=height,
                )
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"image refused as a decompression bomb ({exc})") from exc
    except Exception as exc:  # Pillow raises many kinds on broken data
        raise ImageError(f"image cannot be decoded ({plain_error(exc)})") from exc


_PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"
_PNG_MODES = {2: "RGB", 6: "RGBA"}  # colour type -> Pillow's mode, at 8 bits a channel


def _plain_png_header(data: bytes) -> ImageInfo | None:
    """What Pillow's header read gives for the common PNG, without Pillow; None for others.

    Frames are 8-bit RGB PNGs whose header chunk is followed by the image data. Pillow
    reads the same 33 bytes (checking the chunk's CRC) and stops at the data chunk, at
    50 times the cost, which made it a third of an export. Anything else (other modes, other
    chunks first, a bad CRC, sizes near a pixel limit) is left to Pillow.
    """
    if len(data) < 41 or data[:16] != _PNG_HEAD or data[37:41] != b"IDAT":
        return None
    if zlib.crc32(data[12:29]) != int.from_bytes(data[29:33], "big"):
        return None
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    mode = _PNG_MODES.get(data[25]) if data[24] == 8 else None
    pixels = width * height
    if mode is None or data[27] != 0 or not width or not height or pixels > MAX_IMAGE_PIXELS:
        return None
    if Image.MAX_IMAGE_PIXELS is not None and pixels > Image.MAX_IMAGE_PIXELS:
        return None
    return ImageInfo(size_bytes=len(data), format="PNG", mode=mode, width=width, height=height)


def image_tokens(info: ImageInfo, detail: str = "auto") -> int:
    """OpenAI's image cost: 85 at low detail, else 85 + 170 per 512 px tile after scaling."""
    if detail == "low":
        return 85
    width, height = float(info.width), float(info.height)
    if max(width, height) > 2048:
        scale = 2048 / max(width, height)
        width, height = width * scale, height * scale
    if min(width, height) > 768:
        scale = 768 / min(width, height)
        width, height = width * scale, height * scale
    return 85 + 170 * math.ceil(width / 512) * math.ceil(height / 512)


@dataclass(frozen=True)
class Violation:
    row: int | None  # 1-based line number; None for the file as a whole
    message: str
    file: str = "train"

    def __str__(self) -> str:
        where = f"{self.file} row {self.row}" if self.row is not None else f"{self.file} file"
        return f"{where}: {self.message}"


@dataclass
class ProviderReport:
    """What the provider would say about a file: every violation, rows, images and tokens."""

    file: str = "train"
    rows: int = 0
    images: int = 0
    text_tokens: int = 0
    image_tokens: int = 0
    bytes: int = 0
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def tokens(self) -> int:
        return self.text_tokens + self.image_tokens

    def check_row(
        self,
        *,
        row: int,
        images: list[tuple[ImageInfo | None, str, str]],
        text_chars: int,
        has_answer: bool,
        problems: Iterable[str] = (),
    ) -> None:
        """One row: `images` holds (info or None when undecodable, role, detail) per image."""
        self.rows += 1
        self.images += len(images)
        self.text_tokens += text_chars // CHARS_PER_TOKEN
        for message in problems:
            self.violations.append(Violation(row, message, self.file))
        if len(images) > MAX_IMAGES_PER_ROW:
            self.violations.append(
                Violation(row, f"{len(images)} images; at most {MAX_IMAGES_PER_ROW}", self.file)
            )
        if not has_answer:
            self.violations.append(
                Violation(row, "no assistant answer (content or tool calls) to learn", self.file)
            )
        for number, (info, role, detail) in enumerate(images, start=1):
            if role == "assistant":
                self.violations.append(
                    Violation(row, f"image {number} is in an assistant message", self.file)
                )
            if info is None:
                continue
            self.image_tokens += image_tokens(info, detail)
            if info.size_bytes > MAX_IMAGE_BYTES:
                self.violations.append(
                    Violation(
                        row,
                        f"image {number} is {info.size_bytes} bytes; at most {MAX_IMAGE_BYTES}",
                        self.file,
                    )
                )
            if info.format not in IMAGE_FORMATS:
                self.violations.append(
                    Violation(
                        row,
                        f"image {number} is {info.format}; allowed: {', '.join(IMAGE_FORMATS)}",
                        self.file,
                    )
                )
            if info.mode not in IMAGE_MODES:
                self.violations.append(
                    Violation(
                        row,
                        f"image {number} is in mode {info.mode}; allowed: {', '.join(IMAGE_MODES)}",
                        self.file,
                    )
                )

    def finish(self, *, file_bytes: int, min_rows: int = MIN_ROWS) -> ProviderReport:
        self.bytes = file_bytes
        if self.rows < min_rows:
            self.violations.append(
                Violation(None, f"{self.rows} rows; at least {min_rows} are needed", self.file)
            )
        if file_bytes > MAX_FILE_BYTES:
            self.violations.append(
                Violation(None, f"{file_bytes} bytes; at most {MAX_FILE_BYTES}", self.file)
            )
        return self

    def summary(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "images": self.images,
            "bytes": self.bytes,
            "estimated_tokens": self.tokens,
            "violations": len(self.violations),
        }


def check_row_dict(report: ProviderReport, *, row: int, record: Any, text_chars: int) -> None:
    """Check one parsed JSONL row (OpenAI chat format) against the provider limits."""
    problems: list[str] = []
    images: list[tuple[ImageInfo | None, str, str]] = []
    has_answer = False
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        problems.append("no messages")
        messages = []
    for message in messages:
        if not isinstance(message, dict):
            problems.append("a message is not an object")
            continue
        role = str(message.get("role"))
        content = message.get("content")
        if role == "assistant" and (content or message.get("tool_calls")):
            has_answer = True
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            image_url = part.get("image_url") or {}
            detail = str(image_url.get("detail", "auto")) if isinstance(image_url, dict) else ""
            try:
                data = decode_data_url(
                    image_url.get("url") if isinstance(image_url, dict) else None,
                    max_bytes=MAX_FILE_BYTES,
                )
                images.append((probe_image(data), role, detail))
            except ImageError as exc:
                problems.append(f"image {len(images) + 1}: {exc}")
                images.append((None, role, detail))
    report.check_row(
        row=row, images=images, text_chars=text_chars, has_answer=has_answer, problems=problems
    )


def validate_openai_file(path: str | Path, *, file: str = "train") -> ProviderReport:
    """Check a JSONL file before a training upload; reads it line by line."""
    report = ProviderReport(file=file)
    size = 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            size += len(raw)
            try:
                record = json.loads(raw)
            except ValueError as exc:
                report.rows += 1
                report.violations.append(Violation(number, f"not JSON ({exc})", file))
                continue
            text_chars = _text_chars(record, raw.decode("utf-8", errors="replace"))
            check_row_dict(report, row=number, record=record, text_chars=text_chars)
    return report.finish(file_bytes=size)


def _text_chars(record: Any, line: str) -> int:
    """Characters of the row that are not image data (the export estimates the same way)."""
    total = len(line)
    if not isinstance(record, dict):
        return total
    for message in record.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    total -= len(json.dumps(part, ensure_ascii=False))
    return max(total, 0)
