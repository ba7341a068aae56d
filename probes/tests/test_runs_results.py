"""probes.results and probes.prompting, pure: figures worked out by hand."""

from __future__ import annotations

import pytest

from probes.prompting import lettered, parse_choice, question_messages
from probes.results import (
    AnswerRecord,
    confusion_matrices,
    paired_difference,
    run_results,
    runs_compare,
)

YES_NO = ("yes", "no")
COUNTS = ("2", "0", "3+", "1")


def record(qid: int, kind: str, choices, answer: str, choice: str, **extra) -> AnswerRecord:
    return AnswerRecord(
        question_id=qid, kind=kind, choices=tuple(choices), answer=answer, choice=choice, **extra
    )


def test_it_gives_accuracy_wilson_interval_and_chance_per_kind():
    records = [
        record(1, "night", YES_NO, "yes", "yes"),
        record(2, "night", YES_NO, "no", "no"),
        record(3, "night", YES_NO, "no", "no"),
        record(4, "night", YES_NO, "yes", "", error_kind="unparsed"),
        record(5, "count", COUNTS, "0", "0", subject="cow"),
        record(6, "count", COUNTS, "1", "3+", subject="tree"),
    ]
    results = run_results(records, kinds=["night", "count"])
    assert list(results.kinds) == ["night", "count"]
    night = results.kinds["night"]
    assert (night.questions, night.correct, night.errors) == (4, 3, 1)
    assert night.accuracy == 0.75
    # Wilson, z = 1.96, 3 of 4: centre (0.75 + 1.9208 / 4) / (1 + 3.8415 / 4) = 0.6276, half
    # 1.96 * sqrt(0.75 * 0.25 / 4 + 3.8415 / 64) / 1.9604 = 0.3269.
    assert night.interval == pytest.approx((0.3006, 0.9544), abs=1e-4)
    assert night.chance == 0.5
    assert results.kinds["count"].chance == 0.25
    # Overall: 4 of 6; chance (4 x 1/2 + 2 x 1/4) / 6.
    assert results.overall.accuracy == pytest.approx(4 / 6)
    assert results.overall.chance == pytest.approx(2.5 / 6)
    assert {s: a.correct for s, a in results.subjects["count"].items()} == {"cow": 1, "tree": 0}
    assert results.kinds_json()["night"] == {
        "accuracy": 0.75,
        "interval": [0.3006, 0.9544],
        "chance": 0.5,
        "questions": 4,
    }


def test_it_compares_two_runs_on_the_questions_both_answered():
    base = [
        record(1, "night", YES_NO, "yes", "yes"),
        record(2, "night", YES_NO, "no", "yes"),
        record(3, "night", YES_NO, "no", "no"),
        record(4, "asleep", YES_NO, "no", "no"),
        record(9, "asleep", YES_NO, "no", "no"),  # only base answered it
    ]
    other = [
        record(1, "night", YES_NO, "yes", "no"),
        record(2, "night", YES_NO, "no", "no"),
        record(3, "night", YES_NO, "no", "no"),
        record(4, "asleep", YES_NO, "no", "no"),
    ]
    compared = runs_compare(base=base, other=other, kinds=["night", "asleep"])
    assert (compared.paired_questions, compared.only_base, compared.only_other) == (4, 1, 0)
    night = compared.kinds["night"]
    assert (night.both_right, night.only_base, night.only_other, night.both_wrong) == (1, 1, 1, 0)
    assert night.base.accuracy == night.other.accuracy == pytest.approx(2 / 3)
    assert night.difference == 0.0
    low, high = night.interval
    assert low < 0 < high
    assert compared.kinds["asleep"].interval == (0.0, 0.0)  # no discordant question
    assert compared.right_only_in_base == {"night": [1]}
    assert compared.right_only_in_other == {"night": [2]}


def test_the_paired_interval_is_close_to_the_normal_one_on_many_questions():
    # 400 questions, 40 right only in base, 60 only in other: difference 20 / 400 = 0.05,
    # its standard error sqrt((100 / 400 - 0.05 ** 2) / 400) = 0.024875, so the normal
    # interval is 0.05 -/+ 1.96 x 0.024875 = (0.0012, 0.0988).
    difference, (low, high) = paired_difference(200, 40, 60, 100)
    assert difference == 0.05
    assert low == pytest.approx(0.0012, abs=0.008)
    assert high == pytest.approx(0.0988, abs=0.008)
    assert paired_difference(200, 40, 60, 100) == (difference, (low, high))  # fixed seed
    assert paired_difference(0, 0, 0, 0) == (0.0, (0.0, 0.0))


def test_it_counts_confusions_in_a_natural_order():
    records = [
        record(1, "count", COUNTS, "0", "0"),
        record(2, "count", COUNTS, "0", "1"),
        record(3, "count", COUNTS, "3+", "2"),
        record(4, "count", COUNTS, "3+", ""),
        record(5, "night", YES_NO, "yes", "no"),
    ]
    matrices = confusion_matrices(records)
    count = matrices["count"]
    assert count.labels == ["0", "1", "2", "3+"]
    assert count.counts == [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0]]
    assert count.unparsed == [0, 0, 0, 1]
    assert count.total == 4
    assert matrices["night"].labels == ["no", "yes"]
    assert matrices["night"].counts == [[0, 0], [1, 0]]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("B", "tree"),
        ("b", "tree"),
        (" (B) ", "tree"),
        ("B.", "tree"),
        ("B)", "tree"),
        ("**B**", "tree"),
        ("tree", "tree"),
        ("Tree.", "tree"),
        ("B. tree", "tree"),
        ("(B) tree", "tree"),
        ("none in view", "none in view"),
        ("D", "none in view"),
        ("B. water", None),  # a letter and another choice's text
        ("E", None),  # no fifth choice
        ("The answer is B", None),
        ("B or C", None),
        ("", None),
        ("water", None),  # not among the choices
    ],
)
def test_it_reads_a_choice_strictly(answer, expected):
    assert parse_choice(answer, ["cow", "tree", "stone", "none in view"]) == expected


def test_it_letters_the_choices_and_puts_the_frame_first():
    assert lettered(["0", "1", "3+"]) == "A. 0\nB. 1\nC. 3+"
    png = b"\x89PNG\r\n\x1a\nfake"
    messages = question_messages(
        observation="image", text="Is it night?", choices=["yes", "no"], png=png
    )
    parts = messages[1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text"]
    assert parts[1]["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgpmYWtl"
    assert parts[2]["text"] == "Is it night?\n\nA. yes\nB. no\n\nAnswer with one letter."
    with pytest.raises(ValueError, match="at most 26"):
        lettered([str(n) for n in range(27)])
