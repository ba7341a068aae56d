from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    """Datasets: filters, versions, export and import. The package is `curation` so that
    `import datasets` is Hugging Face's library; the app keeps its label (`datasets`), so its
    tables, migrations, permissions, URL names and templates are the same as ever."""

    name = "curation"
    label = "datasets"

    def ready(self) -> None:
        # Registers the job kinds with the periodic requeue, and "add to a dataset" with the
        # turn list's bulk actions (rollouts cannot import curation: it asks what is offered).
        from curation import jobs, services  # noqa: F401
