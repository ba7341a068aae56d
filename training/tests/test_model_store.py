"""training.model_store through the real file storage: round trips, tampering, the cache bound."""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from training import model_store
from training.model_store import ModelStoreError


@pytest.fixture(autouse=True)
def cache(settings, tmp_path) -> Path:
    settings.STUDIO_MODEL_CACHE_DIR = tmp_path / "cache"
    settings.STUDIO_MODEL_CACHE_BYTES = 10 * 1024 * 1024
    return tmp_path / "cache"


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(body)
    return root


def contents(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != ".last-used"
    }


def replace_stored(name: str, body: bytes) -> None:
    default_storage.delete(name)
    assert default_storage.save(name, ContentFile(body)) == name


MODEL = {
    "config.json": b'{"model_type": "qwen2_vl"}',
    "model.safetensors": os.urandom(5000),
    "tokenizer/vocab.json": b'{"a": 1}',
}


def test_checkpoint_round_trip_keeps_only_the_latest(tmp_path):
    assert model_store.checkpoint_fetch(7, tmp_path / "none") is None
    first = tree(tmp_path / "c10", {"trainer_state.json": b'{"step": 10}', "w.bin": b"x" * 100})
    second = tree(tmp_path / "c20", {"trainer_state.json": b'{"step": 20}', "sub/w.bin": b"y" * 9})
    model_store.checkpoint_upload(7, 10, first)
    model_store.checkpoint_upload(7, 20, second)
    assert default_storage.listdir("training/trl/job-7/checkpoints")[1] == ["step-00000020.zip"]
    step, path = model_store.checkpoint_fetch(7, tmp_path / "resume")
    assert step == 20
    assert path == tmp_path / "resume" / "checkpoint-20"
    assert contents(path) == {"trainer_state.json": b'{"step": 20}', "sub/w.bin": b"y" * 9}


def test_a_checkpoint_cut_short_is_passed_over_for_the_one_before(tmp_path):
    model_store.checkpoint_upload(3, 5, tree(tmp_path / "c5", {"a.txt": b"five"}))
    # A save interrupted before the older one was deleted: a newer, truncated zip.
    replace_stored("training/trl/job-3/checkpoints/step-00000009.zip", b"PK\x03\x04 cut")
    step, path = model_store.checkpoint_fetch(3, tmp_path / "resume")
    assert (step, contents(path)) == (5, {"a.txt": b"five"})


def test_model_round_trip_and_manifest(tmp_path):
    sha = model_store.model_upload(11, tree(tmp_path / "model", MODEL))
    with default_storage.open("training/trl/job-11/model/manifest.json", "rb") as fh:
        body = fh.read()
    assert sha == hashlib.sha256(body).hexdigest()
    listed = json.loads(body)["files"]
    assert listed == {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        for name, data in MODEL.items()
    }
    fetched = model_store.model_fetch(11)
    assert contents(fetched) == MODEL
    assert model_store.model_fetch(11) == fetched


@pytest.mark.parametrize("damage", ["altered", "missing", "longer"])
def test_a_damaged_model_file_is_one_clear_error(tmp_path, damage):
    model_store.model_upload(12, tree(tmp_path / "model", MODEL))
    name = "training/trl/job-12/model/model.safetensors"
    if damage == "missing":
        default_storage.delete(name)
    else:
        body = bytearray(MODEL["model.safetensors"])
        body[100] ^= 1
        replace_stored(name, bytes(body) + (b"more" if damage == "longer" else b""))
    with pytest.raises(ModelStoreError, match=r"job 12's model file 'model.safetensors'") as info:
        model_store.model_fetch(12)
    assert ("missing" in str(info.value)) == (damage == "missing")
    # Nothing half fetched is left as a cache entry.
    assert [p.name for p in model_store.cache_dir().iterdir() if not p.name.startswith(".")] == []


def test_no_model_stored_and_a_hostile_manifest_are_refused(tmp_path):
    with pytest.raises(ModelStoreError, match="job 13 has no stored model"):
        model_store.model_fetch(13)
    replace_stored(
        "training/trl/job-13/model/manifest.json",
        json.dumps({"files": {"../../escape": {"sha256": "0" * 64, "bytes": 1}}}).encode(),
    )
    with pytest.raises(ModelStoreError, match="climbs out"):
        model_store.model_fetch(13)


def test_the_cache_keeps_within_its_bound_evicting_the_least_recently_used(settings, tmp_path):
    settings.STUDIO_MODEL_CACHE_BYTES = 2500
    for job in (1, 2, 3):
        model_store.model_upload(job, tree(tmp_path / f"m{job}", {"w.bin": os.urandom(1000)}))
    first = model_store.model_fetch(1)
    second = model_store.model_fetch(2)
    os.utime(first / ".last-used", (1, 1))
    os.utime(second / ".last-used", (2, 2))
    model_store.model_fetch(1)  # used again: now the most recent of the two
    third = model_store.model_fetch(3)
    assert first.exists() and third.exists() and not second.exists()
    used = sum(p.stat().st_size for p in model_store.cache_dir().rglob("*") if p.is_file())
    assert used <= 2500
    # One model larger than the whole cache is refused, not fetched.
    model_store.model_upload(4, tree(tmp_path / "m4", {"w.bin": os.urandom(3000)}))
    with pytest.raises(ModelStoreError, match="over STUDIO_MODEL_CACHE_BYTES"):
        model_store.model_fetch(4)


def stored_zip(name: str, entries: dict[str, bytes]) -> SimpleNamespace:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for entry, body in entries.items():
            archive.writestr(entry, body)
    body = buffer.getvalue()
    replace_stored(name, body)
    return SimpleNamespace(
        pk=99,
        hf_file=SimpleNamespace(name=name),
        hf_sha256=hashlib.sha256(body).hexdigest(),
        hf_bytes=len(body),
    )


def test_dataset_fetch_of_a_real_export(train_version):
    path = model_store.dataset_fetch(train_version)
    assert path.name == f"crafter-train-v{train_version.number}-hf"
    with (
        default_storage.open(train_version.hf_file.name, "rb") as fh,
        zipfile.ZipFile(fh) as archive,
    ):
        expected = {
            i.filename.split("/", 1)[1]: archive.read(i)
            for i in archive.infolist()
            if not i.is_dir()
        }
    assert contents(path) == expected
    assert model_store.dataset_fetch(train_version) == path


@pytest.mark.parametrize("entry", ["../escape.txt", "/etc/escape.txt", "a/../../escape.txt"])
def test_dataset_zip_entries_that_climb_out_are_refused(tmp_path, entry):
    version = stored_zip("exports/hostile.hf.zip", {"ok/data.txt": b"fine", entry: b"evil"})
    with pytest.raises(ModelStoreError, match="climbs out"):
        model_store.dataset_fetch(version)
    assert not list(tmp_path.rglob("escape.txt"))


def test_dataset_whose_bytes_do_not_match_its_sha256_is_refused():
    version = stored_zip("exports/ok.hf.zip", {"d/data.txt": b"fine"})
    version.hf_sha256 = "f" * 64
    with pytest.raises(ModelStoreError, match="does not match its sha256"):
        model_store.dataset_fetch(version)


def test_dataset_zip_links_and_oversized_contents_are_refused(settings):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        link = zipfile.ZipInfo("d/passwd")
        link.external_attr = (0o120777) << 16  # a symbolic link, to /etc/passwd
        archive.writestr(link, "/etc/passwd")
    replace_stored("exports/link.hf.zip", buffer.getvalue())
    version = SimpleNamespace(
        pk=98,
        hf_file=SimpleNamespace(name="exports/link.hf.zip"),
        hf_sha256=hashlib.sha256(buffer.getvalue()).hexdigest(),
        hf_bytes=len(buffer.getvalue()),
    )
    with pytest.raises(ModelStoreError, match="a link"):
        model_store.dataset_fetch(version)
    # Compressed small, unpacked over the cache's bound: refused before it is written.
    settings.STUDIO_MODEL_CACHE_BYTES = 100_000
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("d/zeros.bin", b"\0" * 1_000_000)
    assert len(buffer.getvalue()) < 100_000
    replace_stored("exports/bomb.hf.zip", buffer.getvalue())
    version.hf_file.name = "exports/bomb.hf.zip"
    version.hf_sha256 = hashlib.sha256(buffer.getvalue()).hexdigest()
    version.hf_bytes = len(buffer.getvalue())
    with pytest.raises(ModelStoreError, match="1000000 bytes unpacked"):
        model_store.dataset_fetch(version)
    assert not list(model_store.cache_dir().rglob("zeros.bin"))
