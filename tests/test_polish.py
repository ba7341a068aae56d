"""Small things a daily user notices: the favicon, the admin's names, quiet 403 / 404 logs."""

from __future__ import annotations

import logging

import pytest
from django.urls import reverse

from studio.testing import manage, subprocess_env

pytestmark = pytest.mark.django_db


def test_it_serves_a_favicon_without_a_login(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"].endswith("/static/studio/favicon.svg")


def test_it_links_the_favicon_from_every_page(viewer_client):
    page = viewer_client.get(reverse("rollouts:batch_list")).content.decode()
    assert 'rel="icon"' in page and "favicon.svg" in page


def test_it_titles_the_admin_for_the_studio(admin_user, client):
    client.force_login(admin_user)
    page = client.get("/admin/").content.decode()
    assert "Crafter VLM Studio administration" in page
    assert "Rollout batches" in page and "Rollout batchs" not in page


@pytest.fixture
def django_log(caplog):
    """Records of the "django" logger, which (by our settings) does not propagate to root."""
    logger = logging.getLogger("django")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING)
    yield caplog
    logger.removeHandler(caplog.handler)


def _request_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("django.")]


def test_it_logs_a_404_once_without_a_traceback(viewer_client, django_log):
    caplog = django_log
    assert viewer_client.get("/rollouts/987654/").status_code == 404
    (record,) = _request_records(caplog)
    assert record.getMessage() == "Not Found: /rollouts/987654/"
    assert record.exc_info is None and "Traceback" not in caplog.text


def test_it_logs_a_403_once_without_a_traceback(viewer_client, django_log):
    caplog = django_log
    assert viewer_client.get(reverse("rollouts:batch_create")).status_code == 403
    (record,) = _request_records(caplog)
    assert record.getMessage().startswith("Forbidden")
    assert record.exc_info is None and "Traceback" not in caplog.text


def test_it_prints_a_404_as_one_line_in_debug_too():
    """The demo runs with DEBUG on, where Django adds a console handler of its own."""
    code = (
        "from django.test import Client; assert Client().get('/no-such-page/').status_code == 404"
    )
    result = manage("shell", "-c", code, env={**subprocess_env(), "DEBUG": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["Not Found: /no-such-page/"]
