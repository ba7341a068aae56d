"""Where a trl job's files live: checkpoints, the trained model, and local caches of them.

Everything goes through Django's storage API (`default_storage`), never a path of it: the same
code runs on the local file storage and on S3. Files are streamed in blocks, never read whole.
What is read back is checked before it is used: a model file against the manifest written last
at upload, a dataset export against the sha256 its version recorded, and every zip entry for a
name that would land outside its directory.

The local cache (`STUDIO_MODEL_CACHE_DIR`) holds one directory per model manifest or dataset
sha256, bounded by `STUDIO_MODEL_CACHE_BYTES`: the least recently used entries are removed
when a new one is added.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage

BLOCK = 1 << 20
MANIFEST = "manifest.json"
# A manifest lists the files of one model directory: bounded, as anything read back is.
MANIFEST_MAX_BYTES = 4 << 20
MANIFEST_MAX_FILES = 10_000
_LAST_USED = ".last-used"
_ABANDONED_SECONDS = 24 * 3600
_CHECKPOINT_NAME = re.compile(r"^step-(\d{1,12})\.zip$")


class ModelStoreError(Exception):
    """A stored file is missing, altered or refused; the message says which and why."""


def job_prefix(job_id: int) -> str:
    return f"training/trl/job-{int(job_id)}"


# -- storage ------------------------------------------------------------------------------


def _store(name: str, source: IO[bytes]) -> None:
    """`source` saved under exactly `name` (a storage that renames on a clash is refused)."""
    if default_storage.exists(name):
        default_storage.delete(name)
    saved = default_storage.save(name, File(source, name=PurePosixPath(name).name))
    if saved != name:
        default_storage.delete(saved)
        raise ModelStoreError(f"storage saved {name!r} as {saved!r}")


def _listdir(prefix: str) -> list[str]:
    try:
        return default_storage.listdir(prefix)[1]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _copy_hashing(source: IO[bytes], target: IO[bytes], limit: int) -> tuple[str, int]:
    """Copies at most `limit` + 1 bytes (one more says the source was too long)."""
    hasher, size = hashlib.sha256(), 0
    while size <= limit:
        block = source.read(min(BLOCK, limit + 1 - size))
        if not block:
            break
        hasher.update(block)
        target.write(block)
        size += len(block)
    return hasher.hexdigest(), size


def _file_sha256(path: Path) -> tuple[str, int]:
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
        return digest, fh.tell()


# -- zips ---------------------------------------------------------------------------------


def _zip_directory(directory: Path, target: IO[bytes]) -> None:
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            archive.write(path, path.relative_to(directory).as_posix())


def _safe_member(name: str) -> PurePosixPath:
    """A zip entry's name as a relative path inside its directory, or refused."""
    if "\\" in name or "\x00" in name or not name:
        raise ModelStoreError(f"zip entry {name[:200]!r} refused: not a plain relative path")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", name):
        raise ModelStoreError(f"zip entry {name[:200]!r} refused: it climbs out of its directory")
    return path


def _unzip(archive_file: IO[bytes], into: Path, max_bytes: int) -> None:
    """Every entry checked (names, links, total size) before one byte is written."""
    with zipfile.ZipFile(archive_file) as archive:
        members = archive.infolist()
        total = 0
        for info in members:
            _safe_member(info.filename)
            mode = info.external_attr >> 16
            if mode and (mode & 0o170000) == 0o120000:
                raise ModelStoreError(f"zip entry {info.filename[:200]!r} refused: a link")
            total += info.file_size
        if total > max_bytes:
            raise ModelStoreError(f"zip refused: {total} bytes unpacked, over {max_bytes}")
        into.mkdir(parents=True, exist_ok=True)
        for info in members:
            target = into / _safe_member(info.filename)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            # zipfile checks each entry's CRC and length as it is read.
            with archive.open(info) as src, open(target, "wb") as dst:
                _, size = _copy_hashing(src, dst, info.file_size)
            if size != info.file_size:
                raise ModelStoreError(f"zip entry {info.filename[:200]!r} is not its stated size")


# -- checkpoints ----------------------------------------------------------------------------


def _checkpoints(job_id: int) -> list[tuple[int, str]]:
    prefix = f"{job_prefix(job_id)}/checkpoints"
    found = []
    for name in _listdir(prefix):
        match = _CHECKPOINT_NAME.match(name)
        if match:
            found.append((int(match.group(1)), f"{prefix}/{name}"))
    return sorted(found)


def checkpoint_upload(job_id: int, step: int, directory: Path) -> None:
    """The Trainer's checkpoint directory, zipped and stored; older ones deleted after."""
    name = f"{job_prefix(job_id)}/checkpoints/step-{int(step):08d}.zip"
    with tempfile.TemporaryFile() as spool:
        _zip_directory(Path(directory), spool)
        spool.seek(0)
        _store(name, spool)
    for _, older in _checkpoints(job_id):
        if older != name:
            default_storage.delete(older)


def checkpoint_fetch(job_id: int, into: Path) -> tuple[int, Path] | None:
    """The latest stored checkpoint as `into/checkpoint-<step>` (None when there is none).

    A checkpoint that does not unzip whole (a save cut short) is passed over for the one
    before it, which is deleted only once a newer one is stored."""
    for step, name in reversed(_checkpoints(job_id)):
        target = Path(into) / f"checkpoint-{step}"
        shutil.rmtree(target, ignore_errors=True)
        try:
            with default_storage.open(name, "rb") as source, tempfile.TemporaryFile() as spool:
                _copy_hashing(source, spool, 1 << 62)
                spool.seek(0)
                _unzip(spool, target, 1 << 62)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError):
            shutil.rmtree(target, ignore_errors=True)
            continue
        return step, target
    return None


# -- the model ------------------------------------------------------------------------------


def model_upload(job_id: int, model_dir: Path) -> str:
    """Every file of `model_dir`, then `manifest.json` (file -> sha256, bytes) written last.

    Returns the manifest's sha256. The old manifest goes first: a model half re-uploaded
    is never fetched as whole."""
    prefix = f"{job_prefix(job_id)}/model"
    model_dir = Path(model_dir)
    if default_storage.exists(f"{prefix}/{MANIFEST}"):
        default_storage.delete(f"{prefix}/{MANIFEST}")
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(model_dir).as_posix()
        if relative == MANIFEST:
            continue
        sha256, size = _file_sha256(path)
        with open(path, "rb") as fh:
            _store(f"{prefix}/{relative}", fh)
        files[relative] = {"sha256": sha256, "bytes": size}
    body = json.dumps({"files": files}, sort_keys=True, indent=1).encode()
    with tempfile.TemporaryFile() as spool:
        spool.write(body)
        spool.seek(0)
        _store(f"{prefix}/{MANIFEST}", spool)
    return hashlib.sha256(body).hexdigest()


def _read_manifest(job_id: int) -> tuple[str, dict[str, dict[str, Any]]]:
    name = f"{job_prefix(job_id)}/model/{MANIFEST}"
    try:
        with default_storage.open(name, "rb") as fh:
            body = fh.read(MANIFEST_MAX_BYTES + 1)
    except (FileNotFoundError, OSError) as exc:
        raise ModelStoreError(f"job {job_id} has no stored model (no {MANIFEST})") from exc
    if len(body) > MANIFEST_MAX_BYTES:
        raise ModelStoreError(f"job {job_id}'s {MANIFEST} is over {MANIFEST_MAX_BYTES} bytes")
    try:
        files = json.loads(body)["files"]
        checked = {}
        for relative, entry in files.items():
            _safe_member(relative)
            sha256, size = str(entry["sha256"]), int(entry["bytes"])
            if not re.fullmatch(r"[0-9a-f]{64}", sha256) or size < 0:
                raise ValueError(relative)
            checked[relative] = {"sha256": sha256, "bytes": size}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelStoreError(f"job {job_id}'s {MANIFEST} is not a manifest") from exc
    if not checked or len(checked) > MANIFEST_MAX_FILES:
        raise ModelStoreError(f"job {job_id}'s {MANIFEST} lists {len(checked)} files")
    return hashlib.sha256(body).hexdigest(), checked


def _download_model(job_id: int, files: dict[str, dict[str, Any]], into: Path) -> None:
    prefix = f"{job_prefix(job_id)}/model"
    for relative, entry in files.items():
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with (
                default_storage.open(f"{prefix}/{relative}", "rb") as src,
                open(target, "wb") as dst,
            ):
                sha256, size = _copy_hashing(src, dst, entry["bytes"])
        except (FileNotFoundError, OSError) as exc:
            raise ModelStoreError(
                f"job {job_id}'s model file {relative!r} is missing from storage"
            ) from exc
        if (sha256, size) != (entry["sha256"], entry["bytes"]):
            raise ModelStoreError(
                f"job {job_id}'s model file {relative!r} does not match its manifest "
                f"(sha256 {sha256[:12]}…, {size} bytes; expected {entry['sha256'][:12]}…, "
                f"{entry['bytes']} bytes)"
            )


def model_fetch(job_id: int) -> Path:
    """The job's model in the local cache, each file checked against its manifest."""
    manifest_sha, files = _read_manifest(job_id)
    need = sum(entry["bytes"] for entry in files.values())
    return _cached(f"model-{manifest_sha}", need, lambda into: _download_model(job_id, files, into))


# -- datasets -------------------------------------------------------------------------------


def dataset_fetch(version) -> Path:
    """A DatasetVersion's Hugging Face export, unzipped into the cache and checked.

    Returns the export's own directory (the zip's one top-level folder)."""
    expected = str(version.hf_sha256 or "")
    if not version.hf_file or not re.fullmatch(r"[0-9a-f]{64}", expected):
        raise ModelStoreError(f"dataset version {version.pk} has no Hugging Face export")
    root = _cached(
        f"dataset-{expected}",
        int(version.hf_bytes or 0),
        lambda into: _download_dataset(version, expected, into),
    )
    children = [p for p in root.iterdir() if p.name != _LAST_USED]
    return children[0] if len(children) == 1 and children[0].is_dir() else root


def _download_dataset(version, expected: str, into: Path) -> None:
    limit, what = cache_bytes(), f"dataset version {version.pk}'s export"
    with tempfile.TemporaryFile() as spool:
        try:
            with default_storage.open(version.hf_file.name, "rb") as source:
                sha256, size = _copy_hashing(source, spool, limit)
        except (FileNotFoundError, OSError) as exc:
            raise ModelStoreError(f"{what} file is missing from storage") from exc
        if size > limit:
            raise ModelStoreError(f"{what} is over {limit} bytes")
        if sha256 != expected:
            raise ModelStoreError(
                f"{what} does not match its sha256 ({sha256[:12]}…, expected {expected[:12]}…)"
            )
        spool.seek(0)
        try:
            _unzip(spool, into, limit)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
            raise ModelStoreError(f"{what} is not a zip") from exc


# -- the cache ------------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(settings.STUDIO_MODEL_CACHE_DIR)


def cache_bytes() -> int:
    return int(settings.STUDIO_MODEL_CACHE_BYTES)


def _entry_bytes(entry: Path) -> int:
    return sum(p.stat().st_size for p in entry.rglob("*") if p.is_file() and not p.is_symlink())


def _cached(key: str, need: int, fill) -> Path:
    """`cache/<key>`, filled by `fill(directory)` unless it is there already."""
    root = cache_dir()
    entry = root / key
    if (entry / _LAST_USED).exists():
        (entry / _LAST_USED).touch()
        return entry
    if need > cache_bytes():
        raise ModelStoreError(f"{key} needs {need} bytes, over STUDIO_MODEL_CACHE_BYTES")
    root.mkdir(parents=True, exist_ok=True)
    _evict(root, keep=cache_bytes() - need, spare=entry)
    work = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        fill(work)
        (work / _LAST_USED).touch()
        try:
            os.rename(work, entry)
        except OSError:
            # Another process filled it first: theirs is as good as ours.
            if not (entry / _LAST_USED).exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _evict(root, keep=cache_bytes(), spare=entry)
    return entry


def _evict(root: Path, keep: int, spare: Path) -> None:
    """Least recently used entries removed until the rest fit in `keep` bytes."""
    entries = []
    for entry in root.iterdir():
        if entry.name.startswith(".tmp-"):
            # What a process killed mid-fetch left behind; a live fetch is younger.
            if time.time() - entry.stat().st_mtime > _ABANDONED_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
            continue
        marker = entry / _LAST_USED
        if entry == spare or not marker.exists():
            continue
        entries.append((marker.stat().st_mtime, entry))
    used = sum(_entry_bytes(entry) for _, entry in entries)
    if (spare / _LAST_USED).exists():
        used += _entry_bytes(spare)
    for _, entry in sorted(entries, key=lambda item: item[0]):
        if used <= keep:
            break
        used -= _entry_bytes(entry)
        # Renamed first: a reader never sees an entry half removed as whole.
        doomed = root / f".tmp-evict-{entry.name}-{time.monotonic_ns()}"
        try:
            os.rename(entry, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
