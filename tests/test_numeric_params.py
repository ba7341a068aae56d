"""Every numeric query parameter of every page is range-checked.

A number past PostgreSQL's bigint (`/turns/?seed=9223372036854775808`) must never reach a
query, where it would raise OverflowError. Each page below is asked with hostile numbers for
each numeric parameter it reads; it answers 200 (the filter refused on the form, or
ignored) or a one-line 400, never a 500.
"""

from __future__ import annotations

import base64
import json

import pytest
from django.test import Client

from curation import services as dataset_services
from curation.export_options import ExportOptions
from curation.tests.conftest import record, run
from rollouts.models import Episode
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db

BIGINT_MAX = 2**63 - 1


def _cursor(*values) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values)).encode()).decode().rstrip("=")


HOSTILE = [
    str(BIGINT_MAX + 1),
    str(-(BIGINT_MAX + 2)),
    str(2**31),
    "9" * 40,
    "1" * 5000,
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-1e400",
    "1e308",
    "abc",
    "-1",
    "1.5",
    "0x10",
]
CURSORS = [
    _cursor(BIGINT_MAX + 1, BIGINT_MAX + 1),
    _cursor(-(BIGINT_MAX + 2), 1),
    _cursor(2**31, 2**31),
    _cursor(1e308, 1),
    _cursor(-1e308, -(BIGINT_MAX + 2)),
    "abc",
]


@pytest.fixture
def world(db) -> dict[str, int]:
    batch = record(seeds=(1,), steps=3)
    episode = Episode.objects.get(batch=batch)
    dataset = dataset_services.dataset_create(
        name="probe", filters=TurnSelection(batches=(batch.id,)), options=ExportOptions()
    )
    return {"batch": batch.id, "episode": episode.id, "dataset": dataset.id}


# (page, numeric query parameters it reads)
PAGES = {
    "/rollouts/": ("page",),
    "/rollouts/{batch}/": ("page",),
    "/episodes/{episode}/": ("turn",),
    "/turns/": ("batch", "seed", "page"),
    "/turns/?sort=reward": ("batch", "seed"),
    "/turns/?sort=-seed": ("batch", "seed"),
    "/turns/?sort=turn": ("batch", "seed"),
    "/datasets/": ("page",),
    "/datasets/{dataset}/": ("page",),
    "/datasets/counts/": (
        "batches",
        "min_unique",
        "min_reward",
        "top_per_seed",
        "history_frames",
        "val_fraction",
    ),
    "/compare/": ("batches",),
    "/compare/seed/1/?batches={batch}": ("step", "batches"),
    "/leaderboard/": ("page",),
    "/training/": ("page",),
}
CURSOR_PAGES = ("/turns/", "/turns/?sort=reward", "/turns/?sort=-seed", "/turns/?sort=-turn")


def _problems(client: Client, url: str, params, values) -> list[str]:
    """Every (parameter, value) answered otherwise than 200 or a one-line 400."""
    problems = []
    for param in params:
        for value in values:
            try:
                response = client.get(url, {param: value})
            except Exception as exc:  # the test client re-raises a view's exception
                problems.append(f"{url} {param}={value[:30]}: {type(exc).__name__}: {exc}")
                continue
            if response.status_code not in (200, 400) or (
                response.status_code == 400 and b"\n" in response.content.strip()
            ):
                problems.append(f"{url} {param}={value[:30]}: {response.status_code}")
    return problems


@pytest.mark.parametrize("page", list(PAGES))
def test_it_answers_hostile_numbers_without_a_500(viewer_client, world, page):
    assert _problems(viewer_client, page.format(**world), PAGES[page], HOSTILE) == []


@pytest.mark.parametrize("page", CURSOR_PAGES)
def test_it_answers_hostile_cursors_without_a_500(viewer_client, world, page):
    assert _problems(viewer_client, page, ("after", "before"), CURSORS) == []


def test_it_answers_hostile_numbers_on_the_editors_pages(editor_client, world):
    problems = _problems(editor_client, "/turns/bulk-flag/", ("batch", "seed"), HOSTILE)
    problems += _problems(editor_client, "/rollouts/new/", ("from",), HOSTILE)
    assert problems == []


def test_it_says_why_it_ignored_a_seed_past_bigint(viewer_client, editor_client, world):
    response = viewer_client.get("/turns/", {"seed": str(BIGINT_MAX + 1)})
    assert response.status_code == 200
    page = response.content.decode()
    assert 'role="alert"' in page
    assert f"seed: Ensure this value is less than or equal to {BIGINT_MAX}." in page
    # The largest seed there can be is a filter like any other: no turn has it.
    assert viewer_client.get("/turns/", {"seed": str(BIGINT_MAX)}).status_code == 200
    refused = editor_client.get("/turns/bulk-flag/", {"seed": str(BIGINT_MAX + 1)})
    assert refused.status_code == 400 and refused.content == b"invalid filters"


def test_the_commands_refuse_numbers_past_what_the_database_holds_in_one_line(world, tmp_path):
    for args, message in (
        (("--batch", str(BIGINT_MAX + 1)), f"batch: ids are integers from 1 to {BIGINT_MAX}"),
        (("--min-reward", "inf"), "min-reward: not a finite number"),
        (("--min-reward", "1e400"), "min-reward: not a finite number"),
    ):
        outcome = run("export_jsonl", "--output", str(tmp_path / "out.jsonl"), *args)
        assert outcome.code == 2, args
        assert outcome.stderr.strip().splitlines() == [f"export_jsonl: error: {message}"]
