"""PolicyClient tells a policy that is gone (the read succeeded, nothing there) from one it
cannot read (the store failed): only the second keeps the last good policy."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agent_learning.agent.client import HttpEpisodeWriter, HttpPolicySource, PolicyClient
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import InvalidDocument, NotFound, TransientError
from agent_learning.pipeline import create_policy
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.memory import MemoryStore

AGENT = "tn2"


def make_policy(store: MemoryStore, clock: ManualClock) -> None:
    create_policy(store, SoftmaxPolicy.from_actions(AGENT, ["fast", "careful"]).to_document(created_at=clock.now()))


def test_a_deleted_policy_raises_not_found_instead_of_serving_the_cached_one() -> None:
    store, clock = MemoryStore(), ManualClock()
    make_policy(store, clock)
    client = PolicyClient(store, AGENT, refresh_seconds=10, clock=clock)
    assert client.choose().version == 1

    store.delete_agent(AGENT)
    clock.advance(10)
    with pytest.raises(NotFound, match=f"agent '{AGENT}' has no policy"):
        client.choose()
    assert client.last_error is not None and "has no policy" in client.last_error
    with pytest.raises(NotFound):  # within refresh_seconds too: nothing cached is served
        client.choose()

    make_policy(store, clock)  # the agent created again: the client serves its new policy
    assert client.choose().version == 1 and client.last_error is None


def test_a_failed_read_still_keeps_the_last_good_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    store, clock = MemoryStore(), ManualClock()
    make_policy(store, clock)
    client = PolicyClient(store, AGENT, refresh_seconds=0, clock=clock)
    good = client.policy()

    def unreachable(agent_id: str, etag: str | None) -> None:
        raise TransientError("store unreachable")

    monkeypatch.setattr(store, "get_current_policy_if_changed", unreachable)
    assert client.policy() is good
    assert client.last_error == "store unreachable"


@pytest.mark.parametrize(
    ("options", "fields"),
    [
        ({"timeout": 0}, ["timeout"]),  # every request failed at once ("Operation now in progress"), then retried
        ({"timeout": -1, "backoff": float("nan")}, ["timeout", "backoff"]),
        ({"backoff": -0.5}, ["backoff"]),  # time.sleep raised ValueError at the first retry, hiding the 503
        ({"attempts": 2.5}, ["attempts"]),  # range() raised TypeError at the first write
        ({"attempts": 0}, ["attempts"]),
    ],
)
def test_the_http_clients_name_a_bad_timeout_backoff_or_attempts_when_made(
    options: dict[str, object], fields: list[str]
) -> None:
    with pytest.raises(InvalidDocument, match=r"^invalid http episode writer: ") as raised:
        HttpEpisodeWriter("http://127.0.0.1:9", "key", **options)  # type: ignore[arg-type]
    assert raised.value.fields == fields
    if "timeout" in options:
        with pytest.raises(InvalidDocument, match=r"^invalid http policy source: timeout: must be a finite number of "
                                                  r"seconds, above 0"):
            HttpPolicySource("http://127.0.0.1:9", "key", timeout=options["timeout"])  # type: ignore[arg-type]


class SlowStore(MemoryStore):
    """A store whose policy read takes a while and records the thread it ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.read_threads: list[int] = []

    def get_current_policy_if_changed(self, agent_id: str, etag: str | None) -> Any:
        self.read_threads.append(threading.get_ident())
        time.sleep(0.05)
        return super().get_current_policy_if_changed(agent_id, etag)


def test_achoose_reads_the_store_off_the_event_loop_once_while_other_choices_use_the_cache() -> None:
    store, clock = SlowStore(), ManualClock()
    make_policy(store, clock)
    client = PolicyClient(store, AGENT, refresh_seconds=10, clock=clock)

    async def main() -> tuple[list[Any], int, int]:
        loop_thread = threading.get_ident()
        first = await client.achoose(context={"task": "billing"})
        clock.advance(10)  # a refresh is due: one task reads, the others draw from the cache
        ticks = 0

        async def tick() -> None:  # runs only if the loop is not blocked by the read
            nonlocal ticks
            while client._refreshing or ticks == 0:
                ticks += 1
                await asyncio.sleep(0.005)

        decisions = await asyncio.gather(*(client.achoose() for _ in range(5)), tick())
        return [first, *decisions[:5]], loop_thread, ticks

    decisions, loop_thread, ticks = asyncio.run(main())
    assert [d.version for d in decisions] == [1] * 6 and decisions[0].context == {"task": "billing"}
    assert len(store.read_threads) == 2 and loop_thread not in store.read_threads  # first read, one refresh
    assert ticks > 2  # the loop went on while the store was read
