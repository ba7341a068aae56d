"""The studio's own rows: as recorded, with the metadata object (docs/export-format.md)."""

from curation.row_formats.base import RowFormat, register

STUDIO = register(
    RowFormat(
        name="studio",
        label="Studio",
        form_help="rows with metadata.",
        command_help="rows with metadata; default",
        with_metadata=True,
        preference_rows="trl",
        hf_as_written=True,
    )
)
