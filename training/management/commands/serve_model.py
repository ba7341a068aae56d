"""`python manage.py serve_model JOB`: a trl job's trained model served as an endpoint."""

from __future__ import annotations

from typing import Any

from studio.commands import StudioCommand, usage_error
from training.model_store import ModelStoreError
from training.open_models import serving


class Command(StudioCommand):
    help = (
        "Serve a succeeded trl training job's model with vLLM (CUDA) or `transformers serve`, "
        "name it as a chat endpoint (default trl-job-N) and stay until Ctrl-C or SIGTERM, "
        "which stop the engine."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("job_id", type=int, metavar="JOB")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--engine", choices=serving.ENGINES, default="auto")
        parser.add_argument(
            "--endpoint", default="", metavar="NAME", help="the endpoint's name (trl-job-N)"
        )
        parser.add_argument("--device", choices=serving.DEVICES, default="auto")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["port"] <= 65535:
            raise usage_error(f"port: {options['port']} is not between 1 and 65535")
        serve_options = serving.ServeOptions(
            host=options["host"],
            port=options["port"],
            engine=options["engine"],
            endpoint=options["endpoint"],
            device=options["device"],
        )
        try:
            serving.serve(options["job_id"], serve_options, say=self._say)
        except (serving.ServingError, ModelStoreError) as exc:
            raise usage_error(str(exc)) from exc

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
