"""Probe sets: a selection of recorded turns -> their frames -> questions, written at once.

`probe_set_create` is the one writer: the `probe_set` command, the pages and the benchmark
call it. The selection is the turn filter datasets use (`TurnSelection`), so a set can be
made from a batch, a dataset's filters or anything the turn list selects.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from django.db import transaction

from probes import questions as q
from probes.models import ProbeQuestion, ProbeSet
from rollouts.models import Frame, Turn
from rollouts.review.turn_selection import TurnSelection, turns_selected
from studio.row_copy import copy_rows
from studio.untrusted import storable

# Frames and texts are read this many at a time: a text observation is ~1 KB.
READ_CHUNK = 1000
# At most this many questions in one set (a bound on one transaction and one page's counts).
MAX_QUESTIONS = 1_000_000


class ProbeSetError(ValueError):
    """The set cannot be made as asked (an unknown kind, nothing selected); one line."""


@dataclass(frozen=True, slots=True)
class _Candidate:
    frame_id: int
    turn_id: int
    episode_id: int
    step: int


def probe_set_create(
    *,
    filters: TurnSelection,
    kinds: Sequence[str] | None = None,
    seed: int = 0,
    per_episode: int | None = None,
    balance: bool = False,
    name: str = "",
    created_by=None,
    progress: Callable[[int], None] | None = None,
) -> ProbeSet:
    """A probe set of the frames `filters` selects (those a turn with a text observation
    showed): `per_episode` frames of each episode (a sample seeded by `seed`; None: every
    one), asked the questions of `kinds` (None: every kind), balanced on request
    (`questions.balanced_indices`). The same selection, kinds, seed and options give the
    same questions in the same order with the same choices. Raises ProbeSetError (nothing
    written) on an unknown kind or when nothing is selected."""
    try:
        chosen_kinds = q.kinds_checked(kinds)
    except q.QuestionError as exc:
        raise ProbeSetError(str(exc)) from exc
    if per_episode is not None and per_episode < 1:
        raise ProbeSetError(f"per-episode: {per_episode} is not a positive number of frames")
    # A name typed on a form or a command line: storable (no NUL), and within the column.
    name = storable(name, max_bytes=800).strip()[:200]

    drafts = _drafts(
        filters,
        kinds=chosen_kinds,
        per_episode=per_episode,
        seed=seed,
        balance=balance,
        progress=progress,
    )
    answers = q.answer_counts((d.kind, d.answer) for _, d in drafts)
    with transaction.atomic():
        probe_set = ProbeSet.objects.create(
            name=name,
            seed=seed,
            kinds=list(chosen_kinds),
            per_episode=per_episode,
            balanced=balance,
            filters=filters.to_json(),
            questions_count=len(drafts),
            frames_count=len({f.frame_id for f, _ in drafts}),
            episodes_count=len({f.episode_id for f, _ in drafts}),
            answers=answers,
            created_by=created_by,
        )
        copy_rows(
            [
                ProbeQuestion(
                    probe_set_id=probe_set.id,
                    index=index,
                    frame_id=frame.frame_id,
                    turn_id=frame.turn_id,
                    episode_id=frame.episode_id,
                    kind=question.kind,
                    subject=question.subject,
                    text=question.text,
                    choices=list(question.choices),
                    answer=question.answer,
                )
                for index, (frame, question) in enumerate(drafts)
            ]
        )
    return probe_set


def _drafts(
    filters: TurnSelection,
    *,
    kinds: Sequence[str],
    per_episode: int | None,
    seed: int,
    balance: bool,
    progress: Callable[[int], None] | None,
) -> list[tuple[_Candidate, q.Question]]:
    """The set's questions, each with its frame, in their order (balanced on request);
    ProbeSetError when there are none, or too many."""
    by_episode = _candidates(filters)
    if not by_episode:
        raise ProbeSetError("selection: no frame of the selected turns has a text observation")
    drafts: list[tuple[_Candidate, q.Question]] = []
    for frame, state, view in _frames_read(by_episode, per_episode=per_episode, seed=seed):
        for question in q.frame_questions(
            state=state, view=view, kinds=kinds, seed=seed, frame_key=frame.frame_id
        ):
            drafts.append((frame, question))
        if len(drafts) > MAX_QUESTIONS:
            # Said before a whole table of turns is read into questions, not after.
            raise ProbeSetError(
                f"selection: more than {MAX_QUESTIONS:,} questions in one set; narrow it or "
                "pass --per-episode"
            )
        if progress is not None:
            progress(len(drafts))
    if not drafts:
        raise ProbeSetError(
            "selection: none of its frames has a game state and text local view to ask about"
        )
    if balance:
        keep = q.balanced_indices([(d.kind, d.answer) for _, d in drafts], seed=seed)
        drafts = [drafts[i] for i in keep]
        if not drafts:
            raise ProbeSetError(
                "balance: every kind asked has a single answer on these frames; "
                "nothing is left to balance"
            )
    return drafts


def _candidates(filters: TurnSelection) -> dict[int, list[_Candidate]]:
    """{episode id: its frames that a selected turn with a text observation showed, by
    step}, each with the first such turn (the frame's text control)."""
    rows = (
        turns_selected(filters)
        .exclude(observation_text="")
        .order_by("episode_id", "frame__step", "index")
        .values_list("frame_id", "id", "episode_id", "frame__step")
    )
    by_episode: dict[int, list[_Candidate]] = {}
    seen: set[int] = set()
    for frame_id, turn_id, episode_id, step in rows.iterator(chunk_size=10_000):
        if frame_id in seen:
            continue  # several turns showed it (several actions a turn): the first one's text
        seen.add(frame_id)
        by_episode.setdefault(episode_id, []).append(
            _Candidate(frame_id, turn_id, episode_id, step)
        )
    return by_episode


_Usable = tuple[_Candidate, dict, list[list[str]]]


def _frames_read(
    by_episode: dict[int, list[_Candidate]], *, per_episode: int | None, seed: int
) -> Iterable[_Usable]:
    """The frames to ask about, episode by episode and by step, with their state and local
    view; frames without a usable state or view (imported ones) are passed over.

    With `per_episode`, each episode's frames are taken in an order shuffled by the seed and
    the episode, until `per_episode` of them can be asked about; then put back in step
    order."""
    if per_episode is None:
        chosen = [c for episode in sorted(by_episode) for c in by_episode[episode]]
        yield from _with_texts(chosen)
        return
    picked: dict[int, list[_Usable]] = {}
    queues = {}
    for episode in sorted(by_episode):
        order = list(by_episode[episode])
        random.Random(f"{seed}:frames:{episode}").shuffle(order)
        queues[episode] = order
        picked[episode] = []
    wanted = {episode: per_episode for episode in queues}
    while wanted:
        batch = []
        for episode, missing in wanted.items():
            batch.extend(queues[episode][:missing])
            queues[episode] = queues[episode][missing:]
        for usable in _with_texts(batch):
            picked[usable[0].episode_id].append(usable)
        wanted = {
            episode: per_episode - len(picked[episode])
            for episode in wanted
            if len(picked[episode]) < per_episode and queues[episode]
        }
    for episode in sorted(picked):
        yield from sorted(picked[episode], key=lambda pair: pair[0].step)


def _with_texts(candidates: list[_Candidate]) -> Iterable[_Usable]:
    """Each usable candidate with its frame's state and its turn's local view, in order."""
    for start in range(0, len(candidates), READ_CHUNK):
        chunk = candidates[start : start + READ_CHUNK]
        states = dict(
            Frame.objects.filter(id__in=[c.frame_id for c in chunk]).values_list("id", "state")
        )
        texts = dict(
            Turn.objects.filter(id__in=[c.turn_id for c in chunk]).values_list(
                "id", "observation_text"
            )
        )
        for candidate in chunk:
            state = states.get(candidate.frame_id)
            text = texts.get(candidate.turn_id)
            if not isinstance(state, dict) or text is None or not q.state_usable(state):
                continue
            view = q.local_view(text)
            if view is not None:
                yield candidate, state, view
