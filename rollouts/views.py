import re

from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from rollouts import selectors
from rollouts.frame_store import FrameStore, frame_name

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def batch_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.batches_recent(), 25).get_page(request.GET.get("page"))
    return render(request, "rollouts/batch_list.html", {"page": page})


@require_GET
def frame_image(request: HttpRequest, sha256: str) -> HttpResponse:
    """A frame PNG by its sha256. The name is derived from the hash, never from user input."""
    if not _SHA256.match(sha256) or not selectors.frame_exists(sha256=sha256):
        raise Http404("no such frame")
    try:
        png = FrameStore().read(frame_name(sha256))
    except FileNotFoundError as exc:
        raise Http404("frame file missing") from exc
    response = HttpResponse(png, content_type="image/png")
    # Content-addressed: the bytes behind this URL never change.
    response["Cache-Control"] = "private, max-age=31536000, immutable"
    response["ETag"] = f'"{sha256}"'
    return response
