"""Forms of the review pages: the turn list's filter, flags, notes and bulk flags."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlencode

from django import forms

from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.review.services import NOTE_MAX_LENGTH
from rollouts.review.turn_selection import (
    BIGINT_MAX,
    ERROR_CHOICES,
    EVERY_TURN,
    FLAGGED_CHOICES,
    FLAGGED_LABELS,
    REWARD_CHOICES,
    TurnSelection,
)
from rollouts.rollout_settings import (
    POLICIES,
)

_ERROR_LABELS = {"any": "any", "yes": "with error", "no": "without error"}


_REWARD_LABELS = {"any": "any", "positive": "> 0", "zero": "= 0", "negative": "< 0"}


class TurnFilterForm(forms.Form):
    """The turn list's filters: a TurnSelection narrowed from every turn (`EVERY_TURN`)."""

    batch = forms.IntegerField(required=False, min_value=1, max_value=BIGINT_MAX)
    model = forms.CharField(required=False, max_length=200)
    flagged = forms.ChoiceField(
        choices=[(c, FLAGGED_LABELS[c]) for c in FLAGGED_CHOICES], required=False
    )
    has_error = forms.ChoiceField(
        choices=[(c, _ERROR_LABELS[c]) for c in ERROR_CHOICES], required=False, label="Error"
    )
    achievement = forms.ChoiceField(
        choices=[("", "any")] + [(a, a) for a in ACHIEVEMENTS],
        required=False,
        label="Unlocked",
    )
    policy = forms.ChoiceField(
        choices=[("", "any"), *((p, p) for p in (*POLICIES, "imported", "human"))], required=False
    )
    seed = forms.IntegerField(required=False, min_value=0, max_value=BIGINT_MAX)
    reward = forms.ChoiceField(
        choices=[(c, _REWARD_LABELS[c]) for c in REWARD_CHOICES], required=False
    )
    q = forms.CharField(
        required=False,
        max_length=200,
        label="Search",
        help_text="Model text, notes and observation text.",
    )

    def filters(self) -> TurnSelection:
        """The validated filters; call after is_valid()."""
        data = self.cleaned_data
        batch, model, policy = data.get("batch"), data.get("model"), data.get("policy")
        seed, achievement = data.get("seed"), data.get("achievement")
        return dataclasses.replace(
            EVERY_TURN,
            batches=(batch,) if batch is not None else (),
            models=(model,) if model else (),
            policies=(policy,) if policy else (),
            seeds=(seed,) if seed is not None else (),
            turn_unlocked=(achievement,) if achievement else (),
            flagged=data.get("flagged") or "any",
            has_error=data.get("has_error") or "any",
            reward=data.get("reward") or "any",
            search=(data.get("q") or "").strip(),
        )

    @staticmethod
    def query_for(selection: TurnSelection) -> dict[str, Any]:
        """The form's fields for a selection it made (a bulk flag's link back to the list)."""
        values: dict[str, Any] = {
            "batch": selection.batches[0] if selection.batches else None,
            "model": selection.models[0] if selection.models else "",
            "flagged": selection.flagged,
            "has_error": selection.has_error,
            "achievement": selection.turn_unlocked[0] if selection.turn_unlocked else "",
            "policy": selection.policies[0] if selection.policies else "",
            "seed": selection.seeds[0] if selection.seeds else None,
            "reward": selection.reward,
            "q": selection.search,
        }
        return {k: v for k, v in values.items() if v not in (None, "", "any")}


class FlagForm(forms.Form):
    """The wanted state, not a toggle: sending it twice changes nothing the second time."""

    flagged = forms.TypedChoiceField(
        choices=[("1", "flag"), ("0", "unflag")], coerce=lambda v: v == "1"
    )


class TurnNoteForm(forms.Form):
    note = forms.CharField(required=False, max_length=NOTE_MAX_LENGTH, strip=True)


class BulkFlagForm(forms.Form):
    """A field name of its own: `flagged` is already the filter (any / only / exclude)."""

    set_flagged = forms.TypedChoiceField(
        choices=[("1", "flag"), ("0", "unflag")], coerce=lambda v: v == "1"
    )


def turn_list_query(selection: TurnSelection) -> str:
    """The turn list's address query for a selection (its filter form's field names)."""
    return urlencode(TurnFilterForm.query_for(selection))
