"""Where `export_jsonl --probe-set` and `export_hf --probe-set` find the exporter of a probe
set (vision checkpoints, docs/probes.md).

Probe sets live in `probes`, an app after this one: curation cannot import it. `probes`
registers its exporter here when it is ready (`ProbesConfig.ready`), as apps register their
job kinds with `studio.jobs`; the commands ask for it, and say so in one line when no app
offers one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from curation.command_options import command_filters
from curation.export_options import ExportOptions
from curation.exporting import ExportResult
from curation.hf_export import HFResult
from rollouts.review.turn_selection import FilterError, filter_of
from studio.commands import usage_error


@dataclass(frozen=True)
class ProbeSetExporter:
    """A probe set's rows, written as a turn export writes its own.

    - `check(set_id)`: "" when the set can be exported, else the one-line reason.
    - `jsonl(set_id=, options=, output=, val_output=, progress=)`: the JSONL files, as
      `curation.exporting.export_files` writes turns (ExportEmpty, ExportRefused alike).
    - `hf(set_id=, options=, output=, progress=)`: a Hugging Face dataset in `output`.
    """

    check: Callable[[int], str]
    jsonl: Callable[..., ExportResult]
    hf: Callable[..., HFResult]


_exporter: ProbeSetExporter | None = None


def register(exporter: ProbeSetExporter) -> None:
    global _exporter
    _exporter = exporter


def probe_set_exporter() -> ProbeSetExporter | None:
    """The registered exporter; None when no installed app offers one."""
    return _exporter


def probe_set_options(options: dict[str, Any]) -> tuple[ProbeSetExporter, ExportOptions]:
    """The exporter and export options of `--probe-set ID` on an export command's line;
    usage errors (exit 2) for flags that select turns or shape turn rows, and for a set
    that does not exist."""
    set_id = options["probe_set"]
    exporter = probe_set_exporter()
    if exporter is None:
        raise usage_error("probe-set: no installed app exports probe sets (add 'probes')")
    flags = [filter_of(name) for name in command_filters()]
    given = ["--" + spec.flag for spec in flags if options[spec.dest] is not None]
    given += [
        f"--{name.replace('_', '-')}"
        for name in ("dataset", "history_frames", "kind")
        if options.get(name) is not None
    ]
    given += ["--tool-calls-as-text"] if options.get("tool_calls_as_text") else []
    if given:
        raise usage_error(
            f"{given[0]}: --probe-set exports the set's questions; it takes no turn filter "
            "or turn-row option"
        )
    try:
        export_options = ExportOptions(
            format=options.get("format") or "studio",
            val_fraction=options["val_fraction"] or 0.0,
            allow_empty=options["allow_empty"],
        )
    except FilterError as exc:
        raise usage_error(str(exc)) from exc
    problem = exporter.check(set_id)
    if problem:
        raise usage_error(problem)
    return exporter, export_options
