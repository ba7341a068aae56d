"""The filter flags shared by `export_jsonl` and `export_hf`: declared once, read once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from curation.export_options import KINDS, ExportOptions, check_combination
from curation.models import Dataset
from curation.row_formats import command_help, format_names
from rollouts.review.turn_selection import (
    FilterError,
    TurnSelection,
    check_references,
    filter_kind,
    filter_of,
    turn_filters,
)
from studio.commands import usage_error


def command_filters() -> list[str]:
    """The filters the export commands take as flags (declared with `flag`), as field names."""
    return [f.name for f, spec in turn_filters() if spec.flag]


def add_filter_flag(parser, name: str) -> None:
    """One filter's flag, from its declaration. Not given, it is None: the filter's default
    applies, and `--dataset` can tell it was not given."""
    spec = filter_of(name)
    kind, many = filter_kind(name)
    kwargs: dict[str, Any] = {}
    if kind is bool:
        kwargs.update(action="store_true", default=None)
    elif many:
        # Items are checked by TurnSelection (one line naming the valid ones), not argparse.
        kwargs.update(nargs="+", action="extend")
        if kind is not str:
            kwargs["type"] = kind
    elif spec.choices:
        kwargs["choices"] = spec.choices
    elif kind is not str:
        kwargs["type"] = kind
    if spec.metavar:
        kwargs["metavar"] = spec.metavar
    if spec.flag_help:
        kwargs["help"] = spec.flag_help
    parser.add_argument(f"--{spec.flag}", **kwargs)


def add_filter_arguments(parser, *, with_format: bool = True, with_dataset: bool = True) -> None:
    if with_dataset:
        parser.add_argument("--dataset", type=int, metavar="ID", help="use a saved dataset")
    # The filters: declared once, with their flags and help, in TurnSelection.
    for name in command_filters():
        add_filter_flag(parser, name)
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="write the file even when no row matches (otherwise exit 1, nothing written)",
    )
    parser.add_argument(
        "--kind",
        choices=KINDS,
        help="sft: a row per turn; preference: DPO pairs of same-state answers",
    )
    parser.add_argument("--val-fraction", type=float, metavar="F")
    parser.add_argument("--history-frames", type=int, metavar="K")
    if with_format:
        parser.add_argument(
            "--format",
            choices=format_names(),
            help=command_help(),
        )


def add_force_argument(parser, *, replaces: str) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"replace {replaces} (without it an existing one is refused: exit 2, nothing written)",
    )


def refuse_existing(path: Path, *, option: str, force: bool) -> None:
    """An export never replaces a file someone already has unless asked: `--force`."""
    if not force and (path.exists() or path.is_symlink()):
        raise usage_error(f"{option}: {str(path)!r} already exists; pass --force to overwrite it")


def filters_from_options(options: dict[str, Any]) -> tuple[TurnSelection, ExportOptions]:
    """The filter and export options a command line asks for; usage errors exit 2."""
    try:
        if options.get("dataset") is not None:
            given = [n for n in command_filters() if options[filter_of(n).dest] is not None]
            if given:
                flag = "--" + filter_of(given[0]).flag
                raise usage_error(
                    f"{flag}: --dataset uses the dataset's saved filters; edit the dataset "
                    "or export without --dataset"
                )
            dataset = Dataset.objects.filter(id=options["dataset"]).first()
            if dataset is None:
                raise usage_error(f"dataset: there is no dataset {options['dataset']}")
            filters = TurnSelection.from_json(dataset.filters)
            saved = ExportOptions.from_json(dataset.export_options)
        else:
            filters = TurnSelection(**_filters_given(options))
            saved = ExportOptions()
        # Flags given on the command line override the dataset's saved export options.
        export_options = ExportOptions(
            history_frames=_given(options["history_frames"], saved.history_frames),
            format=_given(options.get("format"), saved.format),
            val_fraction=_given(options["val_fraction"], saved.val_fraction),
            kind=_given(options["kind"], saved.kind),
            allow_empty=options["allow_empty"] or saved.allow_empty,
        )
        check_references(filters)
        check_combination(filters, export_options)
    except FilterError as exc:
        raise usage_error(str(exc)) from exc
    return filters, export_options


def _filters_given(options: dict[str, Any]) -> dict[str, Any]:
    """The filters whose flags were given, as TurnSelection takes them."""
    values: dict[str, Any] = {}
    for name in command_filters():
        value = options[filter_of(name).dest]
        if value is not None:
            values[name] = tuple(value) if filter_kind(name)[1] else value
    return values


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value
