"""The filter flags shared by `export_jsonl` and `export_hf`: declared once, read once."""

from __future__ import annotations

from typing import Any

from curation.export_options import FORMATS, KINDS, ExportOptions, check_combination
from curation.models import Dataset
from rollouts.review.turn_selection import (
    FLAGGED_CHOICES,
    RELABELED_CHOICES,
    FilterError,
    TurnSelection,
    check_references,
)
from studio.commands import usage_error

FILTER_FLAGS = (
    "batch",
    "model",
    "require_achievement",
    "exclude_achievement",
    "min_unique",
    "min_reward",
    "user_image",
    "include_assistant",
    "flagged",
    "include_text_fallback",
    "relabeled",
    "include_fork_prefix",
    "top_per_seed",
    "at_or_above_mean",
)


def add_filter_arguments(parser, *, with_format: bool = True) -> None:
    parser.add_argument("--dataset", type=int, metavar="ID", help="use a saved dataset")
    parser.add_argument("--batch", type=int, nargs="+", action="extend", metavar="ID")
    parser.add_argument("--model", nargs="+", action="extend", metavar="M")
    parser.add_argument("--require-achievement", nargs="+", action="extend", metavar="A")
    parser.add_argument("--exclude-achievement", nargs="+", action="extend", metavar="A")
    parser.add_argument("--min-unique", type=int, metavar="N")
    parser.add_argument("--min-reward", type=float, metavar="X")
    parser.add_argument(
        "--user-image", action="store_true", default=None, help="rows with a user image"
    )
    parser.add_argument(
        "--include-assistant",
        action="store_true",
        default=None,
        help="rows whose assistant messages hold an image as well (synth-ai's flag)",
    )
    parser.add_argument("--flagged", choices=FLAGGED_CHOICES)
    parser.add_argument(
        "--include-text-fallback",
        action="store_true",
        default=None,
        help="also turns whose actions were read from the model's prose (left out by "
        "default: the model made no tool call); marked metadata.text_fallback",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="write the file even when no row matches (otherwise exit 1, nothing written)",
    )
    parser.add_argument(
        "--relabeled",
        choices=RELABELED_CHOICES,
        help="turns a reviewer corrected: any (default), only them, or none of them",
    )
    parser.add_argument(
        "--include-fork-prefix",
        action="store_true",
        default=None,
        help="also export the turns a fork replays from its original",
    )
    parser.add_argument(
        "--top-per-seed",
        type=int,
        metavar="N",
        help="best-of-N: the N best episodes of each seed (unique achievements, then reward)",
    )
    parser.add_argument(
        "--at-or-above-mean",
        action="store_true",
        default=None,
        help="episodes whose reward is at least the mean of their seed's samples",
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
            choices=FORMATS,
            help="studio (rows with metadata; default), openai (what OpenAI fine-tuning "
            "accepts) or synth (synth-ai's SFT loader: flat tools, metadata kept)",
        )


def filters_from_options(options: dict[str, Any]) -> tuple[TurnSelection, ExportOptions]:
    """The filter and export options a command line asks for; usage errors exit 2."""
    try:
        if options["dataset"] is not None:
            given = [f for f in FILTER_FLAGS if options[f] is not None]
            if given:
                flag = "--" + given[0].replace("_", "-")
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
            filters = TurnSelection(
                batches=tuple(options["batch"] or ()),
                models=tuple(options["model"] or ()),
                require_achievements=tuple(options["require_achievement"] or ()),
                exclude_achievements=tuple(options["exclude_achievement"] or ()),
                min_unique=options["min_unique"],
                min_reward=options["min_reward"],
                user_image=bool(options["user_image"]),
                include_assistant=bool(options["include_assistant"]),
                flagged=options["flagged"] or "any",
                include_text_fallback=bool(options["include_text_fallback"]),
                relabeled=options["relabeled"] or "any",
                include_fork_prefix=bool(options["include_fork_prefix"]),
                top_per_seed=options["top_per_seed"],
                at_or_above_mean=bool(options["at_or_above_mean"]),
            )
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


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value
