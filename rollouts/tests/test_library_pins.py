"""The process refuses to start on a crafter or opensimplex other than the pinned ones."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from rollouts.game.library_pins import LibraryMismatch, library_pins_check

ROOT = Path(__file__).resolve().parents[2]


def test_it_runs_on_the_installed_pinned_versions() -> None:
    # The literals, not PINNED_VERSIONS: a pin edited without re-testing shows up here.
    assert version("crafter") == "1.8.3"
    assert version("opensimplex") == "0.4.5.1"
    library_pins_check()


def test_it_names_every_wrong_or_missing_library() -> None:
    with pytest.raises(LibraryMismatch) as raised:
        library_pins_check(installed={"crafter": "1.8.4", "opensimplex": None})
    message = str(raised.value)
    assert "crafter 1.8.4 (need crafter==1.8.3)" in message
    assert "opensimplex not installed (need opensimplex==0.4.5.1)" in message


def test_it_refuses_to_start_with_another_crafter_installed(tmp_path) -> None:
    # A distribution earlier on sys.path is what importlib.metadata reports: a real
    # "crafter 1.9.0 is installed" as far as the start-up check can tell.
    dist = tmp_path / "crafter-1.9.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: crafter\nVersion: 1.9.0\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "SECRET_KEY": "test-only",
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode != 0
    assert "crafter 1.9.0 (need crafter==1.8.3)" in result.stderr
    assert "System check identified no issues" not in result.stdout
