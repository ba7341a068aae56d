"""An export never replaces what is already at its output unless asked: `export_jsonl` refuses
an existing file (the validation file too), `export_hf` a directory that holds something; one
line on stderr, exit 2, nothing written. `--force` replaces them."""

from __future__ import annotations

from pathlib import Path

import pytest

from curation.tests.conftest import record, run
from studio.testing import manage, subprocess_env

pytestmark = pytest.mark.django_db


@pytest.fixture
def folder(tmp_path) -> Path:
    """Where the exports go (the test's media root is beside it, in `tmp_path`)."""
    path = tmp_path / "exports"
    path.mkdir()
    return path


def _files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_export_jsonl_refuses_an_existing_output_with_one_line_and_exit_2(db, folder):
    out = folder / "rows.jsonl"
    out.write_text("last week's export\n")
    done = manage("export_jsonl", "--output", str(out), "--allow-empty", env=subprocess_env())
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"export_jsonl: error: output: {str(out)!r} already exists; pass --force to overwrite it"
    ]
    assert done.stdout == ""
    assert out.read_text() == "last week's export\n"
    assert sorted(p.name for p in folder.iterdir()) == ["rows.jsonl"]


def test_export_jsonl_refuses_an_existing_validation_file(db, folder):
    batch = record(seeds=(3, 4), steps=3)
    out, val = folder / "rows.jsonl", folder / "rows.val.jsonl"
    val.write_text("kept\n")
    done = run(
        "export_jsonl", "--output", str(out), "--batch", str(batch.id), "--val-fraction", "0.5"
    )
    assert done.code == 2
    assert f"val-output: {str(val)!r} already exists; pass --force" in done.stderr
    assert not out.exists() and val.read_text() == "kept\n"


def test_export_jsonl_force_overwrites_with_what_a_new_file_would_hold(db, folder):
    batch = record(seeds=(3,), steps=4)
    fresh, old = folder / "fresh.jsonl", folder / "old.jsonl"
    assert run("export_jsonl", "--output", str(fresh), "--batch", str(batch.id)).code == 0
    old.write_text("last week's export\n")

    forced = run("export_jsonl", "--output", str(old), "--batch", str(batch.id), "--force")
    assert forced.code == 0, forced.stderr
    assert old.read_bytes() == fresh.read_bytes()
    assert forced.summary["rows"] == 4 and forced.summary["path"] == str(old)
    # No temporary file is left beside it.
    assert sorted(p.name for p in folder.iterdir()) == ["fresh.jsonl", "old.jsonl"]


def test_export_hf_refuses_a_folder_that_holds_something_and_force_replaces_it(db, folder):
    batch = record(seeds=(3,), steps=4)
    fresh, old = folder / "fresh", folder / "old"
    assert run("export_hf", "--output", str(fresh), "--batch", str(batch.id)).code == 0
    old.mkdir()
    (old / "notes.txt").write_text("mine\n")

    # (A child process: it sees no batch this test's transaction holds; every turn, then.)
    refused = manage("export_hf", "--output", str(old), env=subprocess_env())
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"export_hf: error: output: {str(old)!r} exists and is not an empty directory; "
        "pass --force to replace it"
    ]
    assert _files(old) == {"notes.txt": b"mine\n"}

    forced = run("export_hf", "--output", str(old), "--batch", str(batch.id), "--force")
    assert forced.code == 0, forced.stderr
    # The folder holds the new dataset only, byte for byte what a new folder gets.
    assert _files(old) == _files(fresh)
    assert forced.summary["path"] == str(old) and forced.summary["rows"] == 4
    assert sorted(p.name for p in folder.iterdir()) == ["fresh", "old"]


def test_export_hf_force_keeps_the_old_folder_when_the_export_fails(db, folder):
    batch = record(seeds=(3,), steps=2)
    old = folder / "old"
    old.mkdir()
    (old / "notes.txt").write_text("mine\n")
    # Nothing matches: the export stops (exit 1) before anything replaces the folder.
    failed = run(
        "export_hf", "--output", str(old), "--batch", str(batch.id), "--min-reward", "1000",
        "--force",
    )  # fmt: skip
    assert failed.code == 1 and "nothing written" in failed.stderr
    assert _files(old) == {"notes.txt": b"mine\n"}
    assert sorted(p.name for p in folder.iterdir()) == ["old"]
