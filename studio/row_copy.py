"""`copy_rows`: new rows of one model written with PostgreSQL's COPY, for the hot writers.

The recorder writes a frame and a turn for every step played, an import one for every row it
reads. Through `bulk_create` they cost the worker more than twice the CPU they cost through
COPY (Django prepares every field of every object, and its PostgreSQL bulk insert sends each
column as an array, which psycopg escapes element by element in Python). COPY returns no
ids, so they are drawn from the tables' sequences first, in one statement for all the groups
written together, and set on the objects, as `bulk_create` does.

Only for models with an automatic id whose every other column is a boolean, number, text,
date (not auto_now), foreign key, JSON (`json.dumps` with the field's encoder, as Django
writes it) or file field (its name): any other field, or another database, and it is
`bulk_create`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.db import connection, models

# n new ids of a table's id column, as an array (parameters: quoted table, column, n).
_DRAW_IDS = "ARRAY(SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s))"


def copy_rows(*groups: Sequence[models.Model]) -> None:
    """Insert each group of new rows (objects of one model), group after group, and set their
    primary keys. The ids of all the groups are drawn in one round trip: the recorder writes
    a chunk's frames and turns together."""
    groups = tuple(objs for objs in groups if objs)
    if not groups:
        return
    postgresql = connection.vendor == "postgresql"
    plans = [_plan(type(objs[0])) if postgresql else None for objs in groups]
    with connection.cursor() as cursor:
        drawn = _draw_ids(cursor, groups, plans)
        for objs, plan, new_ids in zip(groups, plans, drawn, strict=True):
            if plan is None:
                type(objs[0]).objects.bulk_create(objs)
                continue
            sql, _, _, columns = plan
            # An object may have its id already: one whose insert was rolled back, written
            # again with the rows that point to it (as bulk_create, it keeps it).
            ids = [next(new_ids) if obj.pk is None else obj.pk for obj in objs]
            with cursor.cursor.copy(sql) as copy:
                for obj, pk in zip(objs, ids, strict=True):
                    copy.write_row([pk, *(value_of(obj) for value_of in columns)])
            for obj, pk in zip(objs, ids, strict=True):
                obj.pk = pk
                obj._state.adding = False
                obj._state.db = connection.alias


def _draw_ids(cursor, groups, plans) -> list[Iterator[int]]:
    """For each group, new ids from its table's sequence, one for each of its objects
    without one (none for a group written through bulk_create); one statement for all."""
    arrays, params, wanted = [], [], []
    for objs, plan in zip(groups, plans, strict=True):
        missing = 0 if plan is None else sum(obj.pk is None for obj in objs)
        wanted.append(missing)
        if missing:
            _, table, pk_column, _ = plan
            arrays.append(_DRAW_IDS)
            params += [table, pk_column, missing]
    rows = iter(())
    if arrays:
        cursor.execute("SELECT " + ", ".join(arrays), params)
        rows = iter(cursor.fetchone())
    return [iter(next(rows) if missing else ()) for missing in wanted]


@functools.cache
def _plan(model: type[models.Model]) -> tuple[str, str, str, list[Callable]] | None:
    """(COPY statement, quoted table, id column, a function giving each column's value of an
    object), or None when a field is of a kind `copy_rows` does not write."""
    meta = model._meta
    pk = meta.pk
    if not isinstance(pk, models.AutoField | models.BigAutoField):
        return None
    columns: list[Callable] = []
    for field in meta.concrete_fields:
        if field is pk:
            continue
        value_of = _column_value(field)
        if value_of is None:
            return None
        columns.append(value_of)
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    names = ", ".join(quote(field.column) for field in meta.concrete_fields if field is not pk)
    sql = f"COPY {table} ({quote(pk.column)}, {names}) FROM STDIN"
    return sql, table, pk.column, columns


def _column_value(field: models.Field) -> Callable[[models.Model], Any] | None:
    """The function giving `field`'s column value of an object, as Django's `get_db_prep_save`
    gives it; None for a field it does not know."""
    attname = field.attname
    if isinstance(field, models.ForeignKey):

        def related_id(obj: models.Model) -> Any:
            value = getattr(obj, attname)
            if value is None and field.is_cached(obj):
                # Set as an object saved since (a turn's frame): its id, as bulk_create does.
                related = field.get_cached_value(obj)
                if related is not None:
                    if related.pk is None:
                        raise ValueError(f"copy_rows: {field.name} is not saved yet")
                    value = related.pk
                    setattr(obj, attname, value)
            return value

        return related_id
    if isinstance(field, models.JSONField):
        encoder = field.encoder

        def json_text(obj: models.Model) -> str | None:
            value = getattr(obj, attname)
            return None if value is None else json.dumps(value, cls=encoder)

        return json_text
    if isinstance(field, models.FileField):
        return lambda obj: getattr(obj, attname).name or ""
    if isinstance(field, models.DateTimeField | models.DateField):
        # auto_now dates change the value in pre_save, which COPY would skip.
        return None if field.auto_now or field.auto_now_add else _typed(attname, None)
    for kind, python_type in _TYPES:
        if isinstance(field, kind):
            return _typed(attname, python_type)
    return None


# The fields whose value is written as its Python type makes it (as their get_prep_value
# does: a numpy integer becomes an int).
_TYPES: tuple[tuple[type[models.Field], type], ...] = (
    (models.BooleanField, bool),
    (models.IntegerField, int),  # and the positive, small and big ones
    (models.FloatField, float),
    (models.CharField, str),
    (models.TextField, str),
)


def _typed(attname: str, python_type: type | None) -> Callable[[models.Model], Any]:
    def value_of(obj: models.Model) -> Any:
        value = getattr(obj, attname)
        if value is None or python_type is None or type(value) is python_type:
            return value
        return python_type(value)

    return value_of
