"""The training config (docs/formats.md): a strict reader of synth-ai's TOML. Pure, no Django.

Every section and key of the reference `configs/crafter_vlm_gpt4o.toml` is declared once
below with its type and allowed values. Anything else is an error naming the key and its
line (synth-ai ignored unknown keys without a word: a typo such as `learning_rte` silently
trained with the default). Each error is one line:

    [hyperparameters] learning_rte (line 31): unknown key; did you mean learning_rate?
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.toml_shape import MAX_NESTING, toml_shape_problem

REFERENCE_PATH = Path(__file__).resolve().parent / "configs" / "crafter_vlm_gpt4o.toml"
MAX_TOML_CHARS = 64 * 1024


@dataclass(frozen=True)
class Key:
    """One key: its type, allowed values or range, and whether it must be present."""

    type: str  # "str", "int", "float", "bool", "list[str]", "table"
    required: bool = False
    choices: tuple[Any, ...] = ()
    min: float | None = None
    max: float | None = None
    max_length: int = 500
    help: str = ""


# Sections in the order of the reference file; "a.b" is a sub-table. The keys every provider
# shares; a provider's own (e.g. openai's `suffix`) are added when training.providers
# registers it (`schema_add`), which the training app does when it is ready.
SCHEMA: dict[str, dict[str, Key]] = {
    "job": {
        "model": Key("str", required=True, help="base model to fine-tune"),
        "modalities": Key("list[str]", choices=("text", "image")),
        "data": Key("str|int", help="dataset version id, or a dataset's name (newest version)"),
        "description": Key("str", max_length=2000),
    },
    "compute": {
        "gpu_type": Key("str", max_length=40),
        "gpu_count": Key("int", min=1, max=1024),
        "nodes": Key("int", min=1, max=1024),
    },
    "data": {
        "topology": Key("table"),
        "validation_path": Key("str|int", help="validation dataset version id or dataset name"),
    },
    "training": {
        "mode": Key("str", choices=("sft_offline", "grpo")),
        "use_qlora": Key("bool"),
    },
    # Online reinforcement learning (`mode = "grpo"`, the trl provider): docs/training.md.
    "training.grpo": {
        "group_size": Key("int", min=2, max=64, help="episodes per seed, compared as a group"),
        "seeds_per_iteration": Key("int", min=1, max=1024),
        "steps_per_episode": Key("int", min=1, max=10000),
        "iterations": Key("int", min=1, max=100000),
        "reward": Key("str", max_length=500, help='"crafter", "score" or "achievements:a,b"'),
        "kl_coef": Key("float", min=0.0, max=100.0),
        "first_seed": Key("int", min=0, max=2**31 - 1),
        "max_answer_tokens": Key("int", min=1, max=4096),
        "temperature": Key("float", min=0.0, max=10.0),
    },
    "training.validation": {
        "enabled": Key("bool"),
        "evaluation_strategy": Key("str", choices=("steps", "epoch", "no")),
        "eval_steps": Key("int", min=0, max=10**9),
        "save_best_model_at_end": Key("bool"),
        "metric_for_best_model": Key("str", max_length=100),
        "greater_is_better": Key("bool"),
    },
    "hyperparameters": {
        "n_epochs": Key("int", required=True, min=1, max=100),
        "train_kind": Key("str", choices=("fft", "lora", "qlora")),
        "per_device_batch": Key("int", min=1, max=4096),
        "gradient_accumulation_steps": Key("int", min=1, max=4096),
        "sequence_length": Key("int", min=1, max=10**7),
        "learning_rate": Key("float", min=0.0, max=1.0),
        "warmup_ratio": Key("float", min=0.0, max=1.0),
        "weight_decay": Key("float", min=0.0, max=10.0),
        "batch_size": Key("int", min=1, max=4096, help="openai: examples per batch"),
    },
    "hyperparameters.parallelism": {
        "use_deepspeed": Key("bool"),
        "deepspeed_stage": Key("int", choices=(0, 1, 2, 3)),
        "fsdp": Key("bool"),
        "bf16": Key("bool"),
        "fp16": Key("bool"),
        "activation_checkpointing": Key("bool"),
    },
}
REQUIRED_SECTIONS = ("job", "hyperparameters")
# What a GRPO run ([training] mode = "grpo") does not need: it trains on the episodes it plays,
# for `[training.grpo] iterations`, so there are no epochs over a dataset to count.
GRPO_MODE = "grpo"
_NOT_REQUIRED_FOR_GRPO = {("hyperparameters", ""), ("hyperparameters", "n_epochs")}
# What a provider accepts beyond the shared keys, by section (a ProviderKind's config_keys).
ConfigKeys = Mapping[str, Mapping[str, Key]]


def schema_add(keys: ConfigKeys) -> None:
    """Accept a provider's own keys (training.providers registers them), after the shared
    ones of their section. Every config accepts them: a provider ignores what is not its."""
    for section, more in keys.items():
        if section not in SCHEMA:
            raise ValueError(f"config keys: no section [{section}]")
        for name, key in more.items():
            if SCHEMA[section].setdefault(name, key) != key:
                raise ValueError(f"config keys: [{section}] {name} is declared twice")


def schema_remove(keys: ConfigKeys) -> None:
    """Stop accepting a provider's own keys (tests that register a throwaway provider)."""
    for section, more in keys.items():
        for name in more:
            SCHEMA.get(section, {}).pop(name, None)


@dataclass(frozen=True)
class ConfigIssue:
    section: str
    key: str  # "" for the section itself or the whole file
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"[{self.section}]" if self.section else "config"
        if self.key:
            where += f" {self.key}"
        if self.line is not None:
            where += f" (line {self.line})"
        return f"{where}: {self.message}"


class ConfigError(ValueError):
    """The config is refused; `issues` holds every problem, one line each."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))

    def lines(self) -> list[str]:
        return [str(i) for i in self.issues]


@dataclass
class TrainingConfig:
    """The parsed config: sections as plain dicts, and where each key was written."""

    sections: dict[str, dict[str, Any]]
    lines: dict[tuple[str, str], int] = field(default_factory=dict)

    def get(self, section: str, key: str, default: Any = None) -> Any:
        return self.sections.get(section, {}).get(key, default)

    def line_of(self, section: str, key: str = "") -> int | None:
        return self.lines.get((section, key))

    def issue(self, section: str, key: str, message: str) -> ConfigIssue:
        return ConfigIssue(section, key, self.line_of(section, key), message)

    @property
    def model(self) -> str:
        return str(self.sections["job"]["model"])

    def to_json(self) -> dict[str, Any]:
        return {name: dict(values) for name, values in self.sections.items()}


def reference_text() -> str:
    return REFERENCE_PATH.read_text(encoding="utf-8")


_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\s*(#.*)?$")
_QUOTED_OR_COMMENT = re.compile(r""""[^"]*"?|'[^']*'?|#.*""")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-]+(?:\s*\.\s*[A-Za-z0-9_\-]+)*)\s*=")


def _key_lines(text: str) -> dict[tuple[str, str], int]:
    """(section, key) -> 1-based line of each header and assignment, read from the text.

    tomllib gives values but not positions; this scanner only needs headers and `key =` at
    the start of a line (the reference's own shape). Dotted keys land in their sub-table.
    """
    lines: dict[tuple[str, str], int] = {}
    section = ""
    depth = 0  # inside a multi-line array or inline table, nothing starts a key
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw
        if depth == 0:
            header = _HEADER.match(line)
            if header and not line.lstrip().startswith("[["):
                section = ".".join(p.strip().strip('"') for p in header.group(1).split("."))
                lines.setdefault((section, ""), number)
                continue
            key = _KEY.match(line)
            if key:
                parts = [p.strip() for p in key.group(1).split(".")]
                owner = ".".join([section, *parts[:-1]]) if section else ".".join(parts[:-1])
                lines.setdefault((owner, parts[-1]), number)
                if len(parts) > 1:
                    lines.setdefault((owner, ""), number)
        depth += _bracket_balance(line)
        depth = max(depth, 0)
    return lines


def _bracket_balance(line: str) -> int:
    # A header line `[x]` balances itself; only unclosed brackets carry to the next line.
    # Strings and the comment go first, inside the regex engine: a loop over every
    # character was most of the time a 64 KB config took.
    code = _QUOTED_OR_COMMENT.sub("", line)
    return code.count("[") + code.count("{") - code.count("]") - code.count("}")


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _check_value(section: str, key: str, spec: Key, value: Any, config: TrainingConfig) -> list:
    issues: list[ConfigIssue] = []

    def bad(message: str) -> list[ConfigIssue]:
        return [config.issue(section, key, message)]

    kinds = spec.type.split("|")
    if spec.type == "table":
        return [] if isinstance(value, dict) else bad(f"must be a table, not {_type_name(value)}")
    if spec.type == "list[str]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return bad("must be an array of strings")
        for item in value:
            if spec.choices and item not in spec.choices:
                return bad(f"{item!r} is not one of {', '.join(map(str, spec.choices))}")
        return issues
    ok = (
        ("str" in kinds and isinstance(value, str))
        or ("int" in kinds and isinstance(value, int) and not isinstance(value, bool))
        or ("float" in kinds and isinstance(value, int | float) and not isinstance(value, bool))
        or ("bool" in kinds and isinstance(value, bool))
    )
    if not ok:
        wanted = " or ".join(
            {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}[
                k
            ]
            for k in kinds
        )
        return bad(f"must be {wanted}, not {_type_name(value)} {value!r}")
    if isinstance(value, str):
        if len(value) > spec.max_length:
            return bad(f"longer than {spec.max_length} characters")
        if "\x00" in value:
            return bad("contains a NUL character")
        if "str" in kinds and not spec.choices and not value.strip() and spec.required:
            return bad("must not be empty")
    if spec.choices and value not in spec.choices:
        shown = ", ".join(repr(c) if isinstance(c, str) else str(c) for c in spec.choices)
        hint = (
            _did_you_mean(value, [str(c) for c in spec.choices]) if isinstance(value, str) else ""
        )
        return bad(f"{value!r} is not one of {shown}{hint}")
    if isinstance(value, float) and not math.isfinite(value):
        return bad("must be a finite number")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if spec.min is not None and value < spec.min:
            return bad(f"{value} is below the minimum {spec.min:g}")
        if spec.max is not None and value > spec.max:
            return bad(f"{value} is above the maximum {spec.max:g}")
        if key == "learning_rate" and value == 0:
            return bad("must be greater than 0")
    return issues


def _walk(
    table: dict[str, Any], prefix: str, config: TrainingConfig, issues: list[ConfigIssue]
) -> None:
    known_sections = list(SCHEMA)
    for name, value in table.items():
        path = f"{prefix}.{name}" if prefix else name
        schema = SCHEMA.get(prefix) if prefix else None
        if schema is not None and name in schema:
            spec = schema[name]
            issues.extend(_check_value(prefix, name, spec, value, config))
            config.sections.setdefault(prefix, {})[name] = value
            continue
        if path in SCHEMA:
            if isinstance(value, dict):
                config.sections.setdefault(path, {})
                _walk(value, path, config, issues)
            else:
                issues.append(config.issue(prefix, name, f"must be the table [{path}]"))
            continue
        if schema is None and not prefix:
            # A top-level key or table that is not a section.
            if isinstance(value, dict):
                close = difflib.get_close_matches(name, known_sections, n=1, cutoff=0.6)
                hint = f"; did you mean [{close[0]}]?" if close else ""
                issues.append(ConfigIssue(name, "", config.line_of(name), "unknown section" + hint))
            else:
                issues.append(
                    ConfigIssue(
                        "",
                        name,
                        config.line_of("", name),
                        f"a key outside any section{_hint_section(name)}",
                    )
                )
            continue
        subsections = [s for s in SCHEMA if s.startswith(prefix + ".")]
        candidates = list((schema or {}).keys()) + [s.split(".")[-1] for s in subsections]
        if isinstance(value, dict):
            close = difflib.get_close_matches(path, subsections, n=1, cutoff=0.6)
            issues.append(
                ConfigIssue(
                    path,
                    "",
                    config.line_of(path) or config.line_of(prefix, name),
                    "unknown section" + (f"; did you mean [{close[0]}]?" if close else ""),
                )
            )
        else:
            issues.append(
                config.issue(prefix, name, "unknown key" + _did_you_mean(name, candidates))
            )


def _hint_section(key: str) -> str:
    for section, keys in SCHEMA.items():
        if key in keys:
            return f"; it belongs under [{section}]"
    return ""


def config_load(
    text: str,
    *,
    resolve_dataset: Callable[[str, str, Any], str | None] | None = None,
) -> TrainingConfig:
    """Parse and check a config; raise ConfigError listing every problem.

    `resolve_dataset(section, key, value)` returns an error message for a dataset reference
    (`[job] data`, `[data] validation_path`) that names nothing, or None when it is fine.
    """
    if len(text) > MAX_TOML_CHARS:
        raise ConfigError([ConfigIssue("", "", None, f"longer than {MAX_TOML_CHARS} characters")])
    shape = toml_shape_problem(text)
    if shape is not None:
        raise ConfigError([ConfigIssue("", "", shape.line, shape.message)])
    try:
        raw = tomllib.loads(text)
    except RecursionError:
        # The scan above should have caught it; a parser's stack is no page's business.
        message = f"nesting deeper than {MAX_NESTING} levels"
        raise ConfigError([ConfigIssue("", "", None, message)]) from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(match.group(1)) if match else None
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", message)
        raise ConfigError([ConfigIssue("", "", line, f"not valid TOML: {message}")]) from None
    config = TrainingConfig(sections={}, lines=_key_lines(text))
    issues: list[ConfigIssue] = []
    _walk(raw, "", config, issues)
    issues += _missing(raw, config)
    if resolve_dataset is not None and not issues:
        for section, key in (("job", "data"), ("data", "validation_path")):
            value = config.get(section, key)
            if value is None:
                continue
            problem = resolve_dataset(section, key, value)
            if problem:
                issues.append(config.issue(section, key, problem))
    if issues:
        issues.sort(key=lambda i: (i.line if i.line is not None else 10**9, i.section, i.key))
        raise ConfigError(issues)
    return config


def config_is_grpo(sections: Mapping[str, Any]) -> bool:
    """Whether a config (its parsed sections, or tomllib's raw table) asks for GRPO."""
    training = sections.get("training")
    return isinstance(training, dict) and training.get("mode") == GRPO_MODE


def _missing(raw: dict[str, Any], config: TrainingConfig) -> list[ConfigIssue]:
    """The required sections and keys that are absent (a GRPO run needs no epochs)."""
    exempt = _NOT_REQUIRED_FOR_GRPO if config_is_grpo(raw) else set()
    issues = [
        ConfigIssue(section, "", None, "missing section")
        for section in REQUIRED_SECTIONS
        if section not in raw and (section, "") not in exempt
    ]
    for section, keys in SCHEMA.items():
        present = _lookup(raw, section)
        if present is None:
            continue
        for key, spec in keys.items():
            if spec.required and key not in present and (section, key) not in exempt:
                issues.append(
                    ConfigIssue(section, key, config.line_of(section), "missing required key")
                )
    return issues


def _lookup(raw: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None
