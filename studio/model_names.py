"""Which model names an endpoint may be limited to (`Endpoint.allowed_models`).

The field is JSON an admin types: a list of model names, or nothing (an empty list: any
model). It once took any JSON: `[1, 2]`, `null` or deep nesting failed with a 500 in admin
and then on every batch and probe-run form, and a string matched substrings of a model name
("gpt-4o" let "gpt-4o-mini" through). The rule is checked three times:
`allowed_models_problem` in the model's `clean` (admin shows it on the field),
`AllowedModelsValid` as a database constraint (a row written around admin), and
`allowed_model_names` when a row is read, for a row the constraint never saw: one that
cannot be read allows no model, since an admin who limited an endpoint meant it limited.
"""

from __future__ import annotations

from typing import Any

from django.db import NotSupportedError
from django.db.models import BooleanField, Func

MAX_ALLOWED_MODELS = 50
MODEL_NAME_MAX_CHARS = 200

ALLOWED_MODELS_HELP = (
    'Model ids users may pick, as a JSON list of names, e.g. ["gpt-4o-mini"]: at most '
    f"{MAX_ALLOWED_MODELS} names of 1 to {MODEL_NAME_MAX_CHARS} characters. Empty ([]): "
    "any model."
)


def _is_model_name(value: Any) -> bool:
    return (
        isinstance(value, str) and 1 <= len(value) <= MODEL_NAME_MAX_CHARS and value.isprintable()
    )


def allowed_models_problem(value: Any) -> str | None:
    """What is wrong with `value` as an allowed-models list, in one line; None when nothing."""
    if not isinstance(value, list):
        return 'Give a JSON list of model names, e.g. ["gpt-4o-mini"], or [] for any model.'
    if len(value) > MAX_ALLOWED_MODELS:
        return f"At most {MAX_ALLOWED_MODELS} model names ({len(value)} given)."
    for position, name in enumerate(value, start=1):
        if not _is_model_name(name):
            return (
                f"Name {position} is not a model name: each is a string of 1 to "
                f"{MODEL_NAME_MAX_CHARS} printable characters."
            )
    return None


def allowed_model_names(value: Any) -> list[str] | None:
    """The names an endpoint allows ([]: any model), or None when the stored value breaks
    the rule: such a row allows nothing, rather than anything."""
    return None if allowed_models_problem(value) is not None else value


class AllowedModelsValid(Func):
    """True in SQL when a JSON column holds what `allowed_models_problem` accepts.

    A CHECK constraint may not use a subquery on either database, so no set-returning JSON
    function: PostgreSQL tests every element with one JSON path, SQLite (the demo's
    database) element by element, up to `MAX_ALLOWED_MODELS`. Control characters are
    refused on both; `str.isprintable` also refuses other unprintable ones in `clean`.
    """

    arity = 1
    conditional = True
    output_field = BooleanField()

    _PATH = (
        'strict $[*] ? (@.type() != "string" || '
        f'!(@ like_regex "^[^[:cntrl:]]{{1,{MODEL_NAME_MAX_CHARS}}}$"))'
    )

    def as_sql(self, compiler, connection, **extra_context):
        raise NotSupportedError(f"allowed models: no check written for {connection.vendor}")

    def as_postgresql(self, compiler, connection, **extra_context):
        column, params = compiler.compile(self.get_source_expressions()[0])
        sql = (
            f"(CASE WHEN jsonb_typeof({column}) = 'array' "
            f"THEN jsonb_array_length({column}) <= {MAX_ALLOWED_MODELS} "
            f"AND NOT jsonb_path_exists({column}, '{self._PATH}') ELSE false END)"
        )
        return sql, params * 3

    def as_sqlite(self, compiler, connection, **extra_context):
        column, params = compiler.compile(self.get_source_expressions()[0])
        control = "'*[' || char(1) || '-' || char(31) || char(127) || ']*'"
        elements = []
        for index in range(MAX_ALLOWED_MODELS):
            element = f"'$[{index}]'"
            name = f"json_extract({column}, {element})"
            elements.append(
                f"(json_type({column}, {element}) IS NULL OR "
                f"(json_type({column}, {element}) = 'text' "
                f"AND length({name}) BETWEEN 1 AND {MODEL_NAME_MAX_CHARS} "
                f"AND {name} NOT GLOB {control}))"
            )
        sql = (
            f"(CASE WHEN json_valid({column}) AND json_type({column}) = 'array' "
            f"THEN json_array_length({column}) <= {MAX_ALLOWED_MODELS} AND "
            + " AND ".join(elements)
            + " ELSE 0 END)"
        )
        return sql, params * (3 + 4 * MAX_ALLOWED_MODELS)
