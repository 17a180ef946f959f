"""``agent-learn serve``: the Functions app's HTTP routes and its pipeline, in one local process."""

from __future__ import annotations

import ipaddress
import signal
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

from agent_learning.cli.access import _embedded, _existing, _settings, _where
from agent_learning.cli.options import FloatRange, IntRange, db_option
from agent_learning.cli.output import err, out
from agent_learning.cli.root import _handle_errors, main

DEFAULT_HOST = "127.0.0.1"
"""Where the server listens unless ``--host`` says otherwise: this machine only."""

DEFAULT_PORT = 7071
"""The Functions host's port (``func start``), so that the same URLs work with either."""

POLL_SECONDS = 1.0
"""How often the change feed and the scorer look for new work (an idle pass costs two queries)."""

TRAIN_SECONDS = 5.0
"""Seconds between training ticks: in Azure the timer's ``AGENT_LEARNING_TRAIN_SCHEDULE``; shorter
here, so that a change shows while you try it."""

SECONDS = FloatRange(0, None, min_open=True)


def _key(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("is empty; give the key every request must carry, or leave the option out")
    return value


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the server as Ctrl-C does


@main.command()
@db_option
@click.option("--host", default=DEFAULT_HOST,
              help=f"Address to listen on (default {DEFAULT_HOST}: this machine only). Without --key, give "
                   "another one only on a network you trust: every route answers anyone who reaches it.")
@click.option("--port", type=IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port to listen on (0: a free one, printed).")
@click.option("--key", default=None, callback=_key,
              help="Answer only requests that carry this key: the x-functions-key header, the code= query "
                   "parameter or the Ocp-Apim-Subscription-Key header (others get 401).")
@click.option("--poll-every", type=SECONDS, default=POLL_SECONDS, show_default=True, metavar="SECONDS",
              help="How often the change feed and the scorer look for new episodes.")
@click.option("--train-every", type=SECONDS, default=TRAIN_SECONDS, show_default=True, metavar="SECONDS",
              help="Seconds between training ticks (the timer).")
@_handle_errors
def serve(db: str | None, host: str, port: int, key: str | None, poll_every: float,
          train_every: float) -> None:
    """Serve the Functions app's HTTP routes under /api/, with the same handlers, and run its
    pipeline in the background as the Functions host does: the change feed sends new episodes to
    the scoring queue, the scorer scores them, and a training tick trains the agents with new
    scores. All on the store and queues the settings choose (the embedded SQLite file by default,
    created if missing) and the settings' judge. Ctrl-C or SIGTERM stops it."""
    from agent_learning.app import server

    settings = _settings(db)
    if settings.store == "sqlite" and Path(settings.sqlite_path).exists():
        _existing(settings)  # never another program's file
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        with ExitStack() as closing:
            with _embedded(settings, "store"):
                rt, pipeline = closing.enter_context(server.local_runtime(settings))
            stages = server.Stages(rt, pipeline, poll_seconds=poll_every, train_seconds=train_every)
            app = server.asgi_app(rt, key=key, lifespan=server.stages_lifespan(stages))
            sock = server.listen(host, port)
            closing.callback(sock.close)
            shown = f"[{host}]" if ":" in host else host
            out.print(f"serving http://{shown}:{sock.getsockname()[1]}/api/ from {_where(settings)}, "
                      f"{settings.judge} judge, "
                      + ("key required" if key else "no key"), highlight=False)
            for line in server.route_lines():
                out.print(f"  {line}", highlight=False)
            out.print(f"background: change feed and scorer every {poll_every:g} s, training every {train_every:g} s; "
                      "Ctrl-C stops it", highlight=False)
            if key is None and not _loopback(host):
                err.print(f"warning: no --key: anyone who reaches {host} can call every route", highlight=False)
            server.serve(app, sock)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
