"""What OpenAI fine-tuning accepts: no metadata, nested tools, the provider's limits checked
(at least 10 rows in the training file, at most 10 images a row). Preference pairs are
OpenAI's DPO rows."""

from curation.row_formats.base import RowFormat, register

# OpenAI refuses a training file of fewer rows (curation.validation.MIN_ROWS).
MIN_TRAIN_ROWS = 10

OPENAI = register(
    RowFormat(
        name="openai",
        label="OpenAI",
        form_help="what OpenAI fine-tuning accepts (no metadata, at least 10 rows, at most "
        "10 images a row).",
        command_help="what OpenAI fine-tuning accepts",
        with_metadata=False,
        tools="nested",
        provider_limits=True,
        min_train_rows=MIN_TRAIN_ROWS,
        preference_rows="openai",
        for_upload=True,
        listed_as="OpenAI",
    )
)
