"""Reads an `export_hf` directory with the real Hugging Face `datasets` library, offline.

The library runs in a child process started in the project folder (with its own offline
`HF_HOME`): `import datasets` there is Hugging Face's library, not the studio's app (whose
package is `curation`). It prints JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import hashlib, json, sys
import numpy as np
import datasets

assert "site-packages" in datasets.__file__, datasets.__file__
directory, columns = sys.argv[1], sys.argv[2].split(",")

def describe(dataset_dict):
    out = {}
    for split, ds in dataset_dict.items():
        rows = []
        for row in ds:
            item = {"pixels": [hashlib.sha256(np.asarray(im.convert("RGB")).tobytes()).hexdigest()
                               + f":{im.size[0]}x{im.size[1]}" for im in row["images"]]}
            for key in columns:
                item[key] = row.get(key)
            rows.append(item)
        out[split] = {"rows": rows, "features": {k: repr(v) for k, v in ds.features.items()}}
    return out

parquet = datasets.load_dataset("parquet", data_dir=directory)
on_disk = datasets.load_from_disk(directory)
# The card's `dataset_info` block, read as the Hub reads it.
from huggingface_hub import DatasetCard
from datasets.info import DatasetInfosDict
card = DatasetInfosDict.from_dataset_card_data(DatasetCard.load(directory + "/README.md").data)
card_info = card["default"]
print(json.dumps({
    "parquet": describe(parquet),
    "disk": describe(on_disk),
    "card": {
        "features": {k: repr(v) for k, v in card_info.features.items()},
        "splits": {k: v.num_examples for k, v in card_info.splits.items()},
    },
}))
"""


def read_hf(directory: Path, columns: tuple[str, ...], workdir: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(workdir / "hf-home"),
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    }
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(directory), ",".join(columns)],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def val_fraction_between(batch_id: int, seeds: tuple[int, ...]) -> float:
    """A validation fraction that sends some of these episodes to each split, from the
    documented rule (sha256 of "batch:seed", first 8 bytes as a fraction), whatever the id."""
    fractions = sorted(
        int.from_bytes(hashlib.sha256(f"{batch_id}:{seed}".encode()).digest()[:8], "big") / 2**64
        for seed in seeds
    )
    middle = len(fractions) // 2
    return (fractions[middle - 1] + fractions[middle]) / 2
