"""The bounds a TOML text must keep before tomllib reads it: what counts and what does not."""

from __future__ import annotations

import tomllib

import pytest

from training.tests.conftest import REFERENCE
from training.toml_shape import ShapeProblem, toml_shape_problem


def test_the_reference_keeps_every_bound():
    assert toml_shape_problem(REFERENCE.read_text()) is None


def test_it_reads_names_of_four_parts_and_refuses_five_naming_the_line():
    assert toml_shape_problem('[a.b.c.d]\ne.f."g".h = 1\nx = {i.j.k.l = 1}') is None
    for text, line in (
        ("x = 1\na.b.c.d.e = 1", 2),
        ('x = 1\n\n"a" . b . "c" . d . e = 1', 3),
        ("[a.b.c.d.e]", 1),
        ("[[a.b.c.d.e]]", 1),
        ("x = {a = 1, b.c.d.e.f = 1}", 1),
    ):
        assert toml_shape_problem(text) == ShapeProblem(
            line, "a dotted name of more than 4 parts"
        ), text


def test_dots_in_numbers_dates_strings_and_comments_are_no_names():
    text = (
        "a.b.c = 1.5\n"
        "d = [1.5, 2.5, 3.5, 4.5, 5.5]\n"
        "e = 1979-05-27T07:32:00.999999-07:00\n"
        'f = "a.b.c.d.e.f"\n'
        "g = 'a.b.c.d.e.f'\n"
        'h = """\na.b.c.d.e.f\n"""\n'
        "# a.b.c.d.e.f\n"
    )
    assert toml_shape_problem(text) is None


@pytest.mark.parametrize("quote", ['"', "'"], ids=["basic", "literal"])
def test_a_multi_line_string_ends_where_tomllib_ends_it(quote):
    # Up to two quotes of content may come before the closing three: a scan that ended the
    # string at the first three would take what follows for the start of another string,
    # and miss the dotted key tomllib then reads.
    text = f"t = {{b = {quote * 3}q{quote * 5}, c.c.c.c.c = 1}}"
    assert tomllib.loads(text)["t"]["b"] == "q" + quote * 2
    assert toml_shape_problem(text) == ShapeProblem(1, "a dotted name of more than 4 parts")


def test_it_counts_keys_tables_and_array_items_together():
    keys = "".join(f"k{n} = 1\n" for n in range(150))
    tables = "".join(f"[t{n}]\n" for n in range(30))
    items = "a = [" + ", ".join("1" for _ in range(19)) + "]\n"  # one key, 18 commas
    assert toml_shape_problem(keys + tables + items) is None  # 150 + 30 + 19 = 199
    assert toml_shape_problem(keys + tables + items + "z = 1\n") is None  # 200
    assert toml_shape_problem(keys + tables + items + "z = 1\nzz = 1\n") == ShapeProblem(
        183, "more than 200 keys, tables and array items"
    )


def test_it_counts_backslashes_up_to_a_thousand():
    assert toml_shape_problem('a = "' + "\\t" * 1000 + '"') is None
    text = 'a = "' + "\\t" * 999 + '"\nb = "\\t\\t"'
    assert toml_shape_problem(text) == ShapeProblem(2, "more than 1000 backslashes")


def test_it_bounds_lines_and_their_length_and_bare_words():
    assert toml_shape_problem("\n" * 999) is None
    assert toml_shape_problem("\n" * 1000) == ShapeProblem(1001, "more than 1000 lines")
    assert toml_shape_problem("a = 1\n#" + "x" * 4095) is None
    assert toml_shape_problem("a = 1\n#" + "x" * 4096) == ShapeProblem(
        2, "a line longer than 4096 characters"
    )
    assert toml_shape_problem("a = " + "9" * 100 + '\nb = "' + "9" * 1000 + '"') is None
    assert toml_shape_problem("a = 1\nb = " + "9" * 101) == ShapeProblem(
        2, "a key or value of more than 100 characters outside quotes"
    )
