"""The demo's filesystem broker: a worker never reads a message half written."""

from __future__ import annotations

import json
import threading
from queue import Empty

from kombu import Connection

from studio.filesystem_broker import Transport

MESSAGES = 3000


def test_it_never_hands_a_worker_a_message_half_written(tmp_path):
    # Stock kombu wrote under the final name: a reader polling meanwhile read some messages
    # empty (51 of 3,000 here), each a JSONDecodeError that stops a worker for good.
    options = {
        "data_folder_in": str(tmp_path),
        "data_folder_out": str(tmp_path),
        "processed_folder": str(tmp_path),
        "control_folder": str(tmp_path),
        "store_processed": False,
    }
    body = "x" * 20_000  # a write long enough to be caught in the middle
    read: list[int] = []
    undecodable: list[Exception] = []

    def connection() -> Connection:
        return Connection("filesystem://localhost/", transport=Transport, transport_options=options)

    def write() -> None:
        with connection() as conn:
            for i in range(MESSAGES):
                conn.default_channel._put("celery", {"i": i, "body": body})

    def take() -> None:
        with connection() as conn:
            while len(read) + len(undecodable) < MESSAGES:
                try:
                    read.append(conn.default_channel._get("celery")["i"])
                except json.JSONDecodeError as exc:
                    undecodable.append(exc)
                except Empty:
                    pass

    taker = threading.Thread(target=take)
    taker.start()
    write()
    taker.join(timeout=60)
    assert undecodable == []
    assert sorted(read) == list(range(MESSAGES))
