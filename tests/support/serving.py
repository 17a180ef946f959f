"""Requests to a server under test over real HTTP, and waiting for what its background does."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from email.message import Message
from typing import Any

WAIT_SECONDS = 30.0
"""The longest a test waits for a server to start or its background to act (it takes well under a second)."""


def call(url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None
         ) -> tuple[int, Message, bytes]:
    """Status, headers and body of one request (an error status is an answer too); ``body`` is
    sent as JSON, or as it is if it is bytes."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as answer:
        return answer.code, answer.headers, answer.read()


def until(check: Callable[[], Any], what: str) -> Any:
    """``check()`` once it is truthy, within :data:`WAIT_SECONDS`."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} within {WAIT_SECONDS:.0f} s"
        time.sleep(0.05)
    return found
