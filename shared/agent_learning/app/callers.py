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
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
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
