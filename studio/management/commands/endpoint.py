"""`python manage.py endpoint NAME --kind K --base-url URL [--key-env VAR] [--disable]`: name
an endpoint as an admin does under /admin/; `endpoint --list` shows them, never a key."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError

from studio.commands import StudioCommand, usage_error
from studio.endpoints import endpoint_key_set, endpoint_save
from studio.models import Endpoint, endpoint_kind_choices
from studio.untrusted import terminal_safe

# The model's fields as this command's arguments, for its one-line errors.
_FLAGS = {
    "name": "NAME",
    "kind": "--kind",
    "base_url": "--base-url",
    "api_key_env": "--key-env",
    "enabled": "--disable",
    "__all__": "endpoint",
}


class Command(StudioCommand):
    help = (
        "Create or update a named endpoint (a model server or a training provider) with the "
        "admin's rules; the last line is a JSON summary. The command states the endpoint "
        "whole: a key variable or --disable not given is cleared. --list shows them all."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", nargs="?", metavar="NAME")
        parser.add_argument("--kind", choices=[name for name, _ in endpoint_kind_choices()])
        parser.add_argument("--base-url", metavar="URL")
        parser.add_argument(
            "--key-env",
            default="",
            metavar="VAR",
            help="the name of the environment variable holding the key on the workers "
            "(e.g. OPENAI_API_KEY), never the key; not given: no key is sent",
        )
        parser.add_argument(
            "--disable", action="store_true", help="keep it, but offer and use it nowhere"
        )
        parser.add_argument("--list", action="store_true", help="list the endpoints and stop")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            given = [f for f in ("name", "kind", "base_url") if options[f] is not None]
            if given or options["key_env"] or options["disable"]:
                raise usage_error("--list takes no other argument")
            self._list()
            return
        if not options["name"]:
            raise usage_error("NAME: give the endpoint's name, or --list")
        for option, flag in (("kind", "--kind"), ("base_url", "--base-url")):
            if options[option] is None:
                raise usage_error(f"{flag} is required")
        try:
            endpoint, created = endpoint_save(
                name=options["name"],
                kind=options["kind"],
                base_url=options["base_url"],
                key_env=options["key_env"],
                enabled=not options["disable"],
            )
        except ValidationError as exc:
            raise usage_error(_one_line(exc)) from None
        self.stdout.write(
            json.dumps(
                {
                    "endpoint": endpoint.name,
                    "kind": endpoint.kind,
                    "base_url": endpoint.base_url,
                    "key_env": endpoint.api_key_env,
                    "enabled": endpoint.enabled,
                    "created": created,
                }
            )
        )

    def _list(self) -> None:
        rows = [("NAME", "KIND", "ENABLED", "KEY VARIABLE", "KEY", "BASE URL")]
        for endpoint in Endpoint.objects.order_by("name"):
            key_set = endpoint_key_set(endpoint)
            rows.append(
                (
                    endpoint.name,
                    endpoint.kind,
                    "yes" if endpoint.enabled else "no",
                    endpoint.api_key_env or "-",
                    "-" if key_set is None else ("set" if key_set else "not set"),
                    endpoint.base_url,
                )
            )
        if len(rows) == 1:
            self.stdout.write("No endpoint yet: `endpoint NAME --kind K --base-url URL` adds one.")
            return
        # Names and URLs were typed by people: shown, never obeyed by the terminal.
        rows = [tuple(terminal_safe(cell) for cell in row) for row in rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            self.stdout.write("  ".join([*cells, row[-1]]))


def _one_line(exc: ValidationError) -> str:
    """The model's complaints, each named by the argument that caused it."""
    said = [
        f"{_FLAGS.get(field, field)}: {' '.join(messages).rstrip('.')}"
        for field, messages in exc.message_dict.items()
    ]
    return terminal_safe("; ".join(said))
