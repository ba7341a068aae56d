"""Forms of the review pages: the turn list's filter, flags, notes, bulk flags and the bulk
actions on ticked turns."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlencode

from django import forms

from rollouts.review.services import NOTE_MAX_LENGTH, turn_collections
from rollouts.review.turn_selection import (
    BIGINT_MAX,
    EVERY_TURN,
    FilterError,
    TurnSelection,
    filter_kind,
    filter_of,
    turn_filters,
)


def turn_list_filters() -> list[str]:
    """The filters the turn list offers (those declared with a `query` name), as field names."""
    return [f.name for f, spec in turn_filters() if spec.query]


def turn_list_field(name: str) -> forms.Field:
    """The turn list's field of one filter, from its declaration: one value, empty for any."""
    spec = filter_of(name)
    kind, many = filter_kind(name)
    kwargs: dict[str, Any] = {"required": False}
    if spec.query_label:
        kwargs["label"] = spec.query_label
    if spec.query_help:
        kwargs["help_text"] = spec.query_help
    if spec.choices:
        choices = [(c, spec.choice_label(c)) for c in spec.choices]
        # A list filter's "any" is no item; a value filter has "any" among its choices.
        return forms.ChoiceField(choices=[("", "any"), *choices] if many else choices, **kwargs)
    if kind is int:
        return forms.IntegerField(min_value=spec.minimum, max_value=spec.maximum, **kwargs)
    if kind is float:
        return forms.FloatField(min_value=spec.minimum, max_value=spec.maximum, **kwargs)
    if kind is bool:
        return forms.BooleanField(**kwargs)
    return forms.CharField(max_length=spec.max_length, **kwargs)


class TurnFilterForm(forms.Form):
    """The turn list's filters: a TurnSelection narrowed from every turn (`EVERY_TURN`), a
    field for each filter `TurnSelection` declares with a `query` name, named by it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in turn_list_filters():
            self.fields[filter_of(name).query] = turn_list_field(name)

    def filters(self) -> TurnSelection:
        """The validated filters; call after is_valid()."""
        values: dict[str, Any] = {}
        for name in turn_list_filters():
            value = self.cleaned_data.get(filter_of(name).query)
            if value is None or value == "" or value is False:
                continue  # left as it is: every turn
            values[name] = (value,) if filter_kind(name)[1] else value
        return dataclasses.replace(EVERY_TURN, **values)

    @staticmethod
    def query_for(selection: TurnSelection) -> dict[str, Any]:
        """The form's fields for a selection it made (a bulk flag's link back to the list)."""
        values: dict[str, Any] = {}
        for name in turn_list_filters():
            value = getattr(selection, name)
            if value == getattr(EVERY_TURN, name):
                continue
            values[filter_of(name).query] = value[0] if filter_kind(name)[1] else value
        return values


class FlagForm(forms.Form):
    """The wanted state, not a toggle: sending it twice changes nothing the second time."""

    flagged = forms.TypedChoiceField(
        choices=[("1", "flag"), ("0", "unflag")], coerce=lambda v: v == "1"
    )


class TurnNoteForm(forms.Form):
    note = forms.CharField(required=False, max_length=NOTE_MAX_LENGTH, strip=True)


class BulkFlagForm(TurnFilterForm):
    """The turn list's filters and the state to set them to. A field name of its own:
    `flagged` is already a filter (any / only / exclude)."""

    set_flagged = forms.TypedChoiceField(
        choices=[("1", "flag"), ("0", "unflag")], coerce=lambda v: v == "1"
    )


class TurnIdsField(forms.Field):
    """The turn list's ticked rows: `turn` once for each, a turn id (bounds: `turn_ids`)."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> tuple[int, ...]:
        if not value:
            return ()
        if isinstance(value, str):
            value = [value]
        ids = []
        for item in value:
            try:
                ids.append(int(item))
            except (TypeError, ValueError):
                raise forms.ValidationError(f"{str(item)[:20]!r} is not a turn id") from None
        return tuple(dict.fromkeys(ids))  # ticked twice is ticked once


# The actions of the turn list's bar; the later apps' collections (`turn_collections`) add
# theirs ("dataset").
TURN_ACTIONS = {"flag": "Flag", "unflag": "Unflag", "note": "Set a note on"}
SCOPES = (("selection", "the ticked turns"), ("filter", "every turn the filters match"))
# The bulk form's own fields, beside the turn list's filters.
TURN_BULK_FIELDS = ("action", "scope", "turn", "note", "target")


class TurnBulkForm(TurnFilterForm):
    """A bulk action of the turn list: what to do (`action`), to which turns (`scope`: the
    ticked ones, `turn`, or every turn the list's filters match), with what (`note`, the
    collection's `target`)."""

    action = forms.ChoiceField(choices=())
    scope = forms.ChoiceField(choices=SCOPES, required=False)
    turn = TurnIdsField(required=False)
    note = forms.CharField(
        required=False, max_length=NOTE_MAX_LENGTH, strip=True, widget=forms.Textarea
    )
    target = forms.IntegerField(required=False, min_value=1, max_value=BIGINT_MAX)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collections = {c.noun: c for c in turn_collections()}
        self.fields["action"].choices = [
            *TURN_ACTIONS.items(),
            *((noun, f"Add to {noun}") for noun in self.collections),
        ]
        self._selection: TurnSelection | None = None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        try:
            if data.get("scope") == "filter":
                self._selection = self.filters()
            elif data.get("turn"):
                self._selection = dataclasses.replace(EVERY_TURN, turn_ids=data["turn"])
            else:
                raise forms.ValidationError(
                    "No turn is ticked: tick turns, or select all the turns that match."
                )
        except FilterError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data

    @property
    def selection(self) -> TurnSelection:
        """The turns the action is for; after is_valid()."""
        assert self._selection is not None, "call is_valid() first"
        return self._selection

    @property
    def collection(self):
        """The later app's collection the action adds to, or None (flag, unflag, note)."""
        return self.collections.get(self.cleaned_data["action"])


def turn_list_query(selection: TurnSelection) -> str:
    """The turn list's address query for a selection (its filter form's field names)."""
    return urlencode(TurnFilterForm.query_for(selection))
