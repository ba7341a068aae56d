"""Fixtures for the rollouts tests: a real chat-completions server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollouts.tests.openai_server import ChatServer


@pytest.fixture
def chat_server(settings) -> Iterator[ChatServer]:
    """A scriptable OpenAI-compatible endpoint; retries back off in milliseconds, not seconds."""
    settings.STUDIO_OPENAI_BACKOFF_BASE = 0.01
    settings.STUDIO_OPENAI_BACKOFF_MAX = 0.05
    settings.OPENAI_API_KEY = ""
    server = ChatServer().start()
    yield server
    server.stop()
