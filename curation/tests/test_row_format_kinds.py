"""A row format is one declaration: a throwaway one, registered here, shows in the dataset
form, `export_jsonl --format` and the new-dataset page, and exports rows as it says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import get_commands, load_command_class
from django.urls import reverse

from curation import row_formats
from curation.export_options import ExportOptions, check_combination
from curation.forms import DatasetForm
from curation.row_formats import RowFormat
from curation.tests.conftest import read_rows, run
from rollouts.review.turn_selection import FilterError, TurnSelection

THROWAWAY = RowFormat(
    name="plainrows",
    label="Plain rows",
    form_help="rows without metadata, for a test.",
    command_help="a throwaway test format",
    with_metadata=False,
)


@pytest.fixture
def plainrows() -> Iterator[RowFormat]:
    row_formats.register(THROWAWAY)
    try:
        yield THROWAWAY
    finally:
        row_formats.unregister(THROWAWAY.name)


def _export_jsonl_help() -> str:
    command = load_command_class(get_commands()["export_jsonl"], "export_jsonl")
    return command.create_parser("manage.py", "export_jsonl").format_help()


def test_the_form_offers_it_with_its_label_and_help(db, plainrows):
    field = DatasetForm().fields["format"]
    assert ("plainrows", "Plain rows") in list(field.choices)
    assert "Plain rows: rows without metadata, for a test." in str(field.help_text)


def test_export_jsonl_lists_it_in_format_choices_and_help(plainrows):
    text = " ".join(_export_jsonl_help().split())
    assert "plainrows (a throwaway test format)" in text
    assert "{studio,openai,synth,plainrows}" in text


def test_the_new_dataset_page_offers_it(editor_client, plainrows):
    page = editor_client.get(reverse("datasets:dataset_new")).content.decode()
    assert 'value="plainrows"' in page and "Plain rows" in page


def test_its_declaration_decides_what_it_refuses(plainrows):
    # No preference rows and no metadata to mark inferred tool calls: both refused.
    with pytest.raises(FilterError, match="studio or openai format, not plainrows"):
        check_combination(TurnSelection(), ExportOptions(format="plainrows", kind="preference"))
    with pytest.raises(FilterError, match="the plainrows format has no metadata"):
        check_combination(
            TurnSelection(include_text_fallback=True), ExportOptions(format="plainrows")
        )


def test_it_exports_rows_as_declared(scripted_batch, plainrows, tmp_path):
    out = tmp_path / "plain.jsonl"
    result = run("export_jsonl", "--format", "plainrows", "--output", str(out))
    assert result.code == 0, result.err
    rows = read_rows(out)
    assert rows and all(set(row) == {"messages", "tools"} for row in rows)


def test_it_is_gone_once_unregistered():
    assert "plainrows" not in row_formats.format_names()
    assert "plainrows" not in _export_jsonl_help()
    with pytest.raises(FilterError, match="not one of studio, openai, synth"):
        ExportOptions(format="plainrows")
