"""An upload handler that stops an upload once it passes the limit, while it streams in."""

from __future__ import annotations

from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest


class SizeLimitedUpload(FileUploadHandler):
    """Counts file bytes as they arrive; past `limit` the upload stops and nothing is kept.

    It sits first in the chain, so the handlers that store the file never see the bytes
    past the limit. `request.upload_too_large` tells the view why the file is missing.
    """

    # The parser reads the body in chunks of the smallest handler's size: small chunks stop
    # the upload soon after the limit, and never wait for bytes far past it.
    chunk_size = 16 * 1024

    def __init__(self, request: HttpRequest, *, limit: int) -> None:
        super().__init__(request)
        self.limit = limit
        self.received = 0
        request.upload_too_large = False  # type: ignore[attr-defined]

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > self.limit:
            self.request.upload_too_large = True  # type: ignore[attr-defined]
            # Stop reading: the rest of the body is never read, let alone stored.
            raise StopUpload(connection_reset=True)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None
