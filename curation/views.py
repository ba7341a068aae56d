"""Dataset pages. Login is enforced for all of them by LoginRequiredMiddleware; editing,
exporting and importing need `rollouts.review_turn`; viewers can look and download."""

from __future__ import annotations

from django.conf import settings as django_settings
from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import PermissionDenied
from django.core.files.storage import default_storage
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import filesizeformat
from django.utils.text import slugify
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from curation import selectors, services, services_import
from curation.export_options import ExportOptions
from curation.forms import DatasetForm, ImportForm
from curation.jsonl import RowError
from curation.models import Dataset, DatasetImport, DatasetVersion
from curation.uploads import SizeLimitedUpload
from rollouts.models import REVIEW_PERMISSION
from rollouts.review.turn_selection import FilterError, TurnSelection
from studio.queue import QUEUE_UNREACHABLE

EDIT_PERMISSION = REVIEW_PERMISSION
POLL_SECONDS = 1
PREVIEW_ROWS = 5


def _can_edit(request: HttpRequest) -> bool:
    return request.user.has_perm(EDIT_PERMISSION)


@require_GET
def dataset_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "datasets/dataset_list.html",
        {"datasets": selectors.datasets_recent(), "can_edit": _can_edit(request)},
    )


@require_http_methods(["GET", "POST"])
@permission_required(EDIT_PERMISSION, raise_exception=True)
def dataset_new(request: HttpRequest) -> HttpResponse:
    form = DatasetForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        dataset = services.dataset_create(
            name=form.cleaned_data["name"],
            description=form.cleaned_data["description"],
            filters=form.filters,
            options=form.options,
            created_by=request.user,
        )
        messages.success(request, f"Dataset {dataset.name!r} saved.")
        return redirect("datasets:dataset_detail", dataset_id=dataset.id)
    return render(request, "datasets/dataset_new.html", {"form": form})


@require_http_methods(["GET", "POST"])
def dataset_detail(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = get_object_or_404(Dataset, id=dataset_id)
    if request.method == "POST":
        if not _can_edit(request):
            raise PermissionDenied
        if request.POST.get("action") == "clear_include":
            cleared = services.dataset_include_clear(dataset=dataset)
            messages.success(request, f"Include list cleared: {cleared} turn(s) no longer added.")
            return redirect("datasets:dataset_detail", dataset_id=dataset.id)
        form = DatasetForm.for_dataset(dataset, data=request.POST)
        if form.is_valid():
            services.dataset_update(
                dataset=dataset,
                name=form.cleaned_data["name"],
                description=form.cleaned_data["description"],
                filters=form.filters,
                options=form.options,
            )
            messages.success(request, "Filters saved. Existing versions keep their own.")
            return redirect("datasets:dataset_detail", dataset_id=dataset.id)
    else:
        form = DatasetForm.for_dataset(dataset)
    filters = TurnSelection.from_json(dataset.filters)
    options = ExportOptions.from_json(dataset.export_options)
    preview, preview_error = [], ""
    pairs = selectors.dataset_pair_preview(filters=filters, options=options, limit=PREVIEW_ROWS)
    try:
        if pairs is None:
            preview = selectors.dataset_preview(
                filters=filters, options=options, limit=PREVIEW_ROWS
            )
    except (RowError, OSError) as exc:
        preview_error = str(exc)
    return render(
        request,
        "datasets/dataset_detail.html",
        {
            "dataset": dataset,
            "form": form,
            "counts": selectors.dataset_counts(filters=filters, options=options),
            "groups": selectors.dataset_groups(filters=filters),
            "preview": preview,
            "pairs": pairs,
            "preview_error": preview_error,
            **_versions_context(dataset),
            "can_edit": _can_edit(request),
            "include_count": len(filters.include_turns),
        },
    )


def _versions_context(dataset: Dataset) -> dict:
    versions = list(selectors.dataset_versions(dataset=dataset))
    active = any(
        v.status in (DatasetVersion.Status.PENDING, DatasetVersion.Status.RUNNING) for v in versions
    )
    return {"versions": versions, "active": active, "poll_seconds": POLL_SECONDS}


@require_GET
def dataset_counts(request: HttpRequest) -> HttpResponse:
    """Live counts for the filter form as it is being edited (htmx)."""
    form = DatasetForm(request.GET)
    context: dict = {}
    if form.is_valid() or form.has_filters:
        # Counts stay in view when only saving would be refused (e.g. too few OpenAI rows).
        context["counts"] = selectors.dataset_counts(filters=form.filters, options=form.options)
        context["groups"] = selectors.dataset_groups(filters=form.filters)
    if not form.is_valid():
        # A missing name is for the save button to say, not the counts.
        context["errors"] = [
            e
            for name, errors in form.errors.items()
            if name not in ("name", "description")
            for e in errors
        ]
    return render(request, "datasets/partials/counts.html", context)


@require_GET
def dataset_versions(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = get_object_or_404(Dataset, id=dataset_id)
    return render(
        request,
        "datasets/partials/versions.html",
        {"dataset": dataset, **_versions_context(dataset), "can_edit": _can_edit(request)},
    )


@require_POST
@permission_required(EDIT_PERMISSION, raise_exception=True)
def version_create(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = get_object_or_404(Dataset, id=dataset_id)
    try:
        version = services.dataset_version_create(dataset=dataset, created_by=request.user)
    except FilterError as exc:
        messages.error(request, f"Cannot export: {exc}")
        return redirect("datasets:dataset_detail", dataset_id=dataset.id)
    version.refresh_from_db()
    if version.enqueued_at is None:
        messages.warning(
            request,
            f"Version {version.number} saved, but {QUEUE_UNREACHABLE}; "
            "the export will start when it is back.",
        )
    # Else no flash message: the versions table says "exporting" while it is, and stops.
    return redirect("datasets:dataset_detail", dataset_id=dataset.id)


@require_GET
def version_download(request: HttpRequest, version_id: int) -> FileResponse:
    version = get_object_or_404(DatasetVersion, id=version_id, status=DatasetVersion.Status.DONE)
    which = request.GET.get("file", "train")
    if which == "hf":
        return _hf_download(version)
    if which == "val":
        name = version.val.get("file")
        if not name:
            raise Http404("this version has no validation file")
    else:
        name = version.file.name
    try:
        handle = default_storage.open(name, "rb")
    except FileNotFoundError as exc:
        raise Http404("export file missing") from exc
    suffix = ".val.jsonl" if which == "val" else ".jsonl"
    filename = f"{slugify(version.dataset.name) or 'dataset'}-v{version.number}{suffix}"
    response = FileResponse(
        handle, as_attachment=True, filename=filename, content_type="application/jsonl"
    )
    response["X-Content-SHA256"] = (
        version.val.get("sha256", "") if which == "val" else version.sha256
    )
    return response


def _hf_download(version: DatasetVersion) -> FileResponse:
    """The version as a zipped Hugging Face dataset ("Download for TRL")."""
    if not version.hf_file:
        raise Http404("this version has no Hugging Face export")
    try:
        handle = default_storage.open(version.hf_file.name, "rb")
    except FileNotFoundError as exc:
        raise Http404("export file missing") from exc
    filename = f"{slugify(version.dataset.name) or 'dataset'}-v{version.number}-hf.zip"
    response = FileResponse(
        handle, as_attachment=True, filename=filename, content_type="application/zip"
    )
    response["X-Content-SHA256"] = version.hf_sha256
    return response


@require_http_methods(["GET", "POST"])
@permission_required(EDIT_PERMISSION, raise_exception=True)
@csrf_exempt  # checked in _dataset_import, once the size limit is in place
def dataset_import(request: HttpRequest) -> HttpResponse:
    """Save the upload and hand it to a worker; the import's own page shows how it goes.

    The size limit holds while the file streams in: a declared length over it is refused
    before the body is read, and an upload that grows past it is cut off mid-stream.
    """
    limit = django_settings.STUDIO_IMPORT_MAX_BYTES
    if request.method == "POST":
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        # The multipart envelope around the file is small; allow for it.
        if declared > limit + 64 * 1024:
            return _import_page(request, _too_large(limit), status=400)
        request.upload_handlers.insert(0, SizeLimitedUpload(request, limit=limit))
    return _dataset_import(request)


@csrf_protect
def _dataset_import(request: HttpRequest) -> HttpResponse:
    form = ImportForm(request.POST or None, request.FILES or None)
    if request.method != "POST":
        return _import_page(request, form)
    if getattr(request, "upload_too_large", False):
        limit = django_settings.STUDIO_IMPORT_MAX_BYTES
        return _import_page(request, _too_large(limit), status=400)
    if not form.is_valid():
        return _import_page(request, form, status=400)
    job = services_import.dataset_import_create(
        upload=form.cleaned_data["file"],
        name=form.cleaned_data["name"],
        skip_existing=form.cleaned_data["skip_existing"],
        created_by=request.user,
    )
    job.refresh_from_db()
    if job.enqueued_at is None:
        messages.warning(request, f"{QUEUE_UNREACHABLE}; the import will start when it is back.")
    else:
        messages.success(request, f"{job.original_name} is being checked and imported.")
    return redirect("datasets:import_detail", import_id=job.id)


def _too_large(limit: int) -> ImportForm:
    """The form as a refused upload leaves it: one error on the file, the size limit."""
    form = ImportForm(data={})
    form.is_valid()
    form.errors.pop("file", None)
    form.add_error("file", f"The file is larger than {filesizeformat(limit)} ({limit} bytes).")
    return form


def _import_page(request: HttpRequest, form: ImportForm, *, status: int = 200) -> HttpResponse:
    return render(
        request,
        "datasets/dataset_import.html",
        {
            "form": form,
            "max_bytes": django_settings.STUDIO_IMPORT_MAX_BYTES,
            "imports": selectors.imports_recent(),
        },
        status=status,
    )


@require_GET
def import_detail(request: HttpRequest, import_id: int) -> HttpResponse:
    job = get_object_or_404(DatasetImport, id=import_id)
    context = {
        "job": job,
        "active": job.status in (DatasetImport.Status.PENDING, DatasetImport.Status.RUNNING),
        "poll_seconds": POLL_SECONDS,
    }
    if request.htmx:
        return render(request, "datasets/partials/import_status.html", context)
    return render(request, "datasets/import_detail.html", context)
