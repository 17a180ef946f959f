"""Caller identities of HTTP requests: derived from the platform's principal header or the key."""

from __future__ import annotations

import pytest

pytest.importorskip("azure.functions")

import azure.functions as func

from agent_learning.callers import ANONYMOUS, identify, key_identity, principal_header_trusted, principal_identity

GUID = "0F8FAD5B-D9CB-469F-A165-70867728950E"


def test_principal_header_wins_over_the_key_and_is_case_insensitive() -> None:
    caller = identify({"X-MS-CLIENT-PRINCIPAL-ID": GUID, "x-functions-key": "k1"})
    assert caller.kind == "principal"
    assert caller.id == "principal-" + GUID.lower()


def test_a_principal_that_is_not_a_guid_is_hashed_into_a_safe_id() -> None:
    ident = principal_identity("user@example.com/../#?")
    assert ident.startswith("principal-") and len(ident) == len("principal-") + 16
    assert ident.replace("-", "").isalnum()


def test_different_keys_are_different_callers_and_the_same_key_is_the_same() -> None:
    a, b = identify({"x-functions-key": "key-one"}), identify({"x-functions-key": "key-two"})
    assert a.kind == b.kind == "key"
    assert a.id != b.id
    assert a.id == key_identity("key-one") == identify({}, {"code": "key-one"}).id
    assert "key-one" not in a.id  # the key itself never becomes a stored identity


def test_a_request_without_principal_or_key_is_anonymous() -> None:
    assert identify({}, {}).id == ANONYMOUS
    assert identify({"x-functions-key": "  "}).kind == "anonymous"


def test_identity_from_a_real_functions_http_request() -> None:
    req = func.HttpRequest(
        "POST", "/api/x", headers={"X-Functions-Key": "secret"}, params={}, body=b"", route_params={}
    )
    assert identify(req.headers, req.params).id == key_identity("secret")
    req = func.HttpRequest("POST", "/api/x?code=secret", headers={}, params={"code": "secret"}, body=b"")
    assert identify(req.headers, req.params).id == key_identity("secret")


def test_in_azure_the_principal_header_counts_only_with_app_service_authentication_on() -> None:
    """Without it nothing is documented to strip a client's own copy of the header: any key
    holder could pass as any principal (or as many invented ones), so the key decides."""
    sent = {"X-MS-CLIENT-PRINCIPAL-ID": GUID, "x-functions-key": "k1"}
    azure = {"WEBSITE_INSTANCE_ID": "abc"}
    assert identify(sent, environ=azure) == identify({"x-functions-key": "k1"})
    assert identify({"X-MS-CLIENT-PRINCIPAL-ID": GUID}, environ=azure).id == ANONYMOUS
    for on in ("True", "true"):
        assert identify(sent, environ=azure | {"WEBSITE_AUTH_ENABLED": on}).id == "principal-" + GUID.lower()
    assert not principal_header_trusted(azure | {"WEBSITE_AUTH_ENABLED": "False"})
    assert principal_header_trusted({})  # the local host and tests: as before
