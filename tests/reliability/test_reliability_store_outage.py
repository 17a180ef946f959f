"""Reliability: Cosmos DB unreachable for a while (the network to it cut), then back.

The agents' client keeps serving the last policy it read; a scoring message whose handler
cannot reach the store is abandoned and comes back; a training tick that cannot reach it
fails and the next tick trains. Nothing is lost, nothing learned twice.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("azure.functions")
pytest.importorskip("azure.cosmos")
from cosmos_fixture import CLIENT_KWARGS, SteppingClock
from factories import make_episode
from faults import AGENT, Agent, FunctionsHost, NetworkCut, account, dead_lettered, start_policy
from reliability_report import record

from agent_learning.agent.client import PolicyClient
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import TransientError
from agent_learning.learning.reinforce import Reinforce
from agent_learning.pipeline import train_safely
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.store.cosmos import CosmosStore


@pytest.fixture
def network(cosmos_server: Any) -> Iterator[NetworkCut]:
    cut = NetworkCut(cosmos_server.port)
    yield cut
    cut.close()


@pytest.fixture
def direct(cosmos_database: Any) -> CosmosStore:
    """The store as the agents reach it (their network is not cut)."""
    store = CosmosStore(cosmos_database, clock=SteppingClock())
    store.ensure_containers()
    return store


def through(network: NetworkCut, cosmos_server: Any, database: Any) -> CosmosStore:
    """The same database, reached through the network that the test cuts."""
    kwargs = {**CLIENT_KWARGS, "enable_endpoint_discovery": False}
    return CosmosStore.connect(f"https://127.0.0.1:{network.port}/", database.id, key=cosmos_server.key,
                               client_kwargs=kwargs, clock=SteppingClock())


def test_agents_keep_serving_the_last_good_policy_while_the_store_is_unreachable(
    direct: CosmosStore, network: NetworkCut, cosmos_server: Any, cosmos_database: Any
) -> None:
    clock = ManualClock()
    start_policy(direct, clock)
    client = PolicyClient(through(network, cosmos_server, cosmos_database), AGENT, refresh_seconds=0,
                          rng=random.Random(1), clock=clock)
    good = client.policy()
    network.cut()
    for _ in range(3):
        assert client.choose().version == good.version
    assert client.last_error
    network.restore()
    assert client.refresh().version == good.version and client.last_error is None
    record("store outage", "cosmos", faults=network.refused, episodes=0, lost=0, double=0)


def test_the_pipeline_rides_out_a_store_outage(
    direct: CosmosStore, network: NetworkCut, cosmos_server: Any, cosmos_database: Any, tmp_path: Any
) -> None:
    clock = ManualClock()
    start_policy(direct, clock)
    queue = SQLiteQueue(tmp_path / "queue.db", clock=clock)
    host = FunctionsHost(through(network, cosmos_server, cosmos_database), queue, clock)
    agent = Agent(direct, clock)
    agent.run(5)
    host.pump()
    network.cut()
    host.score(passes=1)  # every delivery fails: the host abandons the messages
    host.tick()  # the tick fails; the next one trains
    assert host.events["abandoned"] == 5 and host.events["train failed"] == 1
    network.restore()
    host.score()
    host.tick()

    books = account(direct, agent.written, dead_lettered(queue))
    record("store outage", "cosmos", faults=network.refused, episodes=len(agent.written), lost=books.lost,
           double=len(books.double), kept=len(books.kept))
    assert books.lost == 0 and books.double == set() and books.kept == set() and books.versions == 2


def test_a_store_that_cannot_be_reached_is_unavailable_not_failed(
    direct: CosmosStore, network: NetworkCut, cosmos_server: Any, cosmos_database: Any
) -> None:
    """Refused connections are an outage, like throttling: the store raises TransientError from
    a call, a lazily read iterator and a coroutine, and a training run reports ``unavailable`` (a
    warning; the next tick trains) rather than ``failed`` (an error with a traceback)."""
    start_policy(direct, ManualClock())
    store = through(network, cosmos_server, cosmos_database)
    network.cut()
    outcome = train_safely(AGENT, store, Reinforce(), clock=ManualClock())
    assert outcome.status == "unavailable" and "unreachable" in outcome.reason, outcome
    with pytest.raises(TransientError, match="unreachable"):
        store.list_agents()
    with pytest.raises(TransientError, match="unreachable"):
        list(store.episode_ids(AGENT))

    async def write_async() -> None:
        try:
            await store.add_episode_async(make_episode("ep-outage", agent_id=AGENT))
        finally:
            await store.aclose()

    with pytest.raises(TransientError, match="unreachable"):
        asyncio.run(write_async())
    network.restore()
    assert store.list_agents() == [AGENT]
