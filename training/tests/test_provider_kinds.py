"""A training provider is one declaration: a throwaway one, registered here, shows in the
job form, `submit_training --provider`, the choice lists of jobs and endpoints and the
new-job page; its files are uploaded in the row format it names. No migration is needed."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from django.core.management import call_command, get_commands, load_command_class

from studio.models import Endpoint, endpoint_kind_choices
from training import providers
from training.config import ConfigError, Key, config_load
from training.forms import TrainingJobForm
from training.models import TrainingJob
from training.providers import ProviderKind
from training.providers.synth import SynthProvider
from training.submission import SubmissionError
from training.tests.conftest import REFERENCE
from training.tests.test_submit import _submission
from training.upload_files import upload_file_build

THROWAWAY = ProviderKind(
    name="testprov",
    client=SynthProvider,
    key_env="TESTPROV_API_KEY",
    default_url=lambda: "",
    url_setting="TESTPROV_BASE_URL",
    row_format="synth",
    endpoint_kind="testprov",
    endpoint_label="Training: a throwaway test provider",
    config_keys={"hyperparameters": {"testprov_rate": Key("float", min=0.0, max=1.0)}},
)


@pytest.fixture
def testprov() -> Iterator[ProviderKind]:
    providers.register(THROWAWAY)
    try:
        yield THROWAWAY
    finally:
        providers.unregister(THROWAWAY.name)


def _submit_training_help() -> str:
    command = load_command_class(get_commands()["submit_training"], "submit_training")
    return " ".join(command.create_parser("manage.py", "submit_training").format_help().split())


def test_the_form_command_and_choice_lists_offer_it(db, testprov):
    assert ("testprov", "testprov") in list(TrainingJobForm().fields["provider"].choices)
    assert "{synth,openai,trl,testprov}" in _submit_training_help()
    assert ("testprov", "Testprov") in TrainingJob._meta.get_field("provider").choices
    assert ("testprov", "Training: a throwaway test provider") in endpoint_kind_choices()


def test_the_new_job_page_offers_it_and_its_endpoints(client, submitter, testprov):
    Endpoint.objects.create(name="test-trainer", kind="testprov", base_url="http://127.0.0.1:9")
    client.force_login(submitter)
    page = client.get("/training/new/").content.decode()
    assert 'value="testprov"' in page
    assert 'value="test-trainer"' in page and 'data-kind="testprov"' in page


def test_it_needs_no_migration(db, testprov):
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_a_missing_default_url_names_its_setting(train_version, testprov):
    with pytest.raises(SubmissionError) as caught:
        _submission(train_version, "testprov", "")
    assert caught.value.lines == [
        "base URL: give --base-url or set TESTPROV_BASE_URL for the testprov provider"
    ]


def test_its_files_are_in_the_row_format_it_names(train_version, testprov, tmp_path):
    built = upload_file_build(
        version=train_version, provider="testprov", role="train", directory=tmp_path, label="t"
    )
    rows = [json.loads(line) for line in built.path.read_text().splitlines()]
    assert rows and all("metadata" in row for row in rows)  # synth keeps metadata
    assert all("name" in tool for row in rows for tool in row["tools"])  # flat tools


def _with_own_key() -> str:
    return REFERENCE.read_text().replace(
        "[hyperparameters]\n", "[hyperparameters]\ntestprov_rate = 0.5\n", 1
    )


def test_the_config_accepts_its_own_keys(testprov):
    assert config_load(_with_own_key()).get("hyperparameters", "testprov_rate") == 0.5


def test_it_is_gone_once_unregistered(db):
    with pytest.raises(ConfigError, match="testprov_rate"):
        config_load(_with_own_key())
    assert "testprov" not in providers.provider_names()
    assert "testprov" not in _submit_training_help()
    assert "testprov" not in dict(endpoint_kind_choices())
