"""End to end over the wire: the real azure-cosmos SDK against the local Cosmos server, the
real azure-servicebus SDK against the AMQP test broker, and the Functions app's own functions.

agent (PolicyClient + EpisodeCapture) → Cosmos `episodes` → change-feed pump → `enqueue` →
broker → `score` → Cosmos `scores` → `train` → new policy version → the agent picks it up.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("azure.functions")
pytest.importorskip("azure.cosmos")
pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

import azure.functions as func
from amqp_broker import amqp_broker  # noqa: F401  (the fixture; needs python-qpid-proton)
from app_functions import functions
from azure.functions.servicebus import ServiceBusMessage
from azure.functions.timer import TimerRequest
from cosmos_fixture import CLIENT_KWARGS, SteppingClock

from agent_learning.agent.client import PolicyClient
from agent_learning.app import handlers
from agent_learning.app.settings import load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.pipeline import create_policy
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.servicebus import ServiceBusQueue
from agent_learning.sim.simulate import support_bot
from agent_learning.store.cosmos import CosmosStore

pytestmark = pytest.mark.timeout(300)

FUNCTIONS = {name: f.get_user_function() for name, f in functions().items()}
AGENT = "support-bot"
QUEUE = "score-episodes"
TRAIN_QUEUE = "train-agents"


class Pipeline:
    """The deployed topology, with the Functions host's role played by this class."""

    def __init__(self, store: CosmosStore, queue: ServiceBusQueue, train_queue: ServiceBusQueue) -> None:
        self.store, self.queue, self.train_queue = store, queue, train_queue
        self.feed_token: str | None = None

    def pump(self) -> int:
        """The change-feed trigger: hand every new batch of episodes to `enqueue`."""
        sent = 0
        while True:
            page = self.store.read_episodes(self.feed_token, 100)
            self.feed_token = page.continuation
            if not page.items:
                return sent
            FUNCTIONS["enqueue"](func.DocumentList([func.Document.from_dict(d) for d in page.items]))
            sent += len(page.items)

    def score_all(self) -> int:
        """The Service Bus trigger: call `score`, complete on success, abandon on an exception."""
        done = 0
        while messages := self.queue.receive(50):
            for m in messages:
                try:
                    FUNCTIONS["score"](self._message(m))
                except Exception:
                    self.queue.abandon(m)
                else:
                    self.queue.complete(m)
                    done += 1
        return done

    def train(self) -> list[str]:
        """The timer, then the training trigger on each message it sent; the agents trained."""
        FUNCTIONS["train"](TimerRequest(past_due=False))
        trained = []
        while messages := self.train_queue.receive(50):
            for m in messages:
                FUNCTIONS["train_agent"](self._message(m))
                self.train_queue.complete(m)
                trained.append(m.properties["agent_id"])
        return trained

    @staticmethod
    def _message(m: Any) -> ServiceBusMessage:
        return ServiceBusMessage(body=m.body, message_id=m.message_id, delivery_count=m.delivery_count,
                                 application_properties=dict(m.properties), user_properties=dict(m.properties))


@pytest.fixture
def pipeline(cosmos_server: Any, amqp_broker: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pipeline]:
    database = f"e2e-{uuid.uuid4().hex[:8]}"
    store = CosmosStore.connect(cosmos_server.endpoint, database, key=cosmos_server.key, create_containers=True,
                                client_kwargs=CLIENT_KWARGS, clock=SteppingClock())
    queue = ServiceBusQueue.from_connection_string(amqp_broker.connection_string, QUEUE, max_wait_time=1)
    train_queue = ServiceBusQueue.from_connection_string(amqp_broker.connection_string, TRAIN_QUEUE, max_wait_time=1)
    settings = load_settings(store="cosmos", queue="servicebus", cosmos_endpoint=cosmos_server.endpoint,
                             cosmos_database=database, servicebus_connection_string=amqp_broker.connection_string)
    rt = handlers.Runtime(settings, store, queue.send, send_train=train_queue.send)
    monkeypatch.setattr(handlers, "_runtime", rt)
    yield Pipeline(store, queue, train_queue)
    queue.close()
    train_queue.close()
    store._client.delete_database(database)  # type: ignore[union-attr]
    store.close()


def test_agents_learn_through_cosmos_and_service_bus(pipeline: Pipeline, cosmos_server: Any) -> None:
    store = pipeline.store
    scenario = support_bot(AGENT)
    create_policy(store, SoftmaxPolicy.from_actions(AGENT, scenario.actions, exploration_floor=0.01)
                  .to_document(created_at=None))
    agent_clock = ManualClock()
    client = PolicyClient(store, AGENT, refresh_seconds=0, rng=random.Random(5), clock=agent_clock)
    rng = random.Random(9)

    cosmos_server.reset_stats()
    rounds, per_round = 4, 50
    for r in range(rounds):
        policy = client.policy()
        assert policy.version == r + 1  # the agent picked up the version the last round published
        for _ in range(per_round):
            scenario.run_episode(store, policy.choose(), rng, agent_clock)
        assert pipeline.pump() == per_round
        assert pipeline.score_all() == per_round
        assert pipeline.train() == [AGENT]
    stats = cosmos_server.stats()

    final = client.policy()
    assert final.version == rounds + 1
    probs = final.probabilities
    assert probs["k=5"] > 0.25 and probs["k=1"] < 0.25  # learning moved the policy toward the best action
    runs = store.list_runs(AGENT)
    assert sum(r["episodes"] for r in runs) == rounds * per_round
    assert len(store.read_scores(AGENT, None, 1000)) == rounds * per_round

    episodes = rounds * per_round
    per_episode = stats["total"] / episodes
    print(f"\nCosmos requests per episode through the whole pipeline: {per_episode:.2f} "
          f"({stats['total']} requests for {episodes} episodes: {stats['by_operation']})")
    # Writing the episode and its score, and one point read per delivery that looks for a stored
    # score before any judge is called (a copy of a message must not be judged again).
    assert per_episode <= 3.5


def test_a_redelivered_change_feed_batch_and_message_change_nothing(pipeline: Pipeline, amqp_broker: Any) -> None:
    store = pipeline.store
    scenario = support_bot(AGENT)
    create_policy(store, SoftmaxPolicy.from_actions(AGENT, scenario.actions).to_document(created_at=None))
    policy = SoftmaxPolicy.from_document(store.get_current_policy(AGENT).doc, seed=1)  # type: ignore[union-attr]
    clock, rng = ManualClock(), random.Random(2)
    for _ in range(10):
        scenario.run_episode(store, policy.choose(), rng, clock)
    batch = store.read_episodes(None, 100).items
    FUNCTIONS["enqueue"](func.DocumentList([func.Document.from_dict(d) for d in batch]))
    FUNCTIONS["enqueue"](func.DocumentList([func.Document.from_dict(d) for d in batch]))  # redelivered batch
    assert len(amqp_broker.queue(QUEUE).messages()) == 10  # Service Bus duplicate detection by message id
    assert pipeline.score_all() == 10
    scores = store.read_scores(AGENT, None, 100)
    redelivered = ServiceBusMessage(body=f'{{"episode_id": "{batch[0]["id"]}"}}'.encode(), message_id=batch[0]["id"],
                                    delivery_count=2, application_properties={}, user_properties={})
    FUNCTIONS["score"](redelivered)
    assert store.read_scores(AGENT, None, 100) == scores
