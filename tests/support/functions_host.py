"""A stand-in for the Azure Functions host in front of ``function_app.py``, over real HTTP.

The host cannot run here, so this double does its part of an HTTP call and nothing else: it
matches the path against each HTTP function's declared route, checks the function key where the
function's binding says ``authLevel: FUNCTION`` (``x-functions-key`` or ``code=``), and calls the
function with a real ``azure.functions.HttpRequest``. In front of it, App Service
Authentication's part: a client's own ``X-MS-CLIENT-PRINCIPAL-ID`` is stripped, and a bearer
token that ``tokens`` knows becomes that header with the token's principal.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func
from app_functions import functions

PRINCIPAL_HEADER = "X-MS-CLIENT-PRINCIPAL-ID"


def _pattern(template: str) -> re.Pattern[str]:
    """A route template (``agents/{agent_id}/choose``) as a regular expression under ``/api/``."""
    parts = re.split(r"(\{[a-z_]+\})", template)
    body = "".join(f"(?P<{p[1:-1]}>[^/]+)" if p.startswith("{") else re.escape(p) for p in parts)
    return re.compile(f"^/api/{body}$")


def _http_functions() -> list[tuple[re.Pattern[str], list[str], str, Any]]:
    found = []
    for function in functions().values():
        trigger = json.loads(function.get_function_json())["bindings"][0]
        if trigger["type"] == "httpTrigger":
            found.append((_pattern(trigger["route"]), trigger["methods"], trigger["authLevel"], function))
    return found


@contextmanager
def functions_host(function_key: str, tokens: Mapping[str, str] | None = None) -> Iterator[str]:
    """Serve ``function_app``'s HTTP functions on a loopback port; yields the base URL. The host's
    function key is ``function_key``; ``tokens`` maps bearer tokens to Entra object ids (the
    authentication in front of the host)."""
    routes, known = _http_functions(), dict(tokens or {})

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet: the test reads answers, not logs
            pass

        def _answer(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            url = urlsplit(self.path)
            query = dict(parse_qsl(url.query))
            headers = {k: v for k, v in self.headers.items() if k.lower() != PRINCIPAL_HEADER.lower()}
            scheme, _, token = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() == "bearer" and token in known:
                headers[PRINCIPAL_HEADER] = known[token]
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            for pattern, methods, auth_level, function in routes:
                match = pattern.match(url.path)
                if not match:
                    continue
                if self.command not in methods:
                    return self._answer(405, b"", {})
                given = self.headers.get("x-functions-key") or query.get("code")
                if auth_level == "FUNCTION" and given != function_key:
                    return self._answer(401, b"", {})
                request = func.HttpRequest(method=self.command, url=self.path, headers=headers, params=query,
                                           route_params=match.groupdict(), body=body)
                response = function.get_user_function()(request)
                answer_headers = {**dict(response.headers), "Content-Type": response.mimetype}
                return self._answer(response.status_code, response.get_body(), answer_headers)
            self._answer(404, b"", {})

        do_GET = do_POST = do_PUT = do_DELETE = _handle

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
