"""The export's output files: every row in order with its hash, whole or not at all."""

from __future__ import annotations

import errno
import hashlib
import resource
import signal

import pytest

from curation.exporting.files import FLUSH_CHARS, OutputFiles


def test_the_file_holds_every_row_in_order_with_its_hash(tmp_path):
    target = tmp_path / "rows.jsonl"
    files = OutputFiles(output=target, val_output=None)
    rows = [f'{{"row": {i}, "pad": "{"x" * (i % 5000)}"}}\n' for i in range(3_000)]
    for i, row in enumerate(rows):
        files.sinks["train"].add(row, episode_id=i // 100, images=1)
    files.commit()
    data = target.read_bytes()
    assert data == "".join(rows).encode()
    assert len(data) > 4 * FLUSH_CHARS  # several buffers flushed
    assert files.result.train.sha256 == hashlib.sha256(data).hexdigest()
    assert (files.result.train.rows, files.result.train.episodes) == (3_000, 30)
    assert files.result.train.bytes == len(data)
    assert [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_a_write_that_fails_fails_the_export_and_leaves_nothing(tmp_path):
    # A file size limit makes the kernel refuse writes past 2 MB (EFBIG), as a full disk
    # refuses them (ENOSPC); SIGXFSZ, which would end the process, is ignored meanwhile.
    files = OutputFiles(output=tmp_path / "rows.jsonl", val_output=None)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 * FLUSH_CHARS, hard))
    try:
        with pytest.raises(OSError) as failure:
            for i in range(10_000):
                files.sinks["train"].add("x" * 999 + "\n", episode_id=i, images=0)
            files.commit()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert failure.value.errno == errno.EFBIG
    files.discard()
    assert list(tmp_path.iterdir()) == []
