"""Caller identities of HTTP requests: derived from the platform's principal header or the key."""

from __future__ import annotations

import pytest

pytest.importorskip("azure.functions")

import azure.functions as func

from agent_learning.app.callers import ANONYMOUS, Refusal, admit, identify, key_digest, key_identity, principal_identity
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


# --------------------------------------------------------------------------- the Personalizer routes' own check


def admitted(headers: dict[str, str], params: dict[str, str] | None = None, **configured: object) -> object:
    options = {"key_digests": (key_digest("k1"),), "principals": (GUID.lower(),), "trust_principal": True,
               **configured}
    return admit(headers, params, **options)  # type: ignore[arg-type]


def test_a_listed_key_in_any_form_or_a_vouched_for_listed_principal_is_admitted() -> None:
    assert admitted({"Ocp-Apim-Subscription-Key": "k1"}) is None
    assert admitted({"x-functions-key": " k1 "}) is None
    assert admitted({}, {"code": "k1"}) is None
    assert admitted({"X-MS-CLIENT-PRINCIPAL-ID": GUID}) is None
    assert admitted({"Ocp-Apim-Subscription-Key": "k1", "X-MS-CLIENT-PRINCIPAL-ID": "another"}) is None


@pytest.mark.parametrize("headers, configured, status, says", [
    ({}, {}, 401, "no subscription key"),
    ({"Ocp-Apim-Subscription-Key": "k2"}, {}, 401, "invalid subscription key"),
    ({"X-MS-CLIENT-PRINCIPAL-ID": GUID}, {"trust_principal": False}, 401, "no subscription key"),
    ({"X-MS-CLIENT-PRINCIPAL-ID": "11111111-2222-3333-4444-555555555555"}, {}, 403, "PERSONALIZER_PRINCIPALS"),
    ({"Ocp-Apim-Subscription-Key": "k1"}, {"key_digests": ()}, 401, "PERSONALIZER_KEY_SHA256"),
    ({"X-MS-CLIENT-PRINCIPAL-ID": GUID}, {"principals": ()}, 403, "PERSONALIZER_PRINCIPALS"),
])
def test_everyone_else_is_refused_and_nothing_configured_refuses_all(
    headers: dict[str, str], configured: dict[str, object], status: int, says: str
) -> None:
    refusal = admitted(headers, **configured)
    assert isinstance(refusal, Refusal) and refusal.status == status and says in refusal.message


def test_the_settings_take_digests_and_object_ids_and_refuse_a_key_without_showing_it(monkeypatch: pytest.MonkeyPatch
                                                                                     ) -> None:
    monkeypatch.setenv("AGENT_LEARNING_PERSONALIZER_KEY_SHA256", f" {key_digest('a').upper()} ,{key_digest('b')},")
    monkeypatch.setenv("AGENT_LEARNING_PERSONALIZER_PRINCIPALS", GUID)
    s = load_settings()
    assert s.personalizer_key_sha256 == (key_digest("a"), key_digest("b")) and s.personalizer_principals == (
        GUID.lower(),)
    monkeypatch.setenv("AGENT_LEARNING_PERSONALIZER_KEY_SHA256", "0123456789abcdef-the-key-itself")
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_PERSONALIZER_KEY_SHA256") as bad:
        load_settings()
    assert "the-key-itself" not in str(bad.value)
    monkeypatch.delenv("AGENT_LEARNING_PERSONALIZER_KEY_SHA256")
    monkeypatch.setenv("AGENT_LEARNING_PERSONALIZER_PRINCIPALS", "someone@example.com")
    with pytest.raises(ConfigurationError, match=r"AGENT_LEARNING_PERSONALIZER_PRINCIPALS.*object id"):
        load_settings()
