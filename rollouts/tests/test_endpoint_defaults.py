"""An endpoint the environment names is said aloud, and no form or command picks one for its
user among several: calls sent there may be billed."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from probes.forms import ProbeRunForm
from rollouts.forms import BatchCreateForm
from rollouts.models import RolloutBatch
from studio.models import Endpoint

KEY = "sk-real-looking-key-0123456789"


@pytest.fixture
def key_in_environment(settings):
    settings.OPENAI_API_KEY = KEY
    settings.OPENAI_BASE_URL = ""
    settings.SYNTH_BACKEND_URL = ""
    Endpoint.objects.all().delete()


@pytest.mark.django_db
def test_migrate_says_in_one_line_which_endpoint_the_key_named(key_in_environment):
    out = io.StringIO()
    call_command("migrate", verbosity=0, stdout=out)
    assert out.getvalue().splitlines() == [
        "Named endpoint default → https://api.openai.com/v1 (chat, key from OPENAI_API_KEY), "
        "as OPENAI_API_KEY is set; change or disable it under /admin/."
    ]
    # Said once: the next start finds it named.
    again = io.StringIO()
    call_command("migrate", verbosity=0, stdout=again)
    assert again.getvalue() == ""


@pytest.mark.django_db
def test_the_demo_lists_its_endpoints_at_every_start(key_in_environment):
    Endpoint.objects.create(name="default", base_url="https://api.openai.com/v1",
                            api_key_env="OPENAI_API_KEY")  # fmt: skip
    RolloutBatch.objects.create(name="Demo: scripted baseline", policy="scripted")
    out = io.StringIO()
    call_command("demo_setup", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[-1] == (
        "Model endpoints: default → https://api.openai.com/v1 (chat, key from OPENAI_API_KEY); "
        "local → http://127.0.0.1:11434/v1 (chat, no key)"
    )
    assert KEY not in out.getvalue()


def _selected(form) -> str | None:
    return form["endpoint"].initial


@pytest.mark.django_db
@pytest.mark.parametrize("form_class", [BatchCreateForm, ProbeRunForm])
def test_a_form_preselects_the_one_chat_endpoint_and_none_of_two(form_class):
    Endpoint.objects.all().delete()
    Endpoint.objects.create(name="default", base_url="https://api.openai.com/v1")
    Endpoint.objects.create(name="synth", base_url="http://127.0.0.1:9/api", kind="synth")
    assert _selected(form_class()) == "default"
    assert 'value="default" selected' in str(form_class()["endpoint"])
    Endpoint.objects.create(name="local", base_url="http://127.0.0.1:11434/v1")
    assert _selected(form_class()) is None
    assert " selected" not in str(form_class()["endpoint"]).replace('value="" selected', "")


@pytest.mark.django_db
def test_rollout_without_an_endpoint_refuses_to_pick_one_of_two(key_in_environment):
    Endpoint.objects.create(name="local", base_url="http://127.0.0.1:11434/v1")
    err = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command(
            "rollout", "--policy=openai", "--model=gpt-4o-mini", "--seeds=0", "--steps=1",
            stderr=err,
        )  # fmt: skip
    assert raised.value.returncode == 2
    assert str(raised.value) == (
        "endpoint: 2 chat endpoints are named (default → https://api.openai.com/v1, "
        "local → http://127.0.0.1:11434/v1); choose one with --endpoint NAME, or give "
        "--base-url URL"
    )
    # The key's endpoint was named on the way, and said so.
    assert err.getvalue().splitlines() == [
        "Named endpoint default → https://api.openai.com/v1 (chat, key from OPENAI_API_KEY), "
        "as OPENAI_API_KEY is set; change or disable it under /admin/."
    ]
    assert not RolloutBatch.objects.exists()


@pytest.mark.django_db
def test_rollout_without_an_endpoint_uses_the_environments_when_it_is_the_only_one(
    key_in_environment,
):
    out = io.StringIO()
    call_command(
        "rollout", "--policy=openai", "--model=gpt-4o-mini", "--seeds=0", "--steps=1",
        stdout=out, stderr=io.StringIO(),
    )  # fmt: skip
    summary = json.loads(out.getvalue().splitlines()[-1])
    batch = RolloutBatch.objects.get(id=summary["batch_id"])
    assert (batch.endpoint_name, batch.endpoint) == ("default", "https://api.openai.com/v1")
