"""The demo's broker: kombu's filesystem transport, each message written whole before any
worker can see it.

kombu creates a message's file under its final name and then writes it: a worker polling the
folder can move and read it in between, find it empty, and die of the JSONDecodeError
("Unrecoverable error"). The demo's worker did, mid-walkthrough, and every job after it waited
for nobody. Here a message is written under a name no worker reads (a worker takes the files
whose name ends with its queue's `.msg`), then renamed into place, atomically.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # kombu's name: the time first, so that workers take messages in order.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.writing"
        try:
            with open(partial, "wb", buffering=0) as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
