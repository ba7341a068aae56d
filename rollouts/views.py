from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from rollouts import selectors


def batch_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.batches_recent(), 25).get_page(request.GET.get("page"))
    return render(request, "rollouts/batch_list.html", {"page": page})
