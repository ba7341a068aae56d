"""Any config text up to the size limit is refused or read within a CPU budget.

`a.a.a...=1` (64 KB) cost tomllib alone ~22 s of CPU in the training form's preview, and
other shapes (dotted table headers, quoted dotted keys) seconds each: the nesting limit
covered only brackets. Each text below is exactly the size limit; the budget is ten times
what the slowest takes, so that a loaded machine does not fail it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from curation.tests.conftest import run
from training.config import ConfigError, config_load
from training.models import TrainingJob
from training.tests.conftest import REFERENCE
from training.tests.test_views import form_data

SIZE = 64 * 1024  # the size limit of a config
CPU_BUDGET_SECONDS = 0.5


class CpuBudgetSpent(Exception):
    pass


@contextmanager
def cpu_budget(seconds: float) -> Iterator[None]:
    """Fail once the process has spent `seconds` of CPU inside the block.

    A profiling timer counts CPU time, as `time.process_time()` does, and stops a runaway
    parser instead of waiting out its 22 s.
    """

    def stop(signum: int, frame: object) -> None:
        raise CpuBudgetSpent(f"more than {seconds} s of CPU")

    previous = signal.signal(signal.SIGPROF, stop)
    started = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    except CpuBudgetSpent:
        # Failed here, away from the frame the signal interrupted (pytest cannot always
        # show that one).
        pytest.fail(f"more than {seconds} s of CPU", pytrace=False)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    spent = time.process_time() - started
    assert spent < seconds, f"{spent:.3f} s of CPU"


def _lines(line: Callable[[int], str]) -> str:
    """`line(0)`, `line(1)`, ... one a line, cut at exactly the size limit."""
    text, number = "", 0
    while len(text) < SIZE:
        text += line(number) + "\n"
        number += 1
    return text[:SIZE]


def _reference_with_long_description() -> str:
    reference = REFERENCE.read_text()
    before, after = reference.split('"Crafter VLM SFT (text + image prompts)"')
    body = SIZE - len(before) - len(after) - len('"""\n"""')
    lines, rest = divmod(body, 4096)
    return before + '"""\n' + ("x" * 4095 + "\n") * lines + "x" * rest + '"""' + after


REFUSED_ON_LINE_1 = [
    ("dotted-key-in-one-line", "a" + ".a" * 32766 + " =1", "a line longer than 4096 characters"),
    (
        "dotted-keys",
        _lines(lambda n: f"a{n}" + ".a" * 1999 + " = 1"),
        "a dotted name of more than 4 parts",
    ),
    (
        "quoted-dotted-keys",
        _lines(lambda n: f'"a{n}"' + '."a"' * 999 + " = 1"),
        "a dotted name of more than 4 parts",
    ),
    (
        "dotted-table-headers",
        _lines(lambda n: f"[t{n}" + ".a" * 1999 + "]"),
        "a dotted name of more than 4 parts",
    ),
    (
        "dotted-keys-in-inline-tables",
        _lines(lambda n: f"t{n} = {{a" + ".a" * 1990 + " = 1}"),
        "a dotted name of more than 4 parts",
    ),
    (
        "keys-in-inline-tables",
        _lines(lambda n: f"t{n} = {{" + ", ".join(f"k{i} = 1" for i in range(350)) + "}"),
        "more than 200 keys, tables and array items",
    ),
    (
        "long-arrays",
        _lines(lambda n: f"a{n} = [" + "1, " * 1300 + "]"),
        "more than 200 keys, tables and array items",
    ),
    (
        "escapes",
        _lines(lambda n: f'k{n} = "' + "\\n" * 1990 + '"'),
        "more than 1000 backslashes",
    ),
    (
        "long-integers",
        _lines(lambda n: f"k{n} = " + "9" * 4000),
        "a key or value of more than 100 characters outside quotes",
    ),
    (
        "brackets",
        _lines(lambda n: "] " * 2000),
        "more than 1000 strings and brackets",
    ),
]
REFUSED_FURTHER_ON = [
    # Three entries a table, one a line: the 201st entry is on line 201.
    (
        "keys-repeated-in-many-tables",
        _lines(lambda n: [f"[t{n // 3}]", f'a.b = "{"x" * 90}"', f'a.c = "{"x" * 90}"'][n % 3]),
        "config (line 201): more than 200 keys, tables and array items",
    ),
    (
        "arrays-of-tables",
        _lines(lambda n: "[[a]]" if n % 2 == 0 else f'x = "{"x" * 120}"'),
        "config (line 201): more than 200 keys, tables and array items",
    ),
    ("many-lines", _lines(lambda n: f"k{n} = 1"), "config (line 1001): more than 1000 lines"),
    (
        "reference-with-a-long-description",
        _reference_with_long_description(),
        "[job] description (line 5): longer than 2000 characters",
    ),
]


def _reference_with_comments() -> str:
    text = REFERENCE.read_text()
    while len(text) < SIZE:
        text += "# " + "x" * 78 + "\n"
    return text[:SIZE]


def _reference_with_trailing_spaces() -> str:
    lines = REFERENCE.read_text().split("\n")
    pad, rest = divmod(SIZE - len("\n".join(lines)), len(lines))
    lines = [line + " " * pad for line in lines]
    lines[-1] += " " * rest
    return "\n".join(lines)


READ = [
    ("reference-with-comments", _reference_with_comments()),
    ("reference-with-trailing-spaces", _reference_with_trailing_spaces()),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(text, f"config (line 1): {message}", id=name)
        for name, text, message in REFUSED_ON_LINE_1
    ]
    + [pytest.param(text, expected, id=name) for name, text, expected in REFUSED_FURTHER_ON],
)
def test_config_load_refuses_a_bomb_at_the_size_limit_within_the_cpu_budget(text, expected):
    assert len(text) == SIZE
    with cpu_budget(CPU_BUDGET_SECONDS), pytest.raises(ConfigError) as refused:
        config_load(text)
    assert refused.value.lines()[0] == expected


@pytest.mark.parametrize("text", [pytest.param(text, id=name) for name, text in READ])
def test_config_load_reads_a_real_config_at_the_size_limit_within_the_cpu_budget(text):
    assert len(text) == SIZE
    with cpu_budget(CPU_BUDGET_SECONDS):
        config = config_load(text)
    assert config.model == "openai/gpt-4o-mini-2024-07-18"


DOTTED_KEYS = dict((name, text) for name, text, _ in REFUSED_ON_LINE_1)["dotted-keys"]


@pytest.mark.django_db
def test_the_preview_shows_a_dotted_key_bomb_beside_its_line_within_the_cpu_budget(
    client, submitter, train_version
):
    client.force_login(submitter)
    # The first request builds the URL patterns and templates: not the config's cost.
    assert client.post("/training/new/", form_data(train_version)).status_code == 200
    data = form_data(train_version, config=DOTTED_KEYS, action="preview")
    with cpu_budget(CPU_BUDGET_SECONDS):
        response = client.post("/training/new/", data)
    assert response.status_code == 200
    page = response.content.decode()
    assert "a dotted name of more than 4 parts" in page and 'data-error-lines="1"' in page
    assert TrainingJob.objects.count() == 0


def test_submit_training_refuses_a_dotted_key_bomb_within_the_cpu_budget(tmp_path, train_version):
    config = tmp_path / "bomb.toml"
    config.write_text(DOTTED_KEYS)
    with cpu_budget(CPU_BUDGET_SECONDS):
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
        "submit_training: error: config (line 1): a dotted name of more than 4 parts"
    ]
    assert TrainingJob.objects.count() == 0
