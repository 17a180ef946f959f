"""Requests to a server under test over real HTTP, and waiting for what its background does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from clean_settings import SETTING_PREFIXES

SHARED = Path(__file__).resolve().parents[2] / "shared"

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


def environment(**settings: str) -> dict[str, str]:
    """This process's environment without its settings, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SETTING_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SHARED), os.environ.get("PYTHONPATH")]))
    return {**env, **settings}


@dataclass
class Server:
    """A running ``agent-learn serve`` and where its output goes."""

    process: subprocess.Popen[bytes]
    out: Path
    err: Path
    url: str = ""

    def banner(self) -> str:
        return self.out.read_text()

    def stop(self, how: signal.Signals) -> tuple[int, str]:
        """Send ``how``; the exit code and what it said on stderr."""
        self.process.send_signal(how)
        code = self.process.wait(timeout=WAIT_SECONDS)
        return code, self.err.read_text()


def start(folder: Path, *args: str, **settings: str) -> Server:
    """``agent-learn serve --db folder/local.db --port 0 ARGS`` with short intervals, once it listens."""
    out, err = folder / "serve.out", folder / "serve.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "agent_learning.cli", "serve", "--db", str(folder / "local.db"), "--port", "0",
             "--poll-every", "0.05", "--train-every", "0.2", *args],
            stdout=stdout, stderr=stderr, env=environment(**settings), cwd=folder,
        )
    server = Server(process, out, err)

    def listening() -> str | None:
        assert process.poll() is None, f"serve exited with {process.returncode}: {err.read_text()}"
        found = re.search(r"http://\S+/api/", server.banner())
        return found.group(0) if found else None

    server.url = until(listening, "banner").removesuffix("/api/")
    return server
