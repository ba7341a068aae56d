"""Fixtures shared by every app's tests: storage, personas, a real Celery worker."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Permission, User

from rollouts.tests.openai_server import ChatServer
from studio.testing import celery_worker_running


@pytest.fixture(autouse=True)
def media_storage(settings, tmp_path) -> str:
    """Each test writes frames and exports under its own temporary media root."""
    root = str(tmp_path / "media")
    settings.STUDIO_MEDIA_ROOT = root
    settings.MEDIA_ROOT = root
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": root},
        },
    }
    return root


@pytest.fixture(autouse=True)
def cache_of_its_own(settings) -> str:
    """Each test its own keys in the shared (Redis) cache: ids restart with each test
    database, and an entry a former run left under the same key must not be found.
    Returns the key prefix (a subprocess given it as STUDIO_CACHE_PREFIX shares the cache)."""
    prefix = f"studio-test-{uuid.uuid4().hex}"
    settings.CACHES = {
        name: {**options, "KEY_PREFIX": prefix} for name, options in settings.CACHES.items()
    }
    # Short-lived: a test's entries are not left in Redis for a week.
    settings.STUDIO_STATISTICS_CACHE_SECONDS = 600
    return prefix


@pytest.fixture
def viewer(db) -> User:
    return User.objects.create_user("viewer", password="viewer-pass-123")


@pytest.fixture
def editor(db) -> User:
    user = User.objects.create_user("editor", password="editor-pass-123")
    user.user_permissions.add(Permission.objects.get(codename="review_turn"))
    return user


@pytest.fixture
def admin_user(db) -> User:
    return User.objects.create_superuser("admin", password="admin-pass-123")


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture
def editor_client(client, editor):
    client.force_login(editor)
    return client


@pytest.fixture
def chat_server(settings) -> Iterator[ChatServer]:
    """A scriptable OpenAI-compatible endpoint; retries back off in milliseconds, not seconds."""
    settings.STUDIO_OPENAI_BACKOFF_BASE = 0.01
    settings.STUDIO_OPENAI_BACKOFF_MAX = 0.05
    settings.OPENAI_API_KEY = ""
    server = ChatServer().start()
    yield server
    server.stop()


CHAT_KEY_VARIABLE = "STUDIO_TEST_CHAT_KEY"


@pytest.fixture
def chat_endpoint(db, chat_server, monkeypatch):
    """An admin-named endpoint for the local chat server, its key in `STUDIO_TEST_CHAT_KEY`."""
    from studio.models import Endpoint

    monkeypatch.setenv(CHAT_KEY_VARIABLE, "sk-test-endpoint-key-0123456789")
    return Endpoint.objects.create(
        name="local-test", base_url=chat_server.url, api_key_env=CHAT_KEY_VARIABLE
    )


@pytest.fixture
def celery_worker(transactional_db, settings) -> Iterator[object]:
    """A real Celery worker, in threads of this process, consuming from the real broker.

    Needs `transactional_db`: the worker's connection must see what the test committed.
    """
    with celery_worker_running() as worker:
        yield worker


class BrokerSwitch:
    """Points this process's senders at a closed port (`down`) and back (`up`).

    The worker of `celery_worker` keeps its own connection: what is tested is the sending
    side, the web request, the command or the requeue, finding the broker gone.
    """

    def __init__(self, app, url: str) -> None:
        self.app, self.url = app, url

    def _point(self, url: str) -> None:
        app = self.app
        app.conf.broker_url = app.conf.broker_write_url = url
        from kombu import pools

        pools.reset()  # kombu keeps pools per URL, process-wide
        app._pool = None
        app.amqp._producer_pool = None

    def down(self) -> None:
        import socket

        with socket.socket() as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self._point(f"redis://127.0.0.1:{port}/0")

    def up(self) -> None:
        self._point(self.url)


@pytest.fixture
def broker_switch(celery_worker) -> Iterator[BrokerSwitch]:
    from studio.celery import app

    switch = BrokerSwitch(app, os.environ["CELERY_BROKER_URL"])
    yield switch
    switch.up()
