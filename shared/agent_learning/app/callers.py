"""Who is calling an HTTP function: the identity that feedback sources and episode writes are tied to.

An identity must come from something the caller cannot choose freely, never from the request
body. Two things qualify under Azure Functions:

* App Service Authentication (Easy Auth) puts the caller's Entra ID object id in the
  ``X-MS-CLIENT-PRINCIPAL-ID`` header; the platform sets it and strips any copy a client sends.
  Nothing else strips it (a self-hosted Functions container checks keys but passes the header
  through), so the header counts only where the deployment states that authentication is on:
  ``AGENT_LEARNING_TRUST_PRINCIPAL_HEADER=true`` (``Settings.trust_principal_header``; the Bicep
  sets it from its ``appServiceAuthentication`` parameter). It is never inferred from the
  environment; without it the header is ignored and the caller is its key.
* The function key (``x-functions-key``, ``code=``, or ``Ocp-Apim-Subscription-Key`` as the
  Personalizer clients send it). The host checks it but does not tell the worker which named key matched,
  so the identity is a hash of the key itself: holders of different keys are different callers,
  and nobody can become another caller without that caller's key. Give each client its own
  key (``az functionapp function keys set``) and compute the identity to configure with
  :func:`key_identity`.

A trusted principal wins over a key. A request with neither (the local Functions host, where
keys are not checked) is ``anonymous``.

The Personalizer routes are the exception to "the host checks the key": Personalizer's clients send
their key as ``Ocp-Apim-Subscription-Key`` or an Entra ID token, neither of which the Functions host
reads, so the host serves those routes anonymously and :func:`admit` checks the caller in the app:
a key whose SHA-256 is among ``AGENT_LEARNING_PERSONALIZER_KEY_SHA256`` (two, like Personalizer's
Key1 and Key2, for rotation), or a principal App Service Authentication vouched for that is among
``AGENT_LEARNING_PERSONALIZER_PRINCIPALS``. Nothing configured admits nobody.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

PRINCIPAL_HEADER = "x-ms-client-principal-id"
KEY_HEADER = "x-functions-key"
SUBSCRIPTION_KEY_HEADER = "ocp-apim-subscription-key"
"""Where Azure AI Personalizer's clients (and API Management) send the key: a key like a function key."""
KEY_PARAM = "code"
ANONYMOUS = "anonymous"

_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class Caller:
    """The identity of an HTTP caller. ``id`` is safe as a document field and an id part
    (letters, digits and ``-``, at most 48 characters)."""

    kind: Literal["principal", "key", "anonymous"]
    id: str


def key_identity(key: str) -> str:
    """The caller identity of a function key: ``key-`` and 16 hex digits of its SHA-256."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def principal_identity(principal_id: str) -> str:
    """The caller identity of an Entra ID principal (its object id, hashed if not a GUID)."""
    principal_id = principal_id.strip()
    if _GUID.match(principal_id):
        return "principal-" + principal_id.lower()
    return "principal-" + hashlib.sha256(principal_id.encode()).hexdigest()[:16]


def identify(
    headers: Mapping[str, str], params: Mapping[str, str] | None = None, *, trust_principal: bool = False
) -> Caller:
    """The caller of a request, from its headers and query parameters (any key case); the
    principal header counts only with ``trust_principal`` (the deployment's
    ``trust_principal_header`` setting), else it is ignored."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    principal = lower.get(PRINCIPAL_HEADER, "").strip()
    if principal and trust_principal:
        return Caller("principal", principal_identity(principal))
    key = (lower.get(KEY_HEADER, "").strip() or lower.get(SUBSCRIPTION_KEY_HEADER, "").strip()
           or str((params or {}).get(KEY_PARAM, "")).strip())
    if key:
        return Caller("key", key_identity(key))
    return Caller("anonymous", ANONYMOUS)


_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def key_digest(key: str) -> str:
    """The SHA-256 of a key in hex: what ``AGENT_LEARNING_PERSONALIZER_KEY_SHA256`` lists, so the
    settings hold no key (``agent-learn keys new`` prints a new key with its digest)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _entries(value: object) -> list[str]:
    """A comma-separated setting's entries (or a list of them), stripped, empty ones left out."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, Iterable) else [value]
    return [str(item).strip() for item in items if str(item).strip()]


def parse_key_digests(value: object) -> tuple[str, ...]:
    """SHA-256 digests from a comma-separated setting; raises ValueError naming a bad entry
    without repeating it in full (a key pasted in place of its digest must not reach the logs)."""
    digests = []
    for entry in _entries(value):
        if not _DIGEST.match(entry.lower()):
            raise ValueError(f"{entry[:4]}… ({len(entry)} characters) is not a SHA-256 digest: give 64 hex digits "
                             f"(agent_learning.app.callers.key_digest of the key, as `agent-learn keys new` "
                             f"prints it), never the key itself")
        digests.append(entry.lower())
    return tuple(digests)


def parse_principals(value: object) -> tuple[str, ...]:
    """Entra ID object ids from a comma-separated setting; raises ValueError naming a bad entry."""
    principals = []
    for entry in _entries(value):
        if not _GUID.match(entry):
            raise ValueError(f"{entry[:40]!r} is not an Entra ID object id (a GUID)")
        principals.append(entry.lower())
    return tuple(principals)


@dataclass(frozen=True)
class Refusal:
    """Why :func:`admit` turned a request away: an HTTP status, Personalizer's error code and a message."""

    status: int
    code: str
    message: str


def admit(
    headers: Mapping[str, str],
    params: Mapping[str, str] | None = None,
    *,
    key_digests: Iterable[str],
    principals: Iterable[str],
    trust_principal: bool,
) -> Refusal | None:
    """``None`` when the request carries a key whose digest is in ``key_digests`` (in any of the
    forms :func:`identify` reads) or comes from a principal in ``principals`` that App Service
    Authentication vouched for (``trust_principal``); else why not. Fails closed: with neither
    configured, every request is refused."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    principal = lower.get(PRINCIPAL_HEADER, "").strip().lower() if trust_principal else ""
    if principal and principal in set(principals):
        return None
    given = [lower.get(KEY_HEADER, ""), lower.get(SUBSCRIPTION_KEY_HEADER, ""), str((params or {}).get(KEY_PARAM, ""))]
    digests = [key_digest(key.strip()).encode() for key in given if key.strip()]
    allowed = [digest.encode() for digest in key_digests]
    # every pair compared, so the time taken does not tell which digest came close
    if sum(hmac.compare_digest(d, a) for d in digests for a in allowed):
        return None
    if principal:
        return Refusal(403, "PermissionDenied", "the principal of this token may not call this agent's Personalizer "
                       "API: add its object id to AGENT_LEARNING_PERSONALIZER_PRINCIPALS")
    if not allowed:
        return Refusal(401, "401", "access denied: this deployment accepts no Personalizer key yet (set "
                       "AGENT_LEARNING_PERSONALIZER_KEY_SHA256 to the SHA-256 of each key)")
    problem = "invalid subscription key" if digests else "no subscription key"
    return Refusal(401, "401", f"access denied due to {problem}: send a key of this deployment as the "
                   f"Ocp-Apim-Subscription-Key header")
