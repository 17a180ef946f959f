"""One event loop in a daemon thread, for the lifetime of a judge.

The judge's port is synchronous and called from many threads (the Functions worker's pool, the
embedded runner, the benchmark). Running each call in ``asyncio.run`` made a new event loop per
episode, and with it new HTTP clients; submitting every call to one long-lived loop lets the
judge's HTTP connections and clients live as long as the judge. The caller's context variables
(OpenTelemetry's current span, for one) travel with the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """Runs coroutines on one event loop in a daemon thread, started on first use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def current(self) -> asyncio.AbstractEventLoop | None:
        """The loop if it has been started, else ``None`` (never starts it)."""
        return self._loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if it is not yet)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (in the caller's context).

        After ``timeout`` seconds the caller stops waiting: ``coro`` is cancelled (as soon as the loop
        runs again, if something blocks it) and TimeoutError is raised."""
        loop = self.loop
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(f"{self.name}: a blocking call from the judge's own event loop would deadlock")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():  # coro's own TimeoutError, or it finished just now
                return future.result()
            future.cancel()
            raise TimeoutError(f"{self.name}: no result within {timeout:g} s") from None

    def call(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` in the loop's thread and wait for its result."""

        async def call() -> T:
            return fn()

        return self.run(call())

    def close(self, cleanup: Callable[[], Coroutine[Any, Any, Any]] | None = None) -> None:
        """Run ``cleanup()`` on the loop, then stop it and join its thread. Idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            if cleanup is not None:
                asyncio.run_coroutine_threadsafe(cleanup(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()
