from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def job_list(request: HttpRequest) -> HttpResponse:
    return render(request, "training/job_list.html")
