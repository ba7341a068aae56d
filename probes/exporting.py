"""A probe set as training rows: visual question-answer rows in the formats turns export to.

Each question is one row: the messages a probe run sends for it with the frame as its image
(`probes.prompting.question_messages`, so a model trained on the rows is asked the same way
it is measured), and the right answer's letter as the assistant's reply (what the prompt asks
for: "Answer with one letter"; the choice's text is in the metadata). The
pieces are curation's: the image part (`RowBuilder.image_part`, exactly the stored PNG,
encoded once per frame however many questions it has), frames read ahead, the provider's
limits for `--format openai`, files written whole or not at all, the split by episode
(`episode_split`, the same hash as turns) and the Hugging Face writer.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from curation.export_options import ExportOptions
from curation.exporting import ExportResult
from curation.exporting.files import OutputFiles
from curation.exporting.frames_ahead import FramesAhead
from curation.exporting.provider_checks import ImageInfos, provider_checks
from curation.hf_export import HFResult, write_hf_dataset
from curation.jsonl import BuiltRow, FrameRef, RowBuilder, dumps, episode_split
from curation.probe_exports import ProbeSetExporter
from curation.row_formats import row_format
from curation.validation import CHARS_PER_TOKEN
from probes.models import ProbeQuestion, ProbeSet
from probes.prompting import answer_letter, question_messages
from rollouts.models import Episode
from rollouts.recording.frame_store import FrameStore

CHUNK_ROWS = 2000
IMAGE_DETAIL = "auto"
# The image part `question_messages` writes for an empty PNG: where the frame's goes.
_EMPTY_IMAGE_PART = dumps(
    {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,", "detail": IMAGE_DETAIL},
    }
)
_FIELDS = (
    "index",
    "kind",
    "subject",
    "text",
    "choices",
    "answer",
    "episode_id",
    "frame__sha256",
    "frame__image",
    "frame__step",
    "turn__index",
)


@dataclasses.dataclass(frozen=True, slots=True)
class _Question:
    index: int
    kind: str
    subject: str
    text: str
    choices: list[str]
    answer: str
    episode_id: int
    frame: FrameRef
    frame_step: int
    turn: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class _Episode:
    batch_id: int
    seed: int
    model: str
    policy: str


def probe_set_check(set_id: int) -> str:
    if not ProbeSet.objects.filter(id=set_id).exists():
        return f"probe-set: there is no probe set {set_id}"
    return ""


def probe_rows_export(
    *,
    set_id: int,
    options: ExportOptions,
    output: Path,
    val_output: Path | None = None,
    progress: Callable[[int], None] | None = None,
    chunk_size: int = CHUNK_ROWS,
    store: FrameStore | None = None,
) -> ExportResult:
    """The set's questions as JSONL rows in `options.format`; split by episode into
    `val_output` with `options.val_fraction`. Raises as a turn export does (ExportEmpty,
    ExportRefused), having written nothing."""
    probe_set = ProbeSet.objects.get(id=set_id)
    splitting = options.val_fraction > 0 and val_output is not None
    frames = FramesAhead(store or FrameStore())
    infos = ImageInfos(frames)
    files = OutputFiles(output=output, val_output=val_output if splitting else None)
    checks = provider_checks(options.format, infos, files=tuple(files.sinks))
    builder = RowBuilder(load_png=infos.read, row_format=options.format)
    with_metadata = row_format(options.format).with_metadata
    episodes = _episodes(probe_set)
    done = 0
    try:
        chunks = _chunks(_questions(probe_set, chunk_size), chunk_size)
        upcoming = next(chunks, None)
        if upcoming is not None:
            frames.ahead(q.frame.name for q in upcoming)
        while upcoming is not None:
            chunk, upcoming = upcoming, next(chunks, None)
            frames.ahead(q.frame.name for q in upcoming or [])
            for question in chunk:
                episode = episodes[question.episode_id]
                split = episode_split(
                    batch_id=episode.batch_id,
                    seed=episode.seed,
                    val_fraction=options.val_fraction if splitting else 0.0,
                )
                built = _row(builder, probe_set, question, episode, split, with_metadata)
                sink = files.sinks[split]
                text_chars = len(built.text) - built.image_chars
                image_tokens = checks.image_tokens(
                    built, split=split, row=sink.result.rows + 1, text_chars=text_chars
                )
                sink.result.estimated_tokens += text_chars // CHARS_PER_TOKEN + image_tokens
                sink.add(built.text, question.episode_id, len(built.images))
                done += 1
            if progress is not None:
                progress(done)
        files.check_not_empty(allow_empty=options.allow_empty)
        checks.finish(files)
        files.commit()
    except BaseException:
        files.discard()
        raise
    finally:
        frames.close()
    files.result.reports = list(checks.reports.values())
    return files.result


def probe_hf_export(
    *,
    set_id: int,
    options: ExportOptions,
    output: Path,
    progress: Callable[[int], None] | None = None,
    shard_bytes: int | None = None,
) -> HFResult:
    """The set as a Hugging Face dataset in `output`: its studio-format rows, then parquet
    and Arrow with the images embedded (`curation.hf_export`, kind "probe")."""
    options = dataclasses.replace(options, format="studio")  # the rows keep their metadata
    probe_set = ProbeSet.objects.get(id=set_id)
    with tempfile.TemporaryDirectory(prefix=".tmp-hf-rows-", dir=output.parent) as tmp:
        train, val = Path(tmp, "train.jsonl"), Path(tmp, "val.jsonl")
        result = probe_rows_export(
            set_id=set_id,
            options=options,
            output=train,
            val_output=val if options.val_fraction > 0 else None,
            progress=progress,
        )
        sources = {"train": train, **({"val": val} if result.val is not None else {})}
        extra = {"shard_bytes": shard_bytes} if shard_bytes else {}
        return write_hf_dataset(
            sources=sources,
            output=output,
            kind="probe",
            card={
                "title": probe_set.name or f"Probe set {probe_set.id}",
                "source": {
                    "probe_set": probe_set.id,
                    "seed": probe_set.seed,
                    "kinds": probe_set.kinds,
                    "balanced": probe_set.balanced,
                    "val_fraction": options.val_fraction,
                },
                "filter": probe_set.filters,
            },
            **extra,
        )


def _questions(probe_set: ProbeSet, chunk_size: int) -> Iterator[_Question]:
    rows = (
        ProbeQuestion.objects.filter(probe_set=probe_set)
        .order_by("index")
        .values_list(*_FIELDS)
        .iterator(chunk_size=chunk_size)
    )
    for index, kind, subject, text, choices, answer, episode, sha, name, step, turn in rows:
        yield _Question(
            index, kind, subject, text, choices, answer, episode, FrameRef(sha, name), step, turn
        )


def _episodes(probe_set: ProbeSet) -> dict[int, _Episode]:
    """Each episode of the set's questions: where it was played, for the split and metadata."""
    ids = ProbeQuestion.objects.filter(probe_set=probe_set).values("episode_id").distinct()
    rows = Episode.objects.filter(id__in=ids).values_list(
        "id", "batch_id", "seed", "batch__model", "batch__policy"
    )
    return {e: _Episode(b, s, m, p) for e, b, s, m, p in rows}


def _chunks(items: Iterator[_Question], size: int) -> Iterator[list[_Question]]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk


def _row(
    builder: RowBuilder,
    probe_set: ProbeSet,
    question: _Question,
    episode: _Episode,
    split: str,
    with_metadata: bool,
) -> BuiltRow:
    messages = question_messages(
        observation="image",
        text=question.text,
        choices=question.choices,
        png=b"",
        image_detail=IMAGE_DETAIL,
    )
    # The reply the prompt asks for (one letter); the choice's text is in the metadata.
    reply = answer_letter(question.choices, question.answer)
    messages.append({"role": "assistant", "content": reply})
    image = builder.image_part(question.frame, {"detail": IMAGE_DETAIL})
    head, found, tail = dumps(messages).partition(_EMPTY_IMAGE_PART)
    assert found, "question_messages wrote the image part in another shape"
    pieces = ['{"messages": ', head, image, tail]
    if with_metadata:
        pieces += [', "metadata": ', dumps(_metadata(probe_set, question, episode, split))]
    pieces.append("}\n")
    return BuiltRow(
        text="".join(pieces),
        images=((question.frame.sha256, "user", IMAGE_DETAIL),),
        user_has_image=True,
        assistant_has_image=False,
        has_answer=True,
        image_chars=len(image),
    )


def _metadata(
    probe_set: ProbeSet, question: _Question, episode: _Episode, split: str
) -> dict[str, Any]:
    return {
        "probe_set_id": probe_set.id,
        "question": question.index,
        "kind": question.kind,
        "subject": question.subject,
        "choices": question.choices,
        "answer": question.answer,
        "episode_id": question.episode_id,
        "batch_id": episode.batch_id,
        "seed": episode.seed,
        "frame_step": question.frame_step,
        "turn": question.turn,
        "model": episode.model,
        "policy": episode.policy,
        "user_has_image": True,
        "has_image": True,
        "split": split,
    }


EXPORTER = ProbeSetExporter(check=probe_set_check, jsonl=probe_rows_export, hf=probe_hf_export)
