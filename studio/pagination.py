"""Pages and counts that cost the same on page 1 and page 20,000, at any table size.

* `keyset_page`: the rows after (or before) the last row shown, found through the ordering's
  index with `WHERE (sort key, id) > (...)`, instead of `OFFSET n`, which reads and throws
  away n rows. A page link carries a cursor (the sort values of the row it continues from),
  not a page number.
* `count_bounded`: an exact count while it is cheap (at most `exact_up_to` matching rows are
  read), else PostgreSQL's planner estimate, marked as such for the page to say "about".
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connections
from django.db.models import Q, QuerySet

# A cursor comes from the address bar: hostile until proven otherwise.
MAX_CURSOR_CHARS = 1024


@dataclass(frozen=True)
class KeysetPage:
    rows: list[Any]
    next_cursor: str | None  # rows after the last one shown; None on the last page
    previous_cursor: str | None  # rows before the first one shown; None on the first page

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class ValueGroups:
    """How `keyset_page` reads an order whose first field has few distinct values (a turn's
    index, its reward) when the rest of the query picks its rows by another column (the
    turn's episode): value by value, each value's rows a keyset read of their own in the
    rest of the order, `field = value AND ...`, which an index on (episode, value, ...) or
    (value, episode, ...) serves row by row. In one query, walking an index on
    (value, episode, ...) and testing each row, a filter on episodes made PostgreSQL step
    over every other episode's turns of that value first (10 million turns, a model's
    turns by reward: hundreds of thousands of index rows).

    `next_value(value, descending)`: the field's next value after `value` in that direction
    (its first when `value` is None), None past the last. After `max_values` values without
    a full page (few rows each), the rest comes from one query, as without groups.
    """

    next_value: Callable[[Any, bool], Any]
    max_values: int = 24


def keyset_page(
    queryset: QuerySet,
    *,
    order: Sequence[str],
    after: str | None = None,
    before: str | None = None,
    size: int,
    load: Callable[[list[Any]], Iterable[Any]] | None = None,
    key: Sequence[str] = ("pk",),
    groups: ValueGroups | None = None,
) -> KeysetPage:
    """One page of `queryset` in `order` (which must end in a unique key, e.g. "id").

    `after` / `before` are cursors from an earlier page; an invalid one gives the first page.
    Sort fields must not be NULL (SQL compares NULL with nothing): coalesce them first.
    `load(keys)`: when given, the page's keys are read first from `queryset` and its rows
    then by `load` (with their joins and columns), see `_page_rows`; a key is the primary key,
    or the tuple of the `key` fields' values (a unique set of the order's own fields, which
    its index holds: the keys then come from the index alone). `groups`: read
    value by value of the first field (see `ValueGroups`); the same rows, the same cursors.
    """
    fields = [(name.lstrip("-"), name.startswith("-")) for name in order]
    after_values = _fitting(queryset, fields, _decode(after, len(fields)))
    before_values = (
        None
        if after_values is not None
        else _fitting(queryset, fields, _decode(before, len(fields)))
    )
    backwards = before_values is not None
    cursor = before_values if backwards else after_values
    loader = _Loader(load, tuple(key)) if load is not None else None
    if groups is None:
        rows = _rows_beyond(queryset, fields, cursor, backwards, size + 1, loader)
    else:
        rows = _rows_by_value(queryset, fields, cursor, backwards, size + 1, loader, groups)
    if backwards:
        # Walked backwards from the cursor: put the page back in reading order.
        has_more_before = len(rows) > size
        rows = rows[:size][::-1]
        return KeysetPage(
            rows=rows,
            next_cursor=_encode(rows[-1], fields) if rows else None,
            previous_cursor=_encode(rows[0], fields) if rows and has_more_before else None,
        )
    has_more = len(rows) > size
    rows = rows[:size]
    return KeysetPage(
        rows=rows,
        next_cursor=_encode(rows[-1], fields) if rows and has_more else None,
        previous_cursor=_encode(rows[0], fields) if rows and after_values is not None else None,
    )


def _rows_beyond(
    queryset: QuerySet,
    fields: list[tuple[str, bool]],
    cursor: list[Any] | None,
    backwards: bool,
    limit: int,
    load: _Loader | None,
) -> list[Any]:
    """The first `limit` rows after `cursor` in the order (before it, walking backwards)."""
    ordering = [f"{'-' if desc != backwards else ''}{name}" for name, desc in fields]
    qs = queryset.order_by(*ordering)
    if cursor is not None:
        qs = qs.filter(_beyond(fields, cursor, backwards=backwards))
    return _page_rows(qs, limit, load)


def _rows_by_value(
    queryset: QuerySet,
    fields: list[tuple[str, bool]],
    cursor: list[Any] | None,
    backwards: bool,
    limit: int,
    load: _Loader | None,
    groups: ValueGroups,
) -> list[Any]:
    """`_rows_beyond`, value by value of the first field (see `ValueGroups`)."""
    (head, head_desc), tail = fields[0], fields[1:]
    descending = head_desc != backwards
    if cursor is None:
        value, tail_cursor = groups.next_value(None, descending), None
    else:
        value, tail_cursor = cursor[0], cursor[1:]
    rows: list[Any] = []
    for _ in range(groups.max_values):
        if value is None:
            return rows
        same = queryset.filter(**{head: value})
        rows += _rows_beyond(same, tail, tail_cursor, backwards, limit - len(rows), load)
        if len(rows) >= limit:
            return rows
        value, tail_cursor = groups.next_value(value, descending), None
    if value is None:
        return rows
    # Values with few rows each: the rest of the page in one query, from the last row read.
    position = [_value_of(rows[-1], name) for name, _ in fields] if rows else cursor
    return rows + _rows_beyond(queryset, fields, position, backwards, limit - len(rows), load)


@dataclass(frozen=True)
class _Loader:
    load: Callable[[list[Any]], Iterable[Any]]
    key: tuple[str, ...]


def _page_rows(qs: QuerySet, limit: int, loader: _Loader | None) -> list[Any]:
    """The first `limit` rows of `qs`. With a loader, in two reads: the keys alone, then their
    rows. Joined to the rows' relations, the planner misjudges how many rows a filter keeps and
    joins every match before sorting; the keys alone come from an index read in order that
    stops at the limit (figures in `docs/benchmarks.md`)."""
    if loader is None:
        return list(qs[:limit])
    if loader.key == ("pk",):
        keys = list(qs.values_list("pk", flat=True)[:limit])
        by_key = {row.pk: row for row in loader.load(keys)}
    else:
        keys = list(qs.values_list(*loader.key)[:limit])
        by_key = {
            tuple(getattr(row, name) for name in loader.key): row for row in loader.load(keys)
        }
    return [by_key[key] for key in keys if key in by_key]


def _beyond(fields: list[tuple[str, bool]], values: list[Any], *, backwards: bool) -> Q:
    """Rows strictly after `values` in the ordering (before, when `backwards`).

    (a, b, c) > (x, y, z) is a > x, or a = x and b > y, or a = x and b = y and c > z, each
    comparison turned around for a descending field.
    """
    condition = Q(pk__in=[])
    equal = Q()
    for (name, desc), value in zip(fields, values, strict=True):
        lookup = "lt" if desc != backwards else "gt"
        condition |= equal & Q(**{f"{name}__{lookup}": value})
        equal &= Q(**{name: value})
    # The same bound on the first field alone, redundant but index-shaped: PostgreSQL starts
    # its index scan there instead of filtering every row before the cursor, so a deep page
    # costs what page 1 does.
    first_name, first_desc = fields[0]
    first_bound = Q(**{f"{first_name}__{'lte' if first_desc != backwards else 'gte'}": values[0]})
    return first_bound & condition


def _value_of(row: Any, name: str) -> Any:
    value = row
    for part in name.split("__"):
        value = getattr(value, part)
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    return value


def _encode(row: Any, fields: list[tuple[str, bool]]) -> str:
    values = [_value_of(row, name) for name, _ in fields]
    raw = json.dumps(values, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _fitting(
    queryset: QuerySet, fields: list[tuple[str, bool]], values: list[Any] | None
) -> list[Any] | None:
    """`values`, when each is a value its field of the order can hold; else None (the first
    page). A cursor's JSON may hold a string or Infinity where the order has an integer,
    which the query would refuse with an error, not a page."""
    if values is None:
        return None
    query = queryset.query.chain()  # resolving a joined name adds its join: not to the page's
    for (name, _), value in zip(fields, values, strict=True):
        try:
            query.resolve_ref(name).output_field.get_prep_value(value)
        except (TypeError, ValueError, OverflowError, ValidationError):
            return None
    return values


def _decode(cursor: str | None, length: int) -> list[Any] | None:
    if not cursor or len(cursor) > MAX_CURSOR_CHARS:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        values = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(values, list) or len(values) != length:
        return None
    for value in values:
        # Scalars only; no NUL (PostgreSQL refuses it in text), no float('nan') tricks.
        if isinstance(value, str) and ("\x00" in value or len(value) > 256):
            return None
        if isinstance(value, float) and value != value:  # NaN
            return None
        if not isinstance(value, str | int | float | bool):
            return None
    return values


@dataclass(frozen=True)
class BoundedCount:
    value: int
    estimated: bool  # True: the planner's estimate, the page says "about"

    def __int__(self) -> int:
        return self.value


def count_bounded(queryset: QuerySet, *, exact_up_to: int | None = None) -> BoundedCount:
    """Exact when at most `exact_up_to` rows match (default: the setting
    STUDIO_EXACT_COUNT_UP_TO), else PostgreSQL's estimate.

    The exact part reads at most `exact_up_to + 1` rows (`COUNT(*)` over a LIMITed subquery),
    so its cost is bounded whatever the table size. Other databases (the SQLite demo) count
    exactly.
    """
    if exact_up_to is None:
        exact_up_to = settings.STUDIO_EXACT_COUNT_UP_TO
    queryset = queryset.order_by()
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return BoundedCount(queryset.count(), estimated=False)
    exact = queryset[: exact_up_to + 1].count()
    if exact <= exact_up_to:
        return BoundedCount(exact, estimated=False)
    return BoundedCount(round_estimate(max(planner_estimate(queryset), exact)), estimated=True)


def round_estimate(n: int) -> int:
    """1,234,567 -> 1,200,000: an estimate shown with more digits would claim precision."""
    digits = len(str(n))
    return round(n, -(digits - 2)) if digits > 2 else n


def planner_estimate(queryset: QuerySet) -> int:
    """Rows PostgreSQL's planner expects `queryset` to return (from its statistics)."""
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])
