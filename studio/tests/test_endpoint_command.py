"""`manage.py endpoint`: names an endpoint with the admin's rules, lists them, never a key."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from studio.models import Endpoint
from studio.testing import manage, subprocess_env

KEY = "sk-endpoint-command-SECRET-7d2a"


def endpoint(*args: str) -> str:
    out = io.StringIO()
    call_command("endpoint", *args, stdout=out)
    return out.getvalue()


def last_line(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_it_creates_an_endpoint_then_updates_it(db):
    created = endpoint(
        "chat", "--kind", "chat", "--base-url", "http://127.0.0.1:8010/v1",
        "--key-env", "OPENAI_API_KEY",
    )  # fmt: skip
    assert last_line(created) == {
        "endpoint": "chat",
        "kind": "chat",
        "base_url": "http://127.0.0.1:8010/v1",
        "key_env": "OPENAI_API_KEY",
        "enabled": True,
        "created": True,
    }
    # What only the admin sets is kept by an update.
    Endpoint.objects.filter(name="chat").update(concurrency=9, allowed_models=["m-1"])

    updated = endpoint(
        "chat", "--kind", "openai", "--base-url", "https://train.example.com/v1",
        "--key-env", "TRAIN_API_KEY", "--disable",
    )  # fmt: skip
    assert last_line(updated) == {
        "endpoint": "chat",
        "kind": "openai",
        "base_url": "https://train.example.com/v1",
        "key_env": "TRAIN_API_KEY",
        "enabled": False,
        "created": False,
    }
    (row,) = Endpoint.objects.all()
    assert (row.kind, row.base_url, row.api_key_env, row.enabled) == (
        "openai",
        "https://train.example.com/v1",
        "TRAIN_API_KEY",
        False,
    )
    assert (row.concurrency, row.allowed_models) == (9, ["m-1"])


def test_it_lists_the_endpoints_and_whether_a_key_is_set_never_the_key(db, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("TRAIN_API_KEY", raising=False)
    endpoint("chat", "--kind", "chat", "--base-url", "http://127.0.0.1:8010/v1",
             "--key-env", "OPENAI_API_KEY")  # fmt: skip
    endpoint("trainer", "--kind", "openai", "--base-url", "http://127.0.0.1:8011/v1",
             "--key-env", "TRAIN_API_KEY", "--disable")  # fmt: skip
    endpoint("local", "--kind", "chat", "--base-url", "http://127.0.0.1:8012/v1")

    listed = endpoint("--list").splitlines()
    assert [line.split() for line in listed] == [
        ["NAME", "KIND", "ENABLED", "KEY", "VARIABLE", "KEY", "BASE", "URL"],
        ["chat", "chat", "yes", "OPENAI_API_KEY", "set", "http://127.0.0.1:8010/v1"],
        ["local", "chat", "yes", "-", "-", "http://127.0.0.1:8012/v1"],
        ["trainer", "openai", "no", "TRAIN_API_KEY", "not", "set", "http://127.0.0.1:8011/v1"],
    ]
    assert KEY not in "\n".join(listed)


def test_it_lists_a_url_written_around_the_rules_without_obeying_it(db):
    # Straight into the database, past the URL check: the terminal shows it, never runs it.
    Endpoint.objects.create(name="odd", base_url="http://odd.example/\x1b]0;owned\x07\x1b[2J")
    listed = endpoint("--list")
    assert "\x1b" not in listed and "\x07" not in listed
    assert "http://odd.example/\\x1b]0;owned\\x07\\x1b[2J" in listed


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("--base-url", "http://127.0.0.1:8010/v1", "--key-env", "SECRET_KEY"),
            "--key-env: Not allowed as a key variable",
        ),
        (
            ("--base-url", "http://127.0.0.1:8010/v1", "--key-env", "sk-live-a1b2c3"),
            "--key-env: An environment variable name",
        ),
        (("--base-url", "file:///etc/passwd"), "--base-url: Enter a valid URL"),
        (("--base-url", "not a url"), "--base-url: Enter a valid URL"),
    ],
)
def test_it_refuses_what_the_admin_refuses_and_writes_nothing(db, args, said):
    with pytest.raises(CommandError) as refused:
        call_command("endpoint", "chat", "--kind", "chat", *args, stdout=io.StringIO())
    assert refused.value.returncode == 2
    assert str(refused.value).startswith(said)
    assert not Endpoint.objects.exists()


def test_it_keeps_an_endpoint_as_it_was_when_an_update_is_refused(db):
    endpoint("chat", "--kind", "chat", "--base-url", "http://127.0.0.1:8010/v1")
    with pytest.raises(CommandError):
        call_command(
            "endpoint", "chat", "--kind", "chat", "--base-url", "http://127.0.0.1:9/v1",
            "--key-env", "DATABASE_URL", stdout=io.StringIO(),
        )  # fmt: skip
    row = Endpoint.objects.get()
    assert (row.base_url, row.api_key_env) == ("http://127.0.0.1:8010/v1", "")


def test_it_says_a_refusal_in_one_line_on_stderr(transactional_db):
    done = manage(
        "endpoint", "chat", "--kind", "chat", "--base-url", "http://127.0.0.1:8010/v1",
        "--key-env", "DEMO_PASSWORD", env=subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--key-env: Not allowed as a key variable" in done.stderr
    assert done.stdout == ""
    assert not Endpoint.objects.exists()
    unknown = manage("endpoint", "chat", "--kind", "vllm", "--base-url", "http://a.example",
                     env=subprocess_env())  # fmt: skip
    assert unknown.returncode == 2
    assert "argument --kind: invalid choice: 'vllm'" in unknown.stderr
