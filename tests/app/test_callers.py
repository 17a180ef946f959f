"""Caller identities of HTTP requests: derived from the platform's principal header or the key."""

from __future__ import annotations

import pytest

pytest.importorskip("azure.functions")

import azure.functions as func

from agent_learning.app.callers import ANONYMOUS, identify, key_identity, principal_identity
from agent_learning.app.settings import load_settings
from agent_learning.core.errors import ConfigurationError

GUID = "0F8FAD5B-D9CB-469F-A165-70867728950E"


def test_a_trusted_principal_header_wins_over_the_key_and_is_case_insensitive() -> None:
    caller = identify({"X-MS-CLIENT-PRINCIPAL-ID": GUID, "x-functions-key": "k1"}, trust_principal=True)
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


def test_the_principal_header_counts_only_where_the_settings_say_app_service_authentication_is_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the platform strips a client's own copy of the header; a self-hosted container checks
    keys but passes it through. So it is never inferred from the environment (neither the
    absence of ``WEBSITE_INSTANCE_ID`` nor ``WEBSITE_AUTH_ENABLED`` makes it count): one key
    could otherwise pass as any principal, or as many invented ones."""
    sent = {"X-MS-CLIENT-PRINCIPAL-ID": GUID, "x-functions-key": "k1"}
    monkeypatch.delenv("AGENT_LEARNING_TRUST_PRINCIPAL_HEADER", raising=False)
    monkeypatch.delenv("WEBSITE_INSTANCE_ID", raising=False)
    monkeypatch.setenv("WEBSITE_AUTH_ENABLED", "True")
    trusted = load_settings().trust_principal_header
    assert trusted is False
    assert identify(sent, trust_principal=trusted) == identify(sent) == identify({"x-functions-key": "k1"})
    assert identify({"X-MS-CLIENT-PRINCIPAL-ID": GUID}).id == ANONYMOUS
    for on in ("true", "True", "1"):
        monkeypatch.setenv("AGENT_LEARNING_TRUST_PRINCIPAL_HEADER", on)
        trusted = load_settings().trust_principal_header
        assert identify(sent, trust_principal=trusted).id == "principal-" + GUID.lower()
    monkeypatch.setenv("AGENT_LEARNING_TRUST_PRINCIPAL_HEADER", "yes please")
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_TRUST_PRINCIPAL_HEADER"):
        load_settings()
