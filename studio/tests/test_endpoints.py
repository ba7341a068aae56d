import pytest
from django.core.exceptions import ValidationError

from studio.endpoints import (
    EndpointError,
    endpoint_api_key,
    endpoint_check_model,
    endpoint_enabled_first,
    endpoint_get,
    endpoints_enabled,
    endpoints_seed_defaults,
)
from studio.models import Endpoint


@pytest.mark.django_db
def test_it_reads_the_key_from_the_named_variable_only(monkeypatch):
    endpoint = Endpoint.objects.create(
        name="local", base_url="http://127.0.0.1:9/v1", api_key_env="LOCAL_TEST_KEY"
    )
    monkeypatch.setenv("LOCAL_TEST_KEY", "sk-local")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-other")
    assert endpoint_api_key(endpoint) == "sk-local"
    endpoint.api_key_env = ""
    assert endpoint_api_key(endpoint) == ""


@pytest.mark.django_db
def test_it_refuses_an_unknown_or_disabled_endpoint_naming_the_known_ones():
    Endpoint.objects.create(name="local", base_url="http://127.0.0.1:9/v1")
    Endpoint.objects.create(name="off", base_url="http://127.0.0.1:9/v1", enabled=False)
    with pytest.raises(EndpointError, match="no chat endpoint named 'off'; known: local"):
        endpoint_get(name="off", kind="chat")
    with pytest.raises(EndpointError, match="no synth endpoint"):
        endpoint_get(name="local", kind="synth")


@pytest.mark.django_db
def test_it_limits_models_when_a_list_is_given():
    endpoint = Endpoint.objects.create(
        name="local", base_url="http://127.0.0.1:9/v1", allowed_models=["a"]
    )
    endpoint_check_model(endpoint=endpoint, model="a")
    with pytest.raises(EndpointError, match="'b' is not allowed"):
        endpoint_check_model(endpoint=endpoint, model="b")


@pytest.mark.django_db
def test_it_rejects_a_key_where_a_variable_name_belongs():
    endpoint = Endpoint(name="x", base_url="http://127.0.0.1:9/v1", api_key_env="sk-abc/123")
    with pytest.raises(ValidationError, match="api_key_env"):
        endpoint.full_clean()


@pytest.mark.django_db
def test_it_seeds_defaults_from_the_environment_once(settings):
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    settings.SYNTH_BACKEND_URL = "http://127.0.0.1:10/api"
    Endpoint.objects.all().delete()
    created = endpoints_seed_defaults()
    assert sorted((e.name, e.kind, e.api_key_env) for e in created) == [
        ("default", "chat", "OPENAI_API_KEY"),
        ("synth", "synth", "SYNTH_API_KEY"),
    ]
    assert endpoints_seed_defaults() == []


@pytest.mark.django_db
def test_it_seeds_openai_itself_from_a_key_alone(settings):
    settings.OPENAI_BASE_URL = ""
    settings.OPENAI_API_KEY = "sk-only-a-key"
    settings.SYNTH_BACKEND_URL = ""
    Endpoint.objects.all().delete()
    (endpoint,) = endpoints_seed_defaults()
    assert (endpoint.name, endpoint.base_url, endpoint.api_key_env) == (
        "default",
        "https://api.openai.com/v1",
        "OPENAI_API_KEY",
    )


@pytest.mark.django_db
def test_the_sql_lookup_finds_what_the_queryset_finds():
    here, there = "http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"
    Endpoint.objects.create(name="zeta", base_url=here, allowed_models=["m"])
    Endpoint.objects.create(name="alpha", base_url=here)  # first by name
    Endpoint.objects.create(name="aaa-off", base_url=here, enabled=False)
    Endpoint.objects.create(name="aa-synth", base_url=here, kind=Endpoint.Kind.SYNTH)
    Endpoint.objects.create(name="other", base_url=there)
    cases = [
        {"kind": "chat"},
        {"kind": "chat", "base_url": here},
        {"kind": "chat", "base_url": there},
        {"kind": "chat", "base_url": "http://nowhere/v1"},
        {"kind": "synth", "base_url": here},
        {"kind": "chat", "name": "zeta"},
        {"kind": "chat", "name": "aaa-off"},
        {"kind": "chat", "name": "aa-synth"},
        {"kind": "chat", "name": "zeta", "base_url": there},
    ]
    found = []
    for case in cases:
        filters = {k: v for k, v in case.items() if k != "kind"}
        expected = endpoints_enabled(kind=case["kind"]).filter(**filters).first()
        got = endpoint_enabled_first(**case)
        assert got == expected, case
        if got is not None:
            fields = ("base_url", "allowed_models", "api_key_env")
            assert [getattr(got, f) for f in fields] == [getattr(expected, f) for f in fields]
        found.append(got.name if got else None)
    # Worked out by hand: the first enabled one by name, of that kind, with those values.
    assert found == ["alpha", "alpha", "other", None, "aa-synth", "zeta", None, None, None]
