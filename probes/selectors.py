"""Reads for the probe pages: sets and runs, a set's answer distribution, a run's answers,
two runs paired on their questions, the perception leaderboard.

The statistics themselves (accuracy, intervals, chance, the paired difference, confusion
matrices) are `probes.results`; this module only fetches what it needs, in few queries.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count, Min, Q, QuerySet

from probes import results
from probes.models import ProbeAnswer, ProbeQuestion, ProbeRun, ProbeSet
from probes.selectors_runs import run_answer_records
from studio.jobs import most_at_once

# One answer wins at least this share of a kind: the kind measures little (`docs/probes.md`,
# "Balancing").
DOMINANT_SHARE = 0.8
ACTIVE = (ProbeRun.Status.PENDING, ProbeRun.Status.RUNNING)


def sets_newest() -> QuerySet[ProbeSet]:
    return (
        ProbeSet.objects.select_related("created_by")
        .annotate(runs_count=Count("runs"))
        .order_by("-created_at", "-id")
    )


def runs_newest(*, probe_set: ProbeSet | None = None) -> QuerySet[ProbeRun]:
    runs = ProbeRun.objects.select_related("probe_set", "created_by").order_by("-created_at", "-id")
    return runs.filter(probe_set=probe_set) if probe_set is not None else runs


def set_get(*, set_id: int) -> ProbeSet:
    return ProbeSet.objects.get(id=set_id)


def run_questions_at_once(*, run: ProbeRun) -> int:
    """How many questions the run had in flight at once, at most: a chunk asks one at a
    time, so as many as chunks asked at once (`studio.jobs.most_at_once`)."""
    return most_at_once(run.chunks.all())


def run_get(*, run_id: int) -> ProbeRun:
    return ProbeRun.objects.select_related("probe_set", "created_by").get(id=run_id)


def answer_get(*, answer_id: int) -> ProbeAnswer:
    return ProbeAnswer.objects.select_related("run").get(id=answer_id)


def run_is_active(run: ProbeRun) -> bool:
    return run.status in ACTIVE


@dataclass(frozen=True)
class AnswerShare:
    answer: str
    count: int
    percent: float


@dataclass(frozen=True)
class KindDistribution:
    """How a kind's right answers fall: the picture of a set's balance."""

    kind: str
    questions: int
    shares: list[AnswerShare]  # in the answers' order: 0, 1, 2, 3+; words alphabetically
    subjects: list[tuple[str, int]] = field(default_factory=list)  # (subject, questions)

    @property
    def top(self) -> AnswerShare | None:
        """The answer right most often (the first of them in order, on a tie)."""
        return max(self.shares, key=lambda s: s.count, default=None)

    @property
    def dominated(self) -> bool:
        """One answer is right on DOMINANT_SHARE of the kind's questions or more: answering
        it always scores that much without looking."""
        top = self.top
        return (
            top is not None and self.questions > 0 and top.count >= DOMINANT_SHARE * self.questions
        )


def _answer_order(answer: str) -> tuple[int, str]:
    """Numbers in their order (0, 1, 2, 3+, ..., 10), then words alphabetically."""
    digits = answer.rstrip("+")
    return (int(digits), answer) if digits.isdigit() else (10**9, answer)


def set_distributions(*, probe_set: ProbeSet) -> list[KindDistribution]:
    """Each kind of the set, in the set's order, with the share of each right answer (from the
    counts stored on the set) and its subjects (one query)."""
    subjects: dict[str, list[tuple[str, int]]] = defaultdict(list)
    rows = (
        ProbeQuestion.objects.filter(probe_set=probe_set)
        .exclude(subject="")
        .values_list("kind", "subject")
        .annotate(n=Count("id"))
        .order_by("kind", "subject")
    )
    for kind, subject, n in rows:
        subjects[kind].append((subject, n))
    stored = probe_set.answers if isinstance(probe_set.answers, dict) else {}
    kinds = [k for k in (probe_set.kinds or []) if isinstance(k, str)]
    kinds += [k for k in stored if k not in kinds]
    out = []
    for kind in kinds:
        counts = stored.get(kind) or {}
        counts = {str(a): int(n) for a, n in counts.items() if isinstance(n, int) and n > 0}
        total = sum(counts.values())
        shares = sorted(
            (AnswerShare(a, n, 100.0 * n / total) for a, n in counts.items()),
            key=lambda s: _answer_order(s.answer),
        )
        out.append(KindDistribution(kind, total, shares, subjects.get(kind, [])))
    return out


# --- a run's answers ---------------------------------------------------------------------

ANSWER_SHOWS = {
    "wrong": "wrong answers",  # answered, not right: an error is not wrong (`results.is_error`)
    "all": "every answer",
    "flagged": "flagged",
    "errors": "errors",
    "right": "right answers",
}


def run_answers(*, run: ProbeRun, show: str = "wrong", kind: str = "") -> QuerySet[ProbeAnswer]:
    """A run's answers in the set's order, with their question and frame, narrowed by `show`
    (a key of ANSWER_SHOWS) and a kind ("" for every kind)."""
    answers = ProbeAnswer.objects.filter(run=run).select_related(
        "question", "question__frame", "question__turn"
    )
    conditions = {
        "wrong": Q(correct=False, error_kind=""),
        "right": Q(correct=True),
        "flagged": Q(flagged=True),
        "errors": ~Q(error_kind=""),
        "all": Q(),
    }
    answers = answers.filter(conditions.get(show, Q()))
    if kind:
        answers = answers.filter(question__kind=kind)
    return answers.order_by("question__index", "id")


def run_answer_counts(*, run: ProbeRun) -> dict[str, int]:
    """How many answers each of ANSWER_SHOWS lists (the filter's labels), in one query."""
    row = ProbeAnswer.objects.filter(run=run).aggregate(
        all=Count("id"),
        right=Count("id", filter=Q(correct=True)),
        wrong=Count("id", filter=Q(correct=False, error_kind="")),
        flagged=Count("id", filter=Q(flagged=True)),
        errors=Count("id", filter=~Q(error_kind="")),
    )
    return {key: row[key] or 0 for key in ANSWER_SHOWS}


def run_error_kinds(*, run: ProbeRun) -> list[tuple[str, int]]:
    """What its errors were (`error_kind`, how many), most first."""
    rows = (
        ProbeAnswer.objects.filter(run=run)
        .exclude(error_kind="")
        .values_list("error_kind")
        .annotate(n=Count("id"))
        .order_by("-n", "error_kind")
    )
    return list(rows)


def runs_on_set(*, probe_set_id: int, exclude: int | None = None) -> QuerySet[ProbeRun]:
    """The runs a run can be compared with: the other runs of its set, newest first."""
    runs = ProbeRun.objects.filter(probe_set_id=probe_set_id).order_by("-created_at", "-id")
    return runs.exclude(id=exclude) if exclude is not None else runs


# --- the perception leaderboard -----------------------------------------------------------


def sets_with_finished_runs() -> QuerySet[ProbeSet]:
    return (
        ProbeSet.objects.filter(runs__status=ProbeRun.Status.DONE)
        .distinct()
        .order_by("-created_at", "-id")
    )


def set_examples(*, probe_set: ProbeSet) -> list[ProbeQuestion]:
    """The first question of each kind (and subject), with its frame: what the set asks."""
    firsts = (
        ProbeQuestion.objects.filter(probe_set=probe_set)
        .values("kind", "subject")
        .annotate(first=Min("index"))
        .order_by()
    )
    indexes = [row["first"] for row in firsts]
    questions = ProbeQuestion.objects.filter(probe_set=probe_set, index__in=indexes)
    return list(questions.select_related("frame").order_by("index")[:200])


@dataclass(frozen=True)
class DifferingQuestion:
    question: ProbeQuestion
    base: ProbeAnswer
    other: ProbeAnswer


def differing_questions(
    *, base: ProbeRun, other: ProbeRun, question_ids: list[int], limit: int
) -> list[DifferingQuestion]:
    """The first `limit` of these questions in the set's order, with both runs' answers."""
    questions = list(
        ProbeQuestion.objects.filter(id__in=question_ids)
        .select_related("frame")
        .order_by("index")[:limit]
    )
    ids = [q.id for q in questions]
    answers = {
        (a.run_id, a.question_id): a
        for a in ProbeAnswer.objects.filter(run__in=(base, other), question_id__in=ids)
    }
    return [
        DifferingQuestion(q, answers[(base.id, q.id)], answers[(other.id, q.id)])
        for q in questions
        if (base.id, q.id) in answers and (other.id, q.id) in answers
    ]


def best_runs(*, probe_set: ProbeSet) -> list[ProbeRun]:
    """The set's best finished run of each (model, observation): a ranked one first (see
    `results.Tally.ranked`), then the most right of those answered, then the most answered
    (the older run, on a tie)."""
    best: dict[tuple[str, str], ProbeRun] = {}
    runs = ProbeRun.objects.filter(probe_set=probe_set, status=ProbeRun.Status.DONE).order_by("id")
    for run in runs:
        key = (run.model, run.observation)
        held = best.get(key)
        if held is None or run.tally.standing() > held.tally.standing():
            best[key] = run
    return list(best.values())


@dataclass(frozen=True)
class BoardRow:
    run: ProbeRun
    overall: results.Accuracy
    kinds: list[results.Accuracy | None]  # in the board's kind order; None: not asked


@dataclass(frozen=True)
class Board:
    probe_set: ProbeSet
    kinds: list[str]
    chance: list[float | None]  # per kind, a fraction
    overall_chance: float | None
    rows: list[BoardRow]  # ranked, best first
    # Runs whose accuracy cannot stand beside the others' (errors past the limit, or nothing
    # answered): listed apart, most errors last.
    unranked: list[BoardRow]


def perception_board(*, probe_set: ProbeSet) -> Board:
    """A set's perception leaderboard: its best runs (`best_runs`) measured per kind."""
    measured = [
        (run, results.run_results(run_answer_records(run_id=run.id), kinds=probe_set.kinds))
        for run in best_runs(probe_set=probe_set)
    ]
    kinds = results.kind_order({k for _, m in measured for k in m.kinds}, probe_set.kinds or [])
    every = [BoardRow(run, m.overall, [m.kinds.get(k) for k in kinds]) for run, m in measured]
    rows = sorted(
        (r for r in every if r.overall.ranked),
        key=lambda r: (r.overall.standing(), -r.run.id),
        reverse=True,
    )
    unranked = sorted(
        (r for r in every if not r.overall.ranked),
        key=lambda r: (r.overall.error_share, -r.overall.answered, r.run.id),
    )
    # Chance on the questions the best ranked run answered (any run's, when none is).
    chance = [_first_chance(r.kinds[i] for r in rows + unranked) for i in range(len(kinds))]
    overall_chance = _first_chance(r.overall for r in rows + unranked)
    return Board(probe_set, kinds, chance, overall_chance, rows, unranked)


def _first_chance(accuracies) -> float | None:
    return next((a.chance for a in accuracies if a is not None and a.chance is not None), None)
