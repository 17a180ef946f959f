"""``agent-learn keys``: keys for the Personalizer routes, which the app checks by their digest."""

from __future__ import annotations

import secrets

from agent_learning.app.callers import key_digest
from agent_learning.cli.options import json_option
from agent_learning.cli.output import _echo_json, out
from agent_learning.cli.root import _handle_errors, main

KEY_BYTES = 16
"""Random bytes in a new key: 32 hex digits, as Personalizer's keys have."""


@main.group()
def keys() -> None:
    """Keys of the Personalizer routes (Ocp-Apim-Subscription-Key)."""


@keys.command("new")
@json_option
@_handle_errors
def keys_new(as_json: bool) -> None:
    """A new random key and its SHA-256 digest. Give the key to the Personalizer client and the
    digest to the deployment (AGENT_LEARNING_PERSONALIZER_KEY_SHA256, azd PERSONALIZER_KEY_SHA256;
    comma-separate two to rotate): the app never holds the key itself."""
    key = secrets.token_hex(KEY_BYTES)
    if as_json:
        _echo_json({"key": key, "sha256": key_digest(key)})
        return
    out.print(f"key     {key}")
    out.print(f"sha256  {key_digest(key)}")
    out.print("Give the key to the client and the digest to the app: "
              "azd env set PERSONALIZER_KEY_SHA256 <sha256>, then azd provision.", highlight=False)
