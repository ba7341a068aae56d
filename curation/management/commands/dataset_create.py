"""`python manage.py dataset_create --name NAME [the filter flags of export_jsonl]`: save a
dataset, as **New dataset** on /datasets/ does; export its versions later."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.db import transaction

from curation.command_options import add_filter_arguments, filters_from_options
from curation.selectors import dataset_save_problems, selection_size
from curation.services import dataset_create
from studio.commands import StudioCommand, usage_error
from studio.untrusted import terminal_safe


class Command(StudioCommand):
    help = (
        "Save a dataset (a filter over turns and its export options) without exporting it; "
        "the last line is a JSON summary. Exit 2 on bad input, 1 when nothing matches "
        "(unless --allow-empty)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", required=True, metavar="NAME")
        parser.add_argument("--description", default="", metavar="TEXT")
        add_filter_arguments(parser, with_dataset=False)

    def handle(self, *args: Any, **options: Any) -> None:
        filters, export_options = filters_from_options(options)
        # The page refuses these when saved, not at export time; so does the command.
        problems = dataset_save_problems(filters=filters, options=export_options)
        if problems:
            raise usage_error(terminal_safe(" ".join(problems)))
        with transaction.atomic():
            size = selection_size(filters=filters)
            if not size["turns"] and not export_options.allow_empty:
                raise CommandError(
                    "no turn matches these filters; nothing saved (--allow-empty saves it anyway)",
                    returncode=1,
                )
            try:
                dataset = dataset_create(
                    name=options["name"],
                    description=options["description"],
                    filters=filters,
                    options=export_options,
                )
            except ValidationError as exc:
                said = [
                    f"{'--' + field if field != '__all__' else 'dataset'}: {' '.join(messages)}"
                    for field, messages in exc.message_dict.items()
                ]
                raise usage_error(terminal_safe("; ".join(said))) from None
        self.stdout.write(
            json.dumps(
                {"dataset_id": dataset.id, "turns": size["turns"], "episodes": size["episodes"]}
            )
        )
