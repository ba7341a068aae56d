"""Hugging Face `datasets` output: parquet shards, Arrow shards and a dataset card. No Django.

The input is this studio's own JSONL (SFT rows of docs/formats.md, or the preference rows of
`curation.preferences`), read one line at a time; the output loads offline both with
`datasets.load_dataset("parquet", data_dir=DIR)` and `datasets.load_from_disk(DIR)`:

    DIR/README.md                                  dataset card (YAML `dataset_info`, `configs`)
    DIR/data/{split}-00000-of-0000N.parquet        the Hub's layout, images embedded as bytes
    DIR/dataset_dict.json                          `load_from_disk`'s layout:
    DIR/{split}/data-00000-of-0000N.arrow            Arrow stream shards,
    DIR/{split}/dataset_info.json, state.json        their features and state

Columns follow TRL's vision formats: `images` (a list of Image, the stored PNG bytes) and chat
messages whose image parts are `{"type": "image"}` placeholders, one per image, in order:
`prompt` and `completion` for SFT rows, `prompt`, `chosen` and `rejected` for preference rows;
`tools` is the tool schema as JSON text; metadata columns follow.

Our Django app is also called `datasets`, so the library is never imported here: the files are
written with pyarrow, with the feature metadata (`huggingface` schema key) the library writes.
Rows are buffered a row group at a time and shards are cut by size, so memory stays flat
whatever the size of the export. The same input gives the same bytes.
"""

from curation.hf_export.rows import HFExportError
from curation.hf_export.writing import SHARD_BYTES, HFResult, write_hf_dataset, zip_directory

__all__ = ["SHARD_BYTES", "HFExportError", "HFResult", "write_hf_dataset", "zip_directory"]
