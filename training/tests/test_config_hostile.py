"""A TOML nesting bomb is one config error, never a traceback.

400 inline tables inside one another (2.4 KB) were a RecursionError out of tomllib: a 500
on /training/new/ and a traceback from `submit_training`.
"""

from __future__ import annotations

import pytest

from curation.tests.conftest import run
from studio.models import Endpoint
from training.config import MAX_NESTING, ConfigError, config_load
from training.models import TrainingJob
from training.tests.conftest import REFERENCE
from training.tests.test_views import form_data

DEPTH = 400
TABLES = "a = " + "{b = " * DEPTH + "1" + "}" * DEPTH
ARRAYS = "a = " + "[" * DEPTH + "1" + "]" * DEPTH
TOO_DEEP = f"nesting deeper than {MAX_NESTING} levels"


def _in_reference(bomb: str) -> tuple[str, int]:
    """The reference config with the bomb as a key of [hyperparameters], and its line."""
    text = REFERENCE.read_text()
    marker = "learning_rate = 1e-5"
    line = text[: text.index(marker)].count("\n") + 1
    return text.replace(marker, bomb.replace("a = ", "learning_rate = ", 1)), line


@pytest.mark.parametrize("bomb", [TABLES, ARRAYS], ids=["tables", "arrays"])
def test_config_load_refuses_a_nesting_bomb_in_one_line(bomb):
    with pytest.raises(ConfigError) as refused:
        config_load(bomb)
    assert refused.value.lines() == [f"config (line 1): {TOO_DEEP}"]
    text, line = _in_reference(bomb)
    with pytest.raises(ConfigError) as refused:
        config_load(text)
    assert refused.value.lines() == [f"config (line {line}): {TOO_DEEP}"]


def test_it_reads_nesting_up_to_the_limit_and_brackets_in_strings_and_comments():
    inner = "[" * MAX_NESTING + "1" + "]" * MAX_NESTING
    with pytest.raises(ConfigError) as refused:
        config_load(_in_reference(f"a = {inner}")[0])
    assert TOO_DEEP not in str(refused.value)  # a type error of learning_rate, not depth
    quoted = "[" * DEPTH + "{" * DEPTH
    for text in (
        f'a = "{quoted}"',
        f"a = '{quoted}'",
        f'a = """\n{quoted}\n"""',
        f"a = '''\n{quoted}\n'''",
        f'a = "\\"{quoted}"',
        f"# {quoted}\na = 1",
    ):
        with pytest.raises(ConfigError) as refused:
            config_load(text)
        assert TOO_DEEP not in str(refused.value), text[:20]
    assert config_load(REFERENCE.read_text()).model


@pytest.mark.parametrize("bomb", [TABLES, ARRAYS], ids=["tables", "arrays"])
def test_submit_training_exits_2_with_one_line_for_a_nesting_bomb(bomb, tmp_path, train_version):
    text, line = _in_reference(bomb)
    config = tmp_path / "bomb.toml"
    config.write_text(text)
    outcome = run(
        "submit_training",
        "--config",
        str(config),
        "--dataset-version",
        str(train_version.id),
        "--base-url",
        "http://127.0.0.1:9/api",
        "--dry-run",
    )
    assert outcome.code == 2
    assert outcome.stderr.splitlines() == [
        f"submit_training: error: config (line {line}): {TOO_DEEP}"
    ]
    assert TrainingJob.objects.count() == 0


@pytest.fixture
def endpoint(db) -> Endpoint:
    return Endpoint.objects.create(
        name="synth-local", kind="synth", base_url="http://127.0.0.1:9/api", api_key_env="K"
    )


@pytest.mark.parametrize("bomb", [TABLES, ARRAYS], ids=["tables", "arrays"])
@pytest.mark.parametrize("action", ["preview", "submit"])
def test_the_page_shows_a_nesting_bomb_as_a_form_error(
    client, submitter, endpoint, train_version, bomb, action
):
    client.force_login(submitter)
    text, line = _in_reference(bomb)
    response = client.post("/training/new/", form_data(train_version, config=text, action=action))
    assert response.status_code == 200
    page = response.content.decode()
    assert TOO_DEEP in page and f'data-error-lines="{line}"' in page
    assert "Traceback" not in page and "RecursionError" not in page
    assert TrainingJob.objects.count() == 0
