"""What a probe run measured: accuracy per kind, its interval, chance, pairs of runs, confusions.

Pure and Django-free, like `evaluation.statistics`, whose Wilson interval and bootstrap it
uses: the command's summary, the run's page, the lists of runs, the comparison and the
leaderboard all read their numbers here, from plain `AnswerRecord`s (`probes.selectors_runs.
run_answer_records` reads them) or a run's counters (`Tally`).

- An answer is **answered** when it names one of its question's choices. Anything else is an
  **error** (a failed call, a tool call, text naming no choice, hostile bytes, a frame that
  could not be read): it says nothing about what the model sees, so it is counted apart and
  left out of accuracy, its interval, chance and the verdict against chance.
- Accuracy is over the questions answered; its interval is Wilson's, 95%. Chance is what a
  guess scores on the same questions: the mean of 1 / len(choices). Nothing answered: no
  accuracy (None), never 0%.
- A run whose errors are more than `ERROR_SHARE_LIMIT` of its answers is flagged: its
  accuracy rests on too few of its questions to stand beside other runs' (its page says so,
  the leaderboard lists it apart, unranked).
- Two runs are compared on the questions both answered: per kind, each one's accuracy, the
  difference (other - base) with a paired bootstrap interval over questions (as `/compare/`
  resamples seeds for batches), and how many questions only one of them got right; the
  questions one or both of them errored on are counted apart.
- A confusion matrix per kind counts (right answer, answer given) pairs; "" is unparsed.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from evaluation.statistics import Interval, bootstrap, percentile_interval, wilson_interval

ALL = "all"  # the key of every kind together
UNPARSED = ""  # the choice of an answer that named none
# Past this share of errors among a run's answers, its accuracy is flagged and unranked.
ERROR_SHARE_LIMIT = 0.2


def is_error(error_kind: str) -> bool:
    """The one rule of what an answer that is not answered is: any recorded error."""
    return bool(error_kind)


@dataclass(frozen=True)
class AnswerRecord:
    """One stored answer with what results need of its question."""

    question_id: int
    kind: str
    choices: tuple[str, ...]
    answer: str  # the right choice
    choice: str  # the model's, or "" when none could be read
    subject: str = ""
    error_kind: str = ""

    @property
    def answered(self) -> bool:
        return not is_error(self.error_kind)

    @property
    def correct(self) -> bool:
        return self.answered and self.choice != UNPARSED and self.choice == self.answer


@dataclass(frozen=True)
class Tally:
    """How some answers fell: `asked` stored, `errors` of them errors, `correct` of the rest
    right. A run's counters are one (`ProbeRun.tally`)."""

    asked: int
    errors: int
    correct: int

    @property
    def answered(self) -> int:
        return self.asked - self.errors

    @property
    def accuracy(self) -> float | None:
        """Right of the answered; None when nothing was answered."""
        return self.correct / self.answered if self.answered else None

    @property
    def error_share(self) -> float:
        return self.errors / self.asked if self.asked else 0.0

    @property
    def errors_over_limit(self) -> bool:
        return self.error_share > ERROR_SHARE_LIMIT

    @property
    def ranked(self) -> bool:
        """Its accuracy can stand beside other runs': something answered, errors within
        the limit."""
        return self.answered > 0 and not self.errors_over_limit

    def standing(self) -> tuple[bool, float, int]:
        """The order of runs on a leaderboard, best last: ranked first, then the most right
        of those answered, then the most answered."""
        return (self.ranked, self.accuracy or 0.0, self.answered)


@dataclass(frozen=True)
class Accuracy(Tally):
    """Accuracy of some answers against chance on the same questions (fractions in [0, 1]);
    interval and chance are None when nothing was answered."""

    interval: Interval | None
    chance: float | None

    @property
    def against_chance(self) -> str:
        """The verdict: "above" or "below" when the whole interval is, "level" when it
        holds chance, "" when nothing was answered."""
        if self.interval is None or self.chance is None:
            return ""
        if self.interval[0] > self.chance:
            return "above"
        if self.interval[1] < self.chance:
            return "below"
        return "level"

    def as_json(self) -> dict[str, object]:
        return {
            "questions": self.asked,
            "answered": self.answered,
            "correct": self.correct,
            "errors": self.errors,
            **self.figures_json(),
        }

    def figures_json(self) -> dict[str, object]:
        return {
            "accuracy": _rounded(self.accuracy),
            "interval": _rounded(self.interval),
            "chance": _rounded(self.chance),
        }


def _rounded(value):
    if value is None:
        return None
    if isinstance(value, tuple):
        return [round(v, 4) for v in value]
    return round(value, 4)


def accuracy_of(records: Sequence[AnswerRecord]) -> Accuracy:
    answered = [r for r in records if r.answered]
    n = len(answered)
    correct = sum(r.correct for r in answered)
    return Accuracy(
        asked=len(records),
        errors=len(records) - n,
        correct=correct,
        interval=wilson_interval(correct, n) if n else None,
        chance=sum(1 / len(r.choices) for r in answered if r.choices) / n if n else None,
    )


@dataclass(frozen=True)
class RunResults:
    overall: Accuracy
    kinds: dict[str, Accuracy]  # in kind order (see `kind_order`)
    # kind -> subject -> accuracy, for kinds asked about several things (count, vital, ...)
    subjects: dict[str, dict[str, Accuracy]]

    def kinds_json(self) -> dict[str, dict[str, object]]:
        """The `kinds` of `probe_run`'s last line: accuracy, interval and chance per kind,
        over its questions answered, and its questions asked, answered and errors."""
        return {
            kind: {
                **a.figures_json(),
                "questions": a.asked,
                "answered": a.answered,
                "errors": a.errors,
            }
            for kind, a in self.kinds.items()
        }


def run_results(records: Iterable[AnswerRecord], *, kinds: Sequence[str] = ()) -> RunResults:
    """Accuracy overall, per kind and per (kind, subject). `kinds`: the set's own order."""
    records = list(records)
    by_kind: dict[str, list[AnswerRecord]] = defaultdict(list)
    by_subject: dict[str, dict[str, list[AnswerRecord]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        by_kind[record.kind].append(record)
        if record.subject:
            by_subject[record.kind][record.subject].append(record)
    order = kind_order(by_kind, kinds)
    return RunResults(
        overall=accuracy_of(records),
        kinds={kind: accuracy_of(by_kind[kind]) for kind in order},
        subjects={
            kind: {s: accuracy_of(rs) for s, rs in sorted(by_subject[kind].items())}
            for kind in order
            if by_subject.get(kind)
        },
    )


def kind_order(present: Iterable[str], kinds: Sequence[str] = ()) -> list[str]:
    """The set's kinds in its order, then any other present, by name."""
    present = set(present)
    ordered = [k for k in kinds if k in present]
    return ordered + sorted(present - set(ordered))


# --- two runs on the same questions ------------------------------------------------------


@dataclass(frozen=True)
class PairedKind:
    """`other` against `base` on the questions both answered; those one or both of them
    errored on are counted apart, out of every figure."""

    questions: int  # answered by both: what accuracy, difference and counts are over
    base: Accuracy
    other: Accuracy
    difference: float  # other - base, a fraction
    interval: Interval  # paired bootstrap over questions, 95%
    both_right: int
    only_base: int  # right in base, wrong in other
    only_other: int
    both_wrong: int
    both_errored: int = 0
    base_errored: int = 0  # an error in base, an answer in other
    other_errored: int = 0

    @property
    def asked(self) -> int:
        """Questions both runs were asked (each has an answer or an error in both)."""
        return self.questions + self.both_errored + self.base_errored + self.other_errored

    def as_json(self) -> dict[str, object]:
        return {
            "questions": self.questions,
            "base": self.base.as_json(),
            "other": self.other.as_json(),
            "difference": round(self.difference, 4),
            "interval": [round(self.interval[0], 4), round(self.interval[1], 4)],
            "both_right": self.both_right,
            "only_base": self.only_base,
            "only_other": self.only_other,
            "both_wrong": self.both_wrong,
            "both_errored": self.both_errored,
            "base_errored": self.base_errored,
            "other_errored": self.other_errored,
        }


@dataclass(frozen=True)
class RunComparison:
    asked_of_both: int  # questions both runs have an answer or an error to
    only_base: int  # questions answered by base alone (not compared)
    only_other: int
    overall: PairedKind
    kinds: dict[str, PairedKind]
    # question ids right in one run and wrong in the other, per kind
    right_only_in_base: dict[str, list[int]] = field(default_factory=dict)
    right_only_in_other: dict[str, list[int]] = field(default_factory=dict)


def paired_difference(
    both_right: int, only_base: int, only_other: int, both_wrong: int
) -> tuple[float, Interval]:
    """(other - base accuracy, its 95% interval) from the four kinds of paired questions.

    The questions are resampled with replacement, the same ones on both sides (a paired
    bootstrap, with `evaluation.statistics.bootstrap`'s fixed seed: the same counts give the
    same interval on every page). Only the discordant questions move the difference.
    """
    n = both_right + only_base + only_other + both_wrong
    if not n:
        return 0.0, (0.0, 0.0)
    difference = (only_other - only_base) / n
    if not (only_base or only_other):
        return 0.0, (0.0, 0.0)
    counts = np.array([both_right, only_base, only_other, both_wrong])
    # Each group's contribution to other - base: 0, -1, +1, 0.
    effect = np.array([0.0, -1.0, 1.0, 0.0])
    draws = bootstrap(counts, lambda weights: weights @ effect / n)
    return difference, percentile_interval(draws)


def _paired_kind(pairs: list[tuple[AnswerRecord, AnswerRecord]]) -> PairedKind:
    answered = [(b, o) for b, o in pairs if b.answered and o.answered]
    tally = Counter((b.correct, o.correct) for b, o in answered)
    both_right, only_base = tally[(True, True)], tally[(True, False)]
    only_other, both_wrong = tally[(False, True)], tally[(False, False)]
    errored = Counter((b.answered, o.answered) for b, o in pairs)
    difference, interval = paired_difference(both_right, only_base, only_other, both_wrong)
    return PairedKind(
        questions=len(answered),
        base=accuracy_of([b for b, _ in answered]),
        other=accuracy_of([o for _, o in answered]),
        difference=difference,
        interval=interval,
        both_right=both_right,
        only_base=only_base,
        only_other=only_other,
        both_wrong=both_wrong,
        both_errored=errored[(False, False)],
        base_errored=errored[(False, True)],
        other_errored=errored[(True, False)],
    )


def runs_compare(
    *,
    base: Iterable[AnswerRecord],
    other: Iterable[AnswerRecord],
    kinds: Sequence[str] = (),
) -> RunComparison:
    """Two runs of the same set, paired on the questions both answered."""
    base_by_id = {r.question_id: r for r in base}
    other_by_id = {r.question_id: r for r in other}
    shared = sorted(base_by_id.keys() & other_by_id.keys())
    pairs = [(base_by_id[q], other_by_id[q]) for q in shared]
    by_kind: dict[str, list[tuple[AnswerRecord, AnswerRecord]]] = defaultdict(list)
    right_base: dict[str, list[int]] = defaultdict(list)
    right_other: dict[str, list[int]] = defaultdict(list)
    for b, o in pairs:
        by_kind[b.kind].append((b, o))
        if not (b.answered and o.answered):
            continue  # an error is neither right nor wrong
        if b.correct and not o.correct:
            right_base[b.kind].append(b.question_id)
        elif o.correct and not b.correct:
            right_other[b.kind].append(b.question_id)
    order = kind_order(by_kind, kinds)
    return RunComparison(
        asked_of_both=len(shared),
        only_base=len(base_by_id) - len(shared),
        only_other=len(other_by_id) - len(shared),
        overall=_paired_kind(pairs),
        kinds={kind: _paired_kind(by_kind[kind]) for kind in order},
        right_only_in_base={k: right_base[k] for k in order if right_base.get(k)},
        right_only_in_other={k: right_other[k] for k in order if right_other.get(k)},
    )


# --- confusion matrices ------------------------------------------------------------------


@dataclass(frozen=True)
class Confusion:
    """counts[i][j]: questions whose right answer is labels[i] answered labels[j]; the last
    column (`unparsed`) counts answers that named no choice."""

    labels: list[str]
    counts: list[list[int]]
    unparsed: list[int]

    @property
    def total(self) -> int:
        return sum(map(sum, self.counts)) + sum(self.unparsed)


def confusion_matrices(
    records: Iterable[AnswerRecord], *, kinds: Sequence[str] = ()
) -> dict[str, Confusion]:
    """One matrix per kind, its labels every choice the kind's questions offered, in a
    natural order (0, 1, 2, 3+; 0-9; names alphabetically)."""
    by_kind: dict[str, list[AnswerRecord]] = defaultdict(list)
    for record in records:
        by_kind[record.kind].append(record)
    matrices = {}
    for kind in kind_order(by_kind, kinds):
        rows = by_kind[kind]
        labels = sorted({c for r in rows for c in (*r.choices, r.answer)}, key=label_key)
        place = {label: i for i, label in enumerate(labels)}
        counts = [[0] * len(labels) for _ in labels]
        unparsed = [0] * len(labels)
        for r in rows:
            i = place[r.answer]
            j = place.get(r.choice)
            if j is None:  # nothing parsed (a choice is always one of the question's)
                unparsed[i] += 1
            else:
                counts[i][j] += 1
        matrices[kind] = Confusion(labels=labels, counts=counts, unparsed=unparsed)
    return matrices


_NUMBER = re.compile(r"^(\d+)(\+?)$")


def label_key(label: str) -> tuple[int, int, str]:
    """Numbers first in numeric order ("3+" after "3"), then words alphabetically."""
    match = _NUMBER.match(label)
    if match:
        return (0, int(match.group(1)) * 2 + bool(match.group(2)), "")
    return (1, 0, label.lower())
