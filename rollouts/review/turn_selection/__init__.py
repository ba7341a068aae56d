"""Which turns: one declaration of the turn filter, and the one function that makes it SQL.

The turn list (its page, its counts and its bulk flag) and datasets (their live counts,
versions, exports, preference pairs, evaluation seeds) all select turns here, so a filter
means the same thing wherever it is used.

A selection is a plain value, JSON-ready: stored on `Dataset.filters`, snapshotted on each
`DatasetVersion`, and on `TurnBulkFlag.filters`. A key missing from stored JSON takes the
field's default, so the defaults are a dataset's: fork prefixes and turns whose actions were
read from prose are left out unless asked for. The turn list shows every turn
(`EVERY_TURN`) and narrows it from there.

Achievements have two meanings, both kept as options of their own:

- `turn_unlocked`: the turn itself unlocked each of these (`Turn.achievements_unlocked`);
  the turn list's "Unlocked" filter.
- `require_achievements` / `exclude_achievements`: the turn's *episode* unlocked all / none
  of these at some turn (`Episode.achievements`); a dataset's filter, which keeps every
  turn of a good episode.

Turns named by id have two meanings as well:

- `turn_ids`: these turns (the turn list's ticked rows), and whatever else the selection says;
- `include_turns`: a dataset's include list, turns kept whatever the other filters say.
"""

from rollouts.review.turn_selection.declaration import (
    BIGINT_MAX,
    ERROR_CHOICES,
    EVERY_TURN,
    FLAGGED_CHOICES,
    FLAGGED_LABELS,
    INCLUDE_TURNS_MAX,
    RELABELED_CHOICES,
    REWARD_CHOICES,
    TURN_IDS_MAX,
    Filter,
    FilterError,
    TurnSelection,
    filter_kind,
    filter_of,
    filter_option,
    filter_text,
    filter_word,
    option_types,
    options_from_json,
    options_to_json,
    selection_summary,
    turn_filters,
)
from rollouts.review.turn_selection.query import (
    GROUP_ORDER,
    MEAN_TOLERANCE,
    assistant_image_q,
    check_references,
    grouping_on,
    has_episode_conditions,
    kept_episodes,
    ranked_episodes,
    turns_selected,
    user_image_q,
)

__all__ = [
    "BIGINT_MAX",
    "ERROR_CHOICES",
    "EVERY_TURN",
    "FLAGGED_CHOICES",
    "FLAGGED_LABELS",
    "GROUP_ORDER",
    "INCLUDE_TURNS_MAX",
    "MEAN_TOLERANCE",
    "RELABELED_CHOICES",
    "REWARD_CHOICES",
    "TURN_IDS_MAX",
    "Filter",
    "FilterError",
    "TurnSelection",
    "assistant_image_q",
    "check_references",
    "filter_kind",
    "filter_of",
    "filter_option",
    "filter_text",
    "filter_word",
    "grouping_on",
    "has_episode_conditions",
    "kept_episodes",
    "option_types",
    "options_from_json",
    "options_to_json",
    "ranked_episodes",
    "selection_summary",
    "turn_filters",
    "turns_selected",
    "user_image_q",
]
