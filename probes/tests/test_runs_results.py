"""probes.results and probes.prompting, pure: figures worked out by hand."""

from __future__ import annotations

import pytest

from probes.prompting import lettered, parse_choice, question_messages
from probes.results import (
    ERROR_SHARE_LIMIT,
    AnswerRecord,
    Tally,
    accuracy_of,
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
        record(4, "night", YES_NO, "yes", "", error_kind="unparsed"),  # an error: left out
        record(7, "night", YES_NO, "yes", "no"),
        record(5, "count", COUNTS, "0", "0", subject="cow"),
        record(6, "count", COUNTS, "1", "3+", subject="tree"),
    ]
    results = run_results(records, kinds=["night", "count"])
    assert list(results.kinds) == ["night", "count"]
    night = results.kinds["night"]
    assert (night.asked, night.answered, night.correct, night.errors) == (5, 4, 3, 1)
    assert night.error_share == 0.2 and not night.errors_over_limit  # 20% is not past 20%
    assert night.accuracy == 0.75
    # Wilson, z = 1.96, 3 of 4: centre (0.75 + 1.9208 / 4) / (1 + 3.8415 / 4) = 0.6276, half
    # 1.96 * sqrt(0.75 * 0.25 / 4 + 3.8415 / 64) / 1.9604 = 0.3269.
    assert night.interval == pytest.approx((0.3006, 0.9544), abs=1e-4)
    assert night.chance == 0.5
    assert results.kinds["count"].chance == 0.25
    assert night.against_chance == "level"  # 0.30 to 0.95 holds 0.5
    # Overall: 4 of the 6 answered; chance (4 x 1/2 + 2 x 1/4) / 6.
    assert results.overall.accuracy == pytest.approx(4 / 6)
    assert results.overall.chance == pytest.approx(2.5 / 6)
    assert {s: a.correct for s, a in results.subjects["count"].items()} == {"cow": 1, "tree": 0}
    assert results.kinds_json()["night"] == {
        "accuracy": 0.75,
        "interval": [0.3006, 0.9544],
        "chance": 0.5,
        "questions": 5,
        "answered": 4,
        "errors": 1,
    }


def test_an_answer_that_is_an_error_says_nothing_about_perception():
    # A server answering every question with a tool call: nothing answered, no accuracy.
    tool_calls = [
        record(1, "night", YES_NO, "yes", "", error_kind="tool_call"),
        record(2, "night", YES_NO, "no", "", error_kind="tool_call"),
        record(3, "count", COUNTS, "0", "", error_kind="http_503"),
    ]
    blind = accuracy_of(tool_calls)
    assert (blind.asked, blind.answered, blind.correct, blind.errors) == (3, 0, 0, 3)
    assert blind.accuracy is None and blind.interval is None and blind.chance is None
    assert blind.against_chance == ""
    assert blind.error_share == 1.0 and blind.errors_over_limit and not blind.ranked
    assert run_results(tool_calls).kinds_json()["night"] == {
        "accuracy": None,
        "interval": None,
        "chance": None,
        "questions": 2,
        "answered": 0,
        "errors": 2,
    }
    # Below chance only on what was answered: 0 of 12 yes/no questions (Wilson 0 to 0.2425).
    wrong = [record(i, "night", YES_NO, "yes", "no") for i in range(12)]
    assert accuracy_of(wrong).against_chance == "below"
    # Two errors among nine answers: 22.2%, past the limit of 20%.
    assert ERROR_SHARE_LIMIT == 0.2
    mixed = accuracy_of(wrong[:7] + tool_calls[:2])
    assert mixed.errors_over_limit and mixed.answered == 7 and mixed.accuracy == 0.0


def test_runs_stand_ranked_first_then_by_accuracy_over_the_answered():
    # A run with every answer an error is never above one that answered, however few right.
    blind = Tally(asked=481, errors=481, correct=0)
    weak = Tally(asked=100, errors=0, correct=10)
    sure = Tally(asked=100, errors=10, correct=81)  # 81 of 90 answered: 90%
    noisy = Tally(asked=100, errors=30, correct=70)  # 70 of 70: 100%, but 30% errors
    assert (sure.answered, sure.accuracy, noisy.accuracy) == (90, 0.9, 1.0)
    assert blind.accuracy is None and not blind.ranked and not noisy.ranked
    order = sorted([blind, weak, sure, noisy], key=Tally.standing, reverse=True)
    assert order == [sure, weak, noisy, blind]


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
    assert (compared.asked_of_both, compared.only_base, compared.only_other) == (4, 1, 0)
    night = compared.kinds["night"]
    assert (night.both_right, night.only_base, night.only_other, night.both_wrong) == (1, 1, 1, 0)
    assert night.base.accuracy == night.other.accuracy == pytest.approx(2 / 3)
    assert night.difference == 0.0
    low, high = night.interval
    assert low < 0 < high
    assert compared.kinds["asleep"].interval == (0.0, 0.0)  # no discordant question
    assert compared.right_only_in_base == {"night": [1]}
    assert compared.right_only_in_other == {"night": [2]}


def test_questions_errored_in_one_run_or_both_are_counted_apart():
    def error(qid, answer):
        return record(qid, "night", YES_NO, answer, "", error_kind="tool_call")

    base = [
        record(1, "night", YES_NO, "yes", "yes"),  # both right
        record(2, "night", YES_NO, "no", "yes"),  # both wrong
        record(3, "night", YES_NO, "no", "no"),  # only base right
        error(4, "yes"),  # both errored
        error(5, "no"),  # base errored
        record(6, "night", YES_NO, "no", "no"),  # other errored (base right: not "only")
    ]
    other = [
        record(1, "night", YES_NO, "yes", "yes"),
        record(2, "night", YES_NO, "no", "yes"),
        record(3, "night", YES_NO, "no", "yes"),
        error(4, "yes"),
        record(5, "night", YES_NO, "no", "no"),
        error(6, "no"),
    ]
    compared = runs_compare(base=base, other=other)
    night = compared.kinds["night"]
    assert compared.asked_of_both == night.asked == 6
    assert night.questions == 3  # answered by both: 1, 2 and 3
    assert (night.both_right, night.only_base, night.only_other, night.both_wrong) == (1, 1, 0, 1)
    assert (night.both_errored, night.base_errored, night.other_errored) == (1, 1, 1)
    # Accuracies over the three both answered: base 2 of 3, other 1 of 3.
    assert night.base.accuracy == pytest.approx(2 / 3)
    assert night.other.accuracy == pytest.approx(1 / 3)
    assert night.difference == pytest.approx(-1 / 3)
    assert compared.right_only_in_base == {"night": [3]}
    assert compared.right_only_in_other == {}


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
