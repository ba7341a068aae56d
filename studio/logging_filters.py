"""Logging filters: a client error is one line in the log, not a traceback, not twice."""

from __future__ import annotations

import logging

from studio.untrusted import terminal_safe


class ClientErrorWithoutTraceback(logging.Filter):
    """`django.request` attaches the Http404 / PermissionDenied exception to its 4xx warning;
    a client asking for a missing or forbidden page is not a bug to debug: keep the line."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = None
            record.exc_text = None
        return True


class DropClientErrors(logging.Filter):
    """The development server's access line for a 4xx repeats what `django.request` said."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        return not (isinstance(status, int) and 400 <= status < 500)


class EscapeControlCharacters(logging.Filter):
    """A log line may quote a provider or a model: its control characters are escaped, so
    reading the log in a terminal runs none of them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        safe = terminal_safe(message, keep_lines=True)
        if safe != message:
            record.msg, record.args = safe, None
        return True
