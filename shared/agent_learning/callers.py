"""Who is calling an HTTP function: the identity that feedback sources and episode writes are tied to.

An identity must come from something the caller cannot choose freely, never from the request
body. Two things qualify under Azure Functions:

* App Service Authentication (Easy Auth) puts the caller's Entra ID object id in the
  ``X-MS-CLIENT-PRINCIPAL-ID`` header; the platform sets it and strips any copy a client sends.
  App Service documents that stripping for apps with authentication on (and sets
  ``WEBSITE_AUTH_ENABLED`` in them); in Azure without it, where a client could send any
  principal's id, the header is ignored (:func:`principal_header_trusted`).
* The function key. The host checks it but does not tell the worker which named key matched,
  so the identity is a hash of the key itself: holders of different keys are different callers,
  and nobody can become another caller without that caller's key. Give each client its own
  key (``az functionapp function keys set``) and compute the identity to configure with
  :func:`key_identity`.

The principal wins when both are present. A request with neither (the local Functions host,
where keys are not checked) is ``anonymous``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

PRINCIPAL_HEADER = "x-ms-client-principal-id"
KEY_HEADER = "x-functions-key"
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


EASY_AUTH_SETTING = "WEBSITE_AUTH_ENABLED"
"""What App Service sets (to ``True``) in an app whose App Service Authentication is on."""


def principal_header_trusted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the principal header can only come from the platform: outside Azure (no
    ``WEBSITE_INSTANCE_ID``: the local host, where nothing is checked anyway), or in Azure with
    App Service Authentication on (:data:`EASY_AUTH_SETTING`)."""
    env = os.environ if environ is None else environ
    return not env.get("WEBSITE_INSTANCE_ID") or env.get(EASY_AUTH_SETTING, "").strip().lower() == "true"


def identify(
    headers: Mapping[str, str], params: Mapping[str, str] | None = None, *, environ: Mapping[str, str] | None = None
) -> Caller:
    """The caller of a request, from its headers and query parameters (any key case); the
    principal header counts only where :func:`principal_header_trusted` (by ``environ``, default
    the process's environment)."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    principal = lower.get(PRINCIPAL_HEADER, "").strip()
    if principal and principal_header_trusted(environ):
        return Caller("principal", principal_identity(principal))
    key = lower.get(KEY_HEADER, "").strip() or str((params or {}).get(KEY_PARAM, "")).strip()
    if key:
        return Caller("key", key_identity(key))
    return Caller("anonymous", ANONYMOUS)
