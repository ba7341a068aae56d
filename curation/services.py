"""Writes for datasets: save filters, add turns to their include lists, create versions, run
a version's export."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

from django.core.files import File
from django.core.files.storage import default_storage
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.text import slugify

from curation.export_options import ExportOptions
from curation.exporting import (
    ExportEmpty,
    ExportRefused,
    ExportResult,
    export_count,
    export_files,
)
from curation.exporting.files import sinks_left_remove
from curation.hf_export import HFResult, write_hf_dataset, zip_directory
from curation.jobs import EXPORT
from curation.models import Dataset, DatasetVersion
from curation.preferences import export_preference_files
from curation.row_formats import row_format
from rollouts.models import REVIEW_PERMISSION, RolloutBatch
from rollouts.recording.frame_store import FrameMissing
from rollouts.review.services import TurnCollection, turn_collection_register
from rollouts.review.turn_selection import (
    INCLUDE_TURNS_MAX,
    FilterError,
    TurnSelection,
    turns_selected,
)
from studio.claims import Claim
from studio.errors import plain_error
from studio.jobs import JobOutcome

logger = logging.getLogger(__name__)

MAX_ERROR_LINES = 200


def rows_export(
    *,
    filters: TurnSelection,
    options: ExportOptions,
    output: Path,
    val_output: Path | None = None,
    progress=None,
) -> ExportResult:
    """The JSONL export of either kind: a row per turn, or a row per preference pair."""
    export = export_preference_files if options.kind == "preference" else export_files
    return export(
        filters=filters, options=options, output=output, val_output=val_output, progress=progress
    )


def hf_card(*, filters: TurnSelection, options: ExportOptions, title: str = "") -> dict:
    """What the dataset card says about where the data came from."""
    batch_ids = sorted(
        set(turns_selected(filters).values_list("episode__batch_id", flat=True).distinct())
    )
    batches = RolloutBatch.objects.filter(id__in=batch_ids).order_by("id")
    return {
        "title": title,
        "filter": filters.to_json(),
        "export_options": {
            "kind": options.kind,
            "history_frames": options.history_frames,
            "val_fraction": options.val_fraction,
        },
        "batches": [{"id": b.id, "name": b.name, "policy": b.policy} for b in batches],
        "models": sorted({b.model for b in batches if b.model}),
    }


def hf_export(
    *,
    filters: TurnSelection,
    options: ExportOptions,
    output: Path,
    tool_calls_as_text: bool = False,
    progress=None,
    title: str = "",
    shard_bytes: int | None = None,
) -> HFResult:
    """A Hugging Face dataset in `output`: the studio-format rows, then parquet and Arrow."""
    options = dataclasses.replace(options, format="studio")  # the rows keep their metadata
    with tempfile.TemporaryDirectory(prefix=".tmp-hf-rows-", dir=output.parent) as tmp:
        train, val = Path(tmp, "train.jsonl"), Path(tmp, "val.jsonl")
        result = rows_export(
            filters=filters,
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
            kind=options.kind,
            tool_calls_as_text=tool_calls_as_text,
            card=hf_card(filters=filters, options=options, title=title),
            **extra,
        )


def dataset_create(
    *,
    name: str,
    filters: TurnSelection,
    options: ExportOptions,
    description: str = "",
    created_by=None,
) -> Dataset:
    """Refused with a ValidationError (nothing written) by the model's own rules: a name of
    1-200 characters, a filter and options that read back."""
    dataset = Dataset(
        name=name,
        description=description,
        filters=filters.to_json(),
        export_options=options.to_json(),
        created_by=created_by,
    )
    dataset.full_clean()
    dataset.save()
    return dataset


def dataset_include_clear(*, dataset: Dataset) -> int:
    """Empty the dataset's include list (the turns added from the turn list); how many it had.
    Exported versions keep their own snapshot."""
    with transaction.atomic():
        # Locked as `dataset_include_add` locks it: an addition at the same time is not lost.
        locked = Dataset.objects.select_for_update().get(pk=dataset.pk)
        filters = TurnSelection.from_json(locked.filters)
        locked.filters = dataclasses.replace(filters, include_turns=()).to_json()
        locked.save(update_fields=["filters", "updated_at"])
    dataset.refresh_from_db(fields=["filters", "updated_at"])
    return len(filters.include_turns)


def dataset_update(
    *,
    dataset: Dataset,
    name: str,
    filters: TurnSelection,
    options: ExportOptions,
    description: str = "",
) -> Dataset:
    # Versions keep their own snapshot: editing the filter never changes what was exported.
    # The form does not show the include list (turns added from the turn list): a filter
    # saved without one keeps the dataset's.
    if not filters.include_turns:
        kept = TurnSelection.from_json(dataset.filters).include_turns
        filters = dataclasses.replace(filters, include_turns=kept)
    dataset.name = name
    dataset.description = description
    dataset.filters = filters.to_json()
    dataset.export_options = options.to_json()
    dataset.save()
    return dataset


def dataset_include_add(*, dataset: Dataset, selection: TurnSelection) -> int:
    """Append the turns `selection` matches to the dataset's include list (turns it keeps
    whatever its other filters say); how many were not in it yet. Its versions keep their
    snapshots. Refused past INCLUDE_TURNS_MAX turns in the list, nothing written."""
    with transaction.atomic():
        # Locked: two additions at once both end up in the list.
        locked = Dataset.objects.select_for_update().get(pk=dataset.pk)
        filters = TurnSelection.from_json(locked.filters)
        have = set(filters.include_turns)
        picked = turns_selected(selection).order_by("id").values_list("id", flat=True)
        # One more than could fit: enough to tell "too many" without reading millions.
        ids = list(picked[: INCLUDE_TURNS_MAX + 1])
        new = [i for i in ids if i not in have]
        if len(have) + len(new) > INCLUDE_TURNS_MAX:
            picked_more = (
                f"more than {INCLUDE_TURNS_MAX:,}"
                if len(ids) > INCLUDE_TURNS_MAX
                else f"{len(new):,} more"
            )
            raise ValueError(
                f"include list: a dataset includes at most {INCLUDE_TURNS_MAX:,} turns by hand; "
                f"{dataset.name!r} has {len(have):,} and {picked_more} were picked: "
                "narrow the filter"
            )
        if new:
            filters = dataclasses.replace(filters, include_turns=(*filters.include_turns, *new))
            locked.filters = filters.to_json()
            locked.save(update_fields=["filters", "updated_at"])
    dataset.refresh_from_db(fields=["filters", "updated_at"])
    return len(new)


def _datasets_to_add_to() -> list[tuple[int, str]]:
    return list(Dataset.objects.order_by("-updated_at", "-id").values_list("id", "name")[:200])


def _dataset_include_add_by_id(*, target_id: int, selection: TurnSelection, user=None) -> int:
    dataset = Dataset.objects.filter(id=target_id).first()
    if dataset is None:
        raise ValueError(f"dataset: there is no dataset {target_id}")
    try:
        return dataset_include_add(dataset=dataset, selection=selection)
    except FilterError as exc:
        raise ValueError(str(exc)) from exc


# The turn list's "add to dataset" (rollouts offers it without importing this app).
turn_collection_register(
    TurnCollection(
        noun="dataset",
        permission=REVIEW_PERMISSION,
        choices=_datasets_to_add_to,
        add=_dataset_include_add_by_id,
        most=INCLUDE_TURNS_MAX,
    )
)


def dataset_version_create(
    *, dataset: Dataset, created_by=None, enqueue: bool = True
) -> DatasetVersion:
    """A pending version with the dataset's filter as it is now; exported by a Celery task."""
    with transaction.atomic():
        # Lock the dataset row: two clicks never get the same version number.
        locked = Dataset.objects.select_for_update().get(pk=dataset.pk)
        last = locked.versions.aggregate(n=Max("number"))["n"] or 0
        version = DatasetVersion.objects.create(
            dataset=locked,
            number=last + 1,
            filters=TurnSelection.from_json(locked.filters).to_json(),
            export_options=ExportOptions.from_json(locked.export_options).to_json(),
            created_by=created_by,
            # Without enqueue the caller exports it; the periodic requeue leaves it alone.
            enqueued_at=None if enqueue else timezone.now(),
        )
        if enqueue:
            EXPORT.enqueue_on_commit(version.id)
    return version


def version_file_names(version: DatasetVersion) -> tuple[str, str]:
    base = _version_base(version)
    return f"{base}.jsonl", f"{base}.val.jsonl"


def dataset_version_export(*, version_id: int) -> JobOutcome:
    """Claim a pending version and export it. Safe to run twice: the claim decides."""
    token = EXPORT.claim(version_id, progress_rows=0, error="")
    if token is None:
        return EXPORT.unclaimed(version_id)
    version = DatasetVersion.objects.get(id=version_id)
    claim = EXPORT.held(version_id, token)
    # Renewed all along, so its stale window (STUDIO_EXPORT_STALE_SECONDS) need only say how
    # long a dead worker goes unnoticed, not how long a phase may go without progress.
    with claim.kept():
        return _version_export_claimed(version, claim)


def _version_export_claimed(version: DatasetVersion, claim: Claim) -> JobOutcome:
    version_id = version.id
    try:
        _attempt_leftovers_remove(version)
        filters = TurnSelection.from_json(version.filters)
        options = ExportOptions.from_json(version.export_options)
        total = export_count(filters)
        claim.renew(total_rows=total)

        def progress(done: int) -> None:
            claim.renew(progress_rows=min(done, total))

        name, val_name = version_file_names(version)
        with _local_targets(name, val_name, prefix=_export_temp_prefix(version)) as (
            path,
            val_path,
        ):
            result = rows_export(
                filters=filters,
                options=options,
                output=path,
                val_output=val_path if options.val_fraction > 0 else None,
                progress=progress,
            )
            _store(path, name)
            if result.val is not None:
                _store(val_path, val_name)
            sources = {"train": path, **({"val": val_path} if result.val is not None else {})}
            hf = _version_hf(version=version, filters=filters, options=options, sources=sources)
    except ExportEmpty as exc:
        _version_fail(claim, str(exc).replace("pass --allow-empty", 'tick "Allow empty"'))
        return "failed"
    except FrameMissing as exc:  # the data's fault, not the code's: no traceback logged
        _version_fail(claim, f"{exc}; restore it, or leave its episode out of the dataset")
        return "failed"
    except ExportRefused as exc:
        lines = exc.lines()
        shown = lines[:MAX_ERROR_LINES]
        more = f"\n... and {len(lines) - len(shown)} more" if len(lines) > len(shown) else ""
        _version_fail(claim, f"{exc}\n" + "\n".join(shown) + more)
        return "failed"
    except Exception as exc:  # a poison version is set aside with its error, never retried
        logger.exception("dataset version %s export failed", version_id)
        _version_fail(claim, plain_error(exc))
        return "failed"
    split: dict = {"val_fraction": options.val_fraction, "warnings": result.warnings()}
    if result.val is not None:
        split["val"] = {
            "file": val_name,
            "sha256": result.val.sha256,
            "rows": result.val.rows,
            "episodes": result.val.episodes,
            "images": result.val.images,
            "bytes": result.val.bytes,
        }
    scanned = max(total, result.train.rows + (result.val.rows if result.val else 0))
    claim.finish(
        file=name,
        sha256=result.train.sha256,
        bytes=result.train.bytes,
        rows=result.train.rows,
        episodes=result.train.episodes,
        images=result.train.images,
        estimated_tokens=result.train.estimated_tokens
        + (result.val.estimated_tokens if result.val else 0),
        split=split,
        hf_file=hf["file"],
        hf_sha256=hf["sha256"],
        hf_bytes=hf["bytes"],
        total_rows=scanned,
        progress_rows=scanned,
    )
    return "done"


def _version_hf(
    *,
    version: DatasetVersion,
    filters: TurnSelection,
    options: ExportOptions,
    sources: dict[str, Path],
) -> dict:
    """The version as a Hugging Face dataset for TRL, zipped and stored beside its JSONL.

    Rows of a format that says `hf_as_written` (the studio's) are converted as written (so
    it is exactly the version's content); others are exported again in the studio format.
    """
    title = f"{version.dataset.name} v{version.number}"
    folder = f"{slugify(version.dataset.name) or 'dataset'}-v{version.number}-hf"
    with tempfile.TemporaryDirectory(prefix=_hf_temp_prefix(version)) as tmp:
        output = Path(tmp, folder)
        if row_format(options.format).hf_as_written:
            write_hf_dataset(
                sources=sources,
                output=output,
                kind=options.kind,
                card=hf_card(filters=filters, options=options, title=title),
            )
        else:
            hf_export(filters=filters, options=options, output=output, title=title)
        archive = Path(tmp, "hf.zip")
        digest = zip_directory(output, archive)
        size = archive.stat().st_size
        with open(archive, "rb") as fh:
            name = default_storage.save(f"{_version_base(version)}.hf.zip", File(fh, name="hf.zip"))
    return {"file": name, "sha256": digest, "bytes": size}


def _version_fail(claim: Claim, error: str) -> None:
    claim.fail(error)


def _studio_tag() -> str:
    """This studio's database, in a temporary folder's name: two studios on one host (a test
    run beside another, a demo beside production) number their versions alike, and one must
    never remove the other's folders as leftovers."""
    name = str(connection.settings_dict["NAME"])
    return hashlib.sha256(f"{connection.vendor}:{name}".encode()).hexdigest()[:10]


def _hf_temp_prefix(version: DatasetVersion) -> str:
    return f"studio-hf-{_studio_tag()}-v{version.id}-"


def _export_temp_prefix(version: DatasetVersion) -> str:
    return f"studio-export-{_studio_tag()}-v{version.id}-"


def _attempt_leftovers_remove(version: DatasetVersion) -> None:
    """What an earlier attempt at this version left when its worker was killed: temporary
    files beside its JSONL files, temporary folders on this host, a Hugging Face archive
    stored but never recorded (saved again, it would have gone under another name, and the
    first one stayed forever). Run by the attempt holding the claim, so no live attempt
    writes them; nothing of a finished version is touched (a version is exported once).

    A killed attempt's folders in another host's temporary folder are that host's: they
    stay there (the system's temporary-file cleaning removes them)."""
    name, val_name = version_file_names(version)
    try:
        for target in (name, val_name):
            sinks_left_remove(Path(default_storage.path(target)))
    except NotImplementedError:  # remote storage: the files were written in a temp folder
        pass
    for prefix in (_hf_temp_prefix(version), _export_temp_prefix(version)):
        for leftover in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
            shutil.rmtree(leftover, ignore_errors=True)
    for stored in (name, val_name, f"{_version_base(version)}.hf.zip"):
        if default_storage.exists(stored):
            default_storage.delete(stored)


def _version_base(version: DatasetVersion) -> str:
    return f"exports/dataset-{version.dataset_id}/v{version.number}"


class _local_targets:
    """Local paths to export to: in storage itself when it is a filesystem, else a temp dir."""

    def __init__(self, name: str, val_name: str, *, prefix: str) -> None:
        self.names = (name, val_name)
        self.prefix = prefix
        self.tmpdir: str | None = None

    def __enter__(self) -> tuple[Path, Path]:
        try:
            return tuple(Path(default_storage.path(n)) for n in self.names)  # type: ignore[return-value]
        except NotImplementedError:
            self.tmpdir = tempfile.mkdtemp(prefix=self.prefix)
            return Path(self.tmpdir, "train.jsonl"), Path(self.tmpdir, "val.jsonl")

    def __exit__(self, *exc: object) -> None:
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def _store(path: Path, name: str) -> None:
    """Remote storage gets the finished file uploaded; local storage already has it."""
    try:
        if Path(default_storage.path(name)) == path:
            return
    except NotImplementedError:
        pass
    with open(path, "rb") as fh:
        default_storage.save(name, File(fh, name=Path(name).name))
