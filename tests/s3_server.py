"""A real S3 API server on loopback for the tests (moto's server mode, a process of its own),
and a bucket each test's processes share, each process with its own empty media folder.

Started once per test module, as PostgreSQL and Redis are started by the fault tests; each
test gets a fresh bucket. The studio's processes reach it only through the S3 protocol: the
web (this process, its storage switched to the bucket) and workers (child processes given
`env`), never through a shared folder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "studio-test-key",
    "AWS_SECRET_ACCESS_KEY": "studio-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """`python -m moto.server` on a free loopback port, stopped by `stop`."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> S3Server:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto's server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/moto-api/", timeout=2):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's server never answered at {self.url}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )


@dataclass
class Bucket:
    """A bucket on the server, and how a process of the studio is pointed at it."""

    server: S3Server
    name: str
    scratch: Path

    @property
    def env(self) -> dict[str, str]:
        """The variables a studio process needs to use this bucket (docs/running-at-scale.md)."""
        return {
            "STUDIO_S3_BUCKET": self.name,
            "STUDIO_S3_ENDPOINT_URL": self.server.url,
            "STUDIO_S3_REGION": CREDENTIALS["AWS_DEFAULT_REGION"],
            **CREDENTIALS,
        }

    def media_root(self, who: str) -> Path:
        """An empty media folder of a process's own: nothing is shared through it."""
        folder = self.scratch / f"media-{who}"
        folder.mkdir(parents=True)
        return folder

    def keys(self, prefix: str = "") -> list[str]:
        client = self.server.client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.name, Prefix=prefix
        ):
            keys.extend(item["Key"] for item in page.get("Contents", ()))
        return sorted(keys)

    def read(self, key: str) -> bytes:
        return self.server.client().get_object(Bucket=self.name, Key=key)["Body"].read()

    def delete(self, key: str) -> None:
        self.server.client().delete_object(Bucket=self.name, Key=key)


def storages_for(bucket: Bucket, base: dict) -> dict:
    """Django's STORAGES as studio.settings makes them from `bucket.env`."""
    return {
        **base,
        "default": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": bucket.name,
                "endpoint_url": bucket.server.url,
                "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
                "file_overwrite": True,
                "default_acl": None,
                "querystring_auth": True,
                "max_memory_size": 10 * 1024 * 1024,
            },
        },
    }


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, settings, monkeypatch, tmp_path, media_storage) -> Bucket:
    """A new bucket; this process (the web) stores in it, with an empty media folder of its
    own. `media_storage` (conftest's local storage) is set first, then replaced here."""
    bucket = Bucket(server=s3_server, name=f"studio-{uuid.uuid4().hex[:12]}", scratch=tmp_path)
    s3_server.client().create_bucket(Bucket=bucket.name)
    for name, value in bucket.env.items():
        monkeypatch.setenv(name, value)
    web_root = str(bucket.media_root("web"))
    settings.STUDIO_MEDIA_ROOT = web_root
    settings.MEDIA_ROOT = web_root
    settings.STORAGES = storages_for(bucket, settings.STORAGES)
    assert not os.listdir(web_root)
    return bucket
