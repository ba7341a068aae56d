"""Provider limits, each rule on its own, with the row it breaks."""

from __future__ import annotations

import base64
import io
import json
import os
import zlib
from pathlib import Path

from PIL import Image

from curation.validation import (
    MAX_FILE_BYTES,
    ProviderReport,
    check_row_dict,
    validate_openai_file,
)


def _url(image: Image.Image, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


RGB = _url(Image.new("RGB", (64, 64), (10, 120, 30)))


def _row(*images: str, assistant_images: tuple[str, ...] = (), answer: bool = True) -> dict:
    user = [{"type": "text", "text": "look"}] + [
        {"type": "image_url", "image_url": {"url": u}} for u in images
    ]
    assistant: dict = {"role": "assistant", "content": "ok" if answer else None}
    if assistant_images:
        assistant["content"] = [
            {"type": "image_url", "image_url": {"url": u}} for u in assistant_images
        ]
    return {"messages": [{"role": "user", "content": user}, assistant]}


def _file(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _violations(tmp_path: Path, bad: dict, at: int = 4) -> list[str]:
    rows = [_row(RGB) for _ in range(12)]
    rows[at - 1] = bad
    return [str(v) for v in validate_openai_file(_file(tmp_path, rows)).violations]


def test_it_accepts_good_rows_and_estimates_tokens(tmp_path):
    report = validate_openai_file(_file(tmp_path, [_row(RGB, RGB) for _ in range(10)]))
    assert report.ok and report.rows == 10 and report.images == 20
    assert report.image_tokens == 20 * 255  # one 512 px tile each at auto detail
    assert report.tokens > report.image_tokens


def test_it_refuses_more_than_ten_images_in_a_row(tmp_path):
    assert _violations(tmp_path, _row(*[RGB] * 11)) == ["train row 4: 11 images; at most 10"]


def test_it_refuses_an_image_over_ten_megabytes(tmp_path):
    noise = Image.frombytes("RGB", (1900, 1900), os.urandom(1900 * 1900 * 3))
    url = _url(noise)
    assert len(url) * 3 // 4 > 10 * 1024 * 1024
    (message,) = _violations(tmp_path, _row(url), at=2)
    assert message.startswith("train row 2: image 1 is ") and "at most 10485760" in message


def test_it_refuses_formats_and_modes_the_provider_does_not_take(tmp_path):
    gif = _url(Image.new("RGB", (8, 8)), "GIF")
    grey = _url(Image.new("L", (8, 8)))
    assert _violations(tmp_path, _row(gif, grey), at=7) == [
        "train row 7: image 1 is GIF; allowed: PNG, JPEG, WEBP",
        "train row 7: image 1 is in mode P; allowed: RGB, RGBA",
        "train row 7: image 2 is in mode L; allowed: RGB, RGBA",
    ]
    rgba_webp = _url(Image.new("RGBA", (8, 8)), "WEBP")
    jpeg = _url(Image.new("RGB", (8, 8)), "JPEG")
    assert _violations(tmp_path, _row(rgba_webp, jpeg)) == []


def test_it_refuses_images_in_assistant_messages(tmp_path):
    assert _violations(tmp_path, _row(RGB, assistant_images=(RGB,)), at=1) == [
        "train row 1: image 2 is in an assistant message"
    ]


def test_it_refuses_rows_without_an_answer_and_undecodable_lines(tmp_path):
    assert _violations(tmp_path, _row(RGB, answer=False), at=3) == [
        "train row 3: no assistant answer (content or tool calls) to learn"
    ]
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join([json.dumps(_row(RGB))] * 10 + ["{oops"]) + "\n")
    (violation,) = validate_openai_file(path).violations
    assert str(violation).startswith("train row 11: not JSON")


def test_it_refuses_fewer_than_ten_rows(tmp_path):
    report = validate_openai_file(_file(tmp_path, [_row(RGB)] * 9))
    assert [str(v) for v in report.violations] == ["train file: 9 rows; at least 10 are needed"]


def test_it_refuses_a_file_over_512_megabytes():
    report = ProviderReport()
    for row in range(1, 11):
        check_row_dict(report, row=row, record=_row(RGB), text_chars=10)
    report.finish(file_bytes=MAX_FILE_BYTES + 1)
    assert [str(v) for v in report.violations] == [
        f"train file: {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}"
    ]


def test_it_lists_every_violation_not_just_the_first(tmp_path):
    rows = [_row(*[RGB] * 11) for _ in range(12)]
    report = validate_openai_file(_file(tmp_path, rows))
    assert [v.row for v in report.violations] == list(range(1, 13))


def _png(image: Image.Image, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **params)
    return buffer.getvalue()


def _pillow_says(data: bytes):
    """What Pillow itself reads from the header, or the exception type it raises."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return (len(data), image.format, image.mode, *image.size)
    except Exception as exc:
        return type(exc).__name__


def test_the_header_probe_says_what_pillow_says_for_every_kind_of_png():
    from curation.validation import ImageError, _plain_png_header, probe_image

    rgb = _png(Image.new("RGB", (64, 48), (10, 120, 30)))
    broken_crc = rgb[:29] + bytes([rgb[29] ^ 1]) + rgb[30:]
    text_first = _png(Image.new("RGB", (8, 8)), pnginfo=_text_chunk())
    samples = {
        "rgb": rgb,
        "rgba": _png(Image.new("RGBA", (5, 7), (1, 2, 3, 4))),
        "grey": _png(Image.new("L", (9, 9))),
        "grey alpha": _png(Image.new("LA", (9, 9))),
        "palette": _png(Image.new("P", (9, 9))),
        "bits": _png(Image.new("1", (9, 9))),
        "16-bit": _png(Image.new("I;16", (9, 9))),
        "transparency": _png(Image.new("RGB", (9, 9)), transparency=(0, 0, 0)),
        "text before the data": text_first,
        "interlaced": _with_header_byte(rgb, 28, 1),
        "zero width": _zero_width(rgb),
        "unknown filter": _with_header_byte(rgb, 27, 1),
        "broken header crc": broken_crc,
        "truncated": rgb[:40],
        "not a png": b"GIF89a" + rgb[6:],
    }
    # The common frame takes the quick path; the test compares both paths with Pillow.
    assert _plain_png_header(rgb) is not None
    assert _plain_png_header(samples["palette"]) is None
    for name, data in samples.items():
        expected = _pillow_says(data)
        try:
            info = probe_image(data)
            got = (info.size_bytes, info.format, info.mode, info.width, info.height)
        except ImageError:
            got = "error"
        if isinstance(expected, str):
            assert got == "error", name
        else:
            assert got == expected, name


def _with_header_byte(png: bytes, offset: int, value: int) -> bytes:
    """`png` with one byte of its header chunk changed, and that chunk's CRC made right."""
    data = bytearray(png)
    data[offset] = value
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def _zero_width(png: bytes) -> bytes:
    data = png
    for offset in range(16, 20):
        data = _with_header_byte(data, offset, 0)
    return data


def _text_chunk():
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Software", "studio")
    return info
