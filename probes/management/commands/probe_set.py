"""`python manage.py probe_set`: perception questions on recorded frames (`docs/probes.md`)."""

from __future__ import annotations

import json
from typing import Any

from curation.command_options import add_filter_flag, command_filters, filters_from_options
from probes.questions import kind_names
from probes.services import ProbeSetError, probe_set_create
from studio.commands import StudioCommand, progress_bar, usage_error

# The export options `filters_from_options` reads beside the filters; a probe set has none.
_NO_EXPORT_OPTIONS = {
    "history_frames": None,
    "val_fraction": None,
    "kind": None,
    "format": None,
    "allow_empty": False,
}


class Command(StudioCommand):
    help = (
        "Make a probe set: multiple-choice perception questions on the frames the filters "
        "select, each answered by the frame's stored game state. The last line is a JSON "
        "summary: set id, questions, frames, and the right answers' distribution per kind."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dataset", type=int, metavar="ID", help="use a saved dataset")
        # The filters of export_jsonl, from their one declaration (TurnSelection).
        for name in command_filters():
            add_filter_flag(parser, name)
        parser.add_argument(
            "--per-episode",
            type=int,
            metavar="N",
            help="a sample of N frames of each episode, seeded by --seed (default: every frame)",
        )
        parser.add_argument(
            "--kinds",
            nargs="+",
            metavar="K",
            help=f"the kinds of questions (default: all): {', '.join(kind_names())}",
        )
        parser.add_argument("--seed", type=int, default=0, help="sampling and choice order")
        parser.add_argument(
            "--balance",
            action="store_true",
            help="per kind, cut each answer down to the count of the kind's second most "
            "common answer (see docs/probes.md)",
        )
        parser.add_argument("--name", default="", metavar="NAME")

    def handle(self, *args: Any, **options: Any) -> None:
        filters, _ = filters_from_options({**options, **_NO_EXPORT_OPTIONS})
        if options["per_episode"] is not None and options["per_episode"] < 1:
            raise usage_error(f"per-episode: {options['per_episode']} is not at least 1")
        if not -(2**63) <= options["seed"] < 2**63:
            raise usage_error("seed: not a 64-bit integer")
        bar = progress_bar(total=None, desc="questions", unit="question")
        try:
            with bar:
                probe_set = probe_set_create(
                    filters=filters,
                    kinds=options["kinds"],
                    seed=options["seed"],
                    per_episode=options["per_episode"],
                    balance=options["balance"],
                    name=options["name"],
                    progress=lambda done: bar.update(done - bar.n),
                )
        except ProbeSetError as exc:
            raise usage_error(str(exc)) from exc
        for line in distribution_lines(probe_set):
            self.stdout.write(line)
        self.stdout.write(json.dumps(probe_set_summary(probe_set)))


# One answer winning this share of a kind's questions is flagged: "always X" scores that much.
DOMINANT_SHARE = 0.8


def distribution_lines(probe_set) -> list[str]:
    """The right answers per kind, as shares, for a person reading the terminal."""
    lines = []
    for kind in probe_set.kinds:
        answers = probe_set.answers.get(kind) or {}
        total = sum(answers.values())
        if not total:
            why = (
                "one answer only on these frames, left out by --balance"
                if probe_set.balanced
                else "none"
            )
            lines.append(f"{kind}: no questions ({why})")
            continue
        shares = ", ".join(f"{a} {_share(n, total)}" for a, n in answers.items())
        line = f"{kind}: {total:,} questions; answers {shares}"
        top = max(answers.values())
        if top >= DOMINANT_SHARE * total:
            share = _share(top, total)
            line += f" (warning: one answer is right {share} of the time; --balance evens it)"
        lines.append(line)
    return lines


def probe_set_summary(probe_set) -> dict[str, Any]:
    """The JSON line `probe_set` prints last (`docs/probes.md`)."""
    return {
        "set_id": probe_set.id,
        "questions": probe_set.questions_count,
        "frames": probe_set.frames_count,
        # Every kind asked, those left with no question (balanced away) too.
        "kinds": {
            kind: {"questions": sum(answers.values()), "answers": answers}
            for kind in probe_set.kinds
            for answers in [probe_set.answers.get(kind) or {}]
        },
    }


def _share(n: int, total: int) -> str:
    """A share in whole percent that never reads as none or all when it is neither: 1 of 200
    is "<1%" (not "0%"), 199 of 200 ">99%" (not "100%")."""
    if 0 < n < total / 100:
        return "<1%"
    if total - total / 100 < n < total:
        return ">99%"
    return f"{n / total:.0%}"
