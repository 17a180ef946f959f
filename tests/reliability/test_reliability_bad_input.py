"""Reliability: fuzzed episodes, queue messages, policy documents, scores and settings.

Property: no handler crashes; everything rejected gets an error that names the field and is
kept for inspection (the episode stays stored and its message goes to the dead-letter queue,
a corrupt current policy stays where it is); the policy is never corrupted, and agents keep
serving the last good one. The examples are derandomized, so CI runs the same ones every time.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("azure.functions")
pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")
from adapters import only_on
from amqp_broker import amqp_broker  # noqa: F401  (the fixture; needs python-qpid-proton)
from app_functions import sb_message
from factories import make_episode
from faults import AGENT, FUNCTIONS, Agent, FunctionsHost, account, dead_lettered, start_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_report import Backend, record

from agent_learning.app import deliveries, handlers
from agent_learning.app.embedded import LocalPipeline
from agent_learning.app.settings import Settings, environment_names, load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import ConfigurationError, InvalidDocument
from agent_learning.documents import Episode, PolicyDocument
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import Reinforce
from agent_learning.ops.recovery import replay_dead_letters
from agent_learning.pipeline import Scorer, load_current, score_message, train_agent
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.base import OutgoingMessage
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.sim.simulate import math_tutor

FUZZ = settings(  # the same examples on every run (no example database), so the report is stable
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
ACTIONS = [a.id for a in math_tutor(AGENT).actions]

# --------------------------------------------------------------------------- strategies

_junk = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats()
    | st.text(max_size=20)
    | st.lists(st.integers(min_value=-5, max_value=5), max_size=3)
    | st.dictionaries(st.text(max_size=5), st.integers(min_value=-5, max_value=5), max_size=3)
)
_non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
_oversized = st.integers(min_value=20_001, max_value=70_000).map(lambda n: "x" * n)
_unknown_action = st.from_regex(r"[a-z][a-z0-9-]{2,12}", fullmatch=True).filter(lambda a: a not in ACTIONS)
_REQUIRED = ["agent_id", "policy_version", "action_id", "probability", "logprob", "input", "started_at", "ended_at"]
_FIELDS = [f for f in Episode.model_fields if f != "id"]

# (kind, field, value): what to do to a valid episode document.
episode_mutations = st.one_of(
    st.tuples(st.just("drop"), st.sampled_from(_REQUIRED), st.none()),
    st.tuples(st.just("set"), st.sampled_from(_FIELDS), _junk),
    st.tuples(st.just("set"), st.sampled_from(["probability", "logprob"]), _non_finite | st.floats()),
    st.tuples(st.just("set"), st.sampled_from(["input", "output", "instructions"]), _oversized),
    st.tuples(st.just("set"), st.just("action_id"), _unknown_action),
    st.tuples(st.just("set"), st.just("policy_version"), st.integers(min_value=2, max_value=10**6)),
    st.tuples(st.just("step"), st.sampled_from(["latency_ms", "status", "name", "arguments", "error"]),
              _junk | _non_finite),
    st.tuples(st.just("extra"), st.from_regex(r"[a-z]{1,10}", fullmatch=True), _junk),
)


def mutate(doc: dict[str, Any], kind: str, field: str, value: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    if kind == "drop":
        doc.pop(field, None)
    elif kind == "step":
        doc["steps"][0][field] = value
    elif kind == "extra":
        doc.setdefault(field, value)
    else:
        doc[field] = value
    return doc


# Fields whose problem may be reported on a field checked together with them.
RELATED = {"probability": ("logprob",), "started_at": ("ended_at",), "ended_at": ("started_at",)}


def expected_rejection(doc: dict[str, Any]) -> tuple[str, str] | None:
    """``(reason, field)`` the scorer must dead-letter ``doc`` with, or ``None`` if it is valid."""
    try:
        episode = Episode.from_dict(doc)
    except InvalidDocument as exc:
        return "InvalidEpisode", exc.fields[0]
    if episode.policy_version != 1 or episode.agent_id != AGENT:
        return "UnknownPolicyVersion", "policy_version"
    if episode.action_id not in ACTIONS:
        return "UnknownAction", "action_id"
    return None


# --------------------------------------------------------------------------- episodes


def test_fuzzed_episode_documents_are_dead_lettered_with_the_field_named(backend: Backend) -> None:
    clock = ManualClock()
    store = backend.store
    start_policy(store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    pipeline = LocalPipeline(store, queue, OfflineJudge(), RewardFunction(), Reinforce(), clock=clock)
    good: list[str] = []
    rejected: dict[str, tuple[str, str]] = {}
    refused = Counter[str]()

    @FUZZ
    @given(mutation=episode_mutations)
    def write_one(mutation: tuple[str, str, Any]) -> None:
        episode_id = f"fuzz-{len(good) + len(rejected) + sum(refused.values()):04d}"
        doc = mutate(make_episode(episode_id, agent_id=AGENT, action_id="direct").to_dict(), *mutation)
        try:
            backend.put_raw("episodes", doc)
        except Exception as exc:  # the store itself refuses it (Cosmos DB: NaN is not JSON)
            refused[type(exc).__name__] += 1
            return
        expected = expected_rejection(doc)
        pipeline.pump()
        pipeline.score_pending()
        if expected is None:
            good.append(episode_id)
            assert store.get_score(episode_id, AGENT) is not None
            return
        rejected[episode_id] = expected
        (letter,) = [d for d in queue.dead_letters(10_000) if d.message_id == episode_id]
        reason, field = expected
        assert letter.reason == reason
        mutated = mutation[1] if mutation[0] != "step" else f"steps[0].{mutation[1]}"
        named = [field, mutated, *RELATED.get(mutation[1], ())]
        assert any(name in letter.description for name in named), (mutation, letter.description)
        assert store.get_episode(episode_id) is not None  # kept for inspection
        assert store.get_score(episode_id, AGENT) is None

    write_one()
    # A valid episode among the fuzzed ones, whatever the strategies drew: it is learned, they are kept aside.
    backend.put_raw("episodes", make_episode("fuzz-valid", agent_id=AGENT, action_id="direct").to_dict())
    pipeline.pump()
    pipeline.score_pending()
    good.append("fuzz-valid")
    outcomes = pipeline.train()
    books = account(store, good, dead_lettered(queue))
    record("bad input: episodes", backend.kind, faults=len(rejected), episodes=len(good) + len(rejected),
           lost=books.lost, double=len(books.double), kept=len(books.kept))
    assert [o.status for o in outcomes] == ["published"]
    assert books.lost == 0 and books.double == set() and books.kept == set(rejected)
    assert len(rejected) >= 20  # the strategies mostly produce invalid documents


def test_text_that_is_not_unicode_is_dead_lettered_and_the_agent_still_learns(backend: Backend) -> None:
    """A lone surrogate ("\\ud800" in JSON decodes to one) in any text of an episode, written by an
    older release or by an agent in another language, cannot go into a UTF-8 document: the episode
    is dead-lettered naming the field, not left to fail every scoring run after it."""
    clock = ManualClock()
    store = backend.store
    start_policy(store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    pipeline = LocalPipeline(store, queue, OfflineJudge(), RewardFunction(), Reinforce(), clock=clock)
    valid = make_episode("text-valid", agent_id=AGENT, action_id="direct").to_dict()
    places = {
        "context.topic": {"context": {"topic": "\ud800"}},
        "metadata.user": {"metadata": {"user": "x\udfff"}},
        "input": {"input": "q\udc00"},
        "steps[0].arguments": {"steps": [{**valid["steps"][0], "arguments": {"q": "\ud83d"}}]},
        "tool_definitions": {"tool_definitions": [{"name": "\udbff"}]},
    }
    written = []
    for i, (field, change) in enumerate(places.items()):
        try:
            backend.put_raw("episodes", {**valid, "id": f"text-{i}", **change})
        except Exception:  # a store may refuse such a document itself, which is as good
            continue
        written.append((f"text-{i}", field))
    backend.put_raw("episodes", valid)
    pipeline.pump()
    pipeline.score_pending()
    letters = {d.message_id: d for d in queue.dead_letters(100)}
    for episode_id, field in written:
        assert letters[episode_id].reason == "InvalidEpisode"
        assert field in letters[episode_id].description and "lone surrogate" in letters[episode_id].description
        assert store.get_episode(episode_id) is not None  # kept for inspection
    assert backend.kind != "sqlite" or len(written) == len(places)
    assert [o.status for o in pipeline.train()] == ["published"]


# --------------------------------------------------------------------------- queue messages


def _nested(depth: int) -> str:
    return '{"episode_id": "e", "episode": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


request_bodies = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                 max_leaves=10).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"type": st.sampled_from(["score_request", "other"]), "episode_id": _junk,
                           "agent_id": _junk, "episode": _junk}).map(lambda v: json.dumps(v).encode()),
    st.integers(min_value=10, max_value=100_000).map(lambda d: _nested(d).encode()),
    st.integers(min_value=100_000, max_value=2_000_000).map(
        lambda n: json.dumps({"episode_id": "e", "agent_id": "a" * n}).encode()),
)


def test_fuzzed_queue_messages_are_dead_lettered_never_crash_a_handler(backend: Backend) -> None:
    clock = ManualClock()
    start_policy(backend.store, clock)
    scorer = Scorer(backend.store, OfflineJudge(), RewardFunction(), clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock, max_deliveries=1)
    host = FunctionsHost(backend.store, queue, clock)
    seen = Counter[str]()

    @FUZZ
    @given(body=request_bodies)
    def deliver(body: bytes) -> None:
        outcome = score_message(body, scorer)
        assert outcome.status == "dead_letter", outcome
        assert outcome.reason in ("InvalidMessage", "EpisodeNotFound") and outcome.description
        seen[outcome.reason] += 1
        # The same body through the Functions app: it fails as poison, never with another error.
        queue.send([OutgoingMessage(f"m{sum(seen.values())}", body.decode("utf-8", "replace"))])
        (message,) = queue.receive(1)
        with pytest.raises(deliveries.PoisonMessage) as info, host.active():
            FUNCTIONS["score"](sb_message(message))
        assert info.value.reason == outcome.reason
        queue.abandon(message)  # the last allowed delivery: dead-lettered

    deliver()
    record("bad input: queue messages", backend.kind, faults=sum(seen.values()), episodes=0, lost=0, double=0,
           kept=queue.counts().dead_letter)
    assert queue.counts().dead_letter == sum(seen.values())
    assert seen["InvalidMessage"] >= 20


# --------------------------------------------------------------------------- policy documents

_policy_values = _junk | _non_finite | st.floats(min_value=5e-324, max_value=1e-300) | st.floats(
    min_value=-1e4, max_value=1e4)
policy_mutations = st.one_of(
    st.tuples(st.just("drop"), st.sampled_from(["version", "actions", "logits", "source", "created_at", "kind"]),
              st.none()),
    st.tuples(st.just("set"), st.sampled_from(["version", "actions", "logits", "temperature", "exploration_floor",
                                               "pinned", "source", "cursor", "created_at", "kind", "type",
                                               "schema_version"]), _policy_values),
    st.tuples(st.just("logit"), st.integers(min_value=0, max_value=3), _policy_values),
    st.tuples(st.just("extra"), st.from_regex(r"[a-z]{1,10}", fullmatch=True), _junk),
    st.tuples(st.just("extreme"), st.floats(min_value=5e-324, max_value=1e-3), st.floats(min_value=1.0,
                                                                                          max_value=1000.0)),
)


def mutate_policy(doc: dict[str, Any], kind: str, field: Any, value: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    if kind == "drop":
        doc.pop(field, None)
    elif kind == "logit":
        doc["logits"][field] = value
    elif kind == "extreme":  # schema-valid numbers, extreme together: tiny temperature, large logits
        doc["temperature"], doc["logits"] = field, [value, -value, 0.0, 0.0]
    elif kind == "extra":
        doc.setdefault(field, value)
    else:
        doc[field] = value
    return doc


def test_a_fuzzed_current_policy_never_corrupts_learning_and_agents_keep_the_last_good_one(
    backend: Backend,
) -> None:
    clock = ManualClock()
    store = backend.store
    start_policy(store, clock)
    good_doc = store.get_current_policy(AGENT).doc  # type: ignore[union-attr]
    good_doc = {k: v for k, v in good_doc.items() if not k.startswith("_")}
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    host = FunctionsHost(store, queue, clock)
    agent = Agent(store, clock)
    agent.run(10)
    host.pump()
    host.score()  # scores waiting to be trained
    last_good = SoftmaxPolicy.from_document(good_doc)
    client = agent.client
    versions = store.list_policy_versions(AGENT)
    invalid = 0

    @FUZZ
    @given(mutation=policy_mutations)
    def corrupt(mutation: tuple[str, Any, Any]) -> None:
        nonlocal last_good, invalid
        doc = mutate_policy(good_doc, *mutation)
        try:
            backend.put_raw("policies", doc)
        except Exception:
            return  # the store itself refuses it (Cosmos DB: NaN is not JSON)
        stored = store.get_current_policy(AGENT)
        assert stored is not None
        try:
            policy = SoftmaxPolicy.from_document(PolicyDocument.from_dict(stored.doc))
        except InvalidDocument as exc:
            invalid += 1
            problem = exc.fields[0]
            outcome = train_agent(AGENT, store, Reinforce(), clock=clock)
            assert outcome.status == "invalid_policy" and problem in outcome.reason
            assert store.list_policy_versions(AGENT) == versions  # nothing published
            assert store.get_current_policy(AGENT).doc == stored.doc  # type: ignore[union-attr]  # kept as it is
            served = client.refresh()
            assert served.probabilities == last_good.probabilities and problem in (client.last_error or "")
            with host.active():
                answer = handlers.get_policy(AGENT, None, host.runtime)
            assert answer.status != 200 and problem in answer.body  # never serves a corrupt policy
        else:
            probabilities = list(policy.probabilities.values())
            assert all(math.isfinite(p) and 0 <= p <= 1 for p in probabilities), (mutation, probabilities)
            assert math.isclose(sum(probabilities), 1.0, rel_tol=1e-9)
            last_good = client.refresh()
        decision = client.choose()
        assert math.isfinite(decision.probability) and decision.probability > 0

    corrupt()
    backend.put_raw("policies", good_doc)
    host.tick()
    books = account(store, agent.written, dead_lettered(queue))
    record("bad input: policy documents", backend.kind, faults=invalid, episodes=len(agent.written),
           lost=books.lost, double=len(books.double), kept=len(books.kept))
    assert books.lost == 0 and books.double == set() and books.versions == 2
    assert invalid >= 20


# --------------------------------------------------------------------------- score documents

score_mutations = st.tuples(
    st.sampled_from(["reward", "action_id", "probability", "metrics", "judge", "episode_id", "type", "scored_at"]),
    _junk | _non_finite | st.floats(min_value=-2, max_value=2),
)


def test_fuzzed_score_documents_are_skipped_and_counted_never_learned(backend: Backend) -> None:
    clock = ManualClock()
    store = backend.store
    start_policy(store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    host = FunctionsHost(store, queue, clock)
    agent = Agent(store, clock)
    agent.run(5)
    host.pump()
    host.score()
    template = {k: v for k, v in store.read_scores(AGENT, None, 1)[0].items() if not k.startswith("_")}
    corrupt: list[str] = []

    @FUZZ
    @given(mutation=score_mutations)
    def write_one(mutation: tuple[str, Any]) -> None:
        field, value = mutation
        score_id = f"raw-score-{len(corrupt):04d}"
        doc = {**template, "id": score_id, "episode_id": score_id, field: value, "agent_id": AGENT}
        doc["seq"] = int(clock.time() * 1_000_000) + len(corrupt) if backend.kind == "cosmos" else None
        try:
            backend.put_raw("scores", doc)
        except Exception:
            return
        corrupt.append(score_id)

    write_one()
    outcome = train_agent(AGENT, store, Reinforce(), clock=clock)
    assert outcome.status == "published" and outcome.run is not None
    valid = [i for i in corrupt if _valid_score(store.get_score(i, AGENT))]
    assert outcome.run.episodes == len(agent.written) + len(valid)
    assert outcome.run.rejected == len(corrupt) - len(valid) and outcome.run.rejected_samples
    current = load_current(store, AGENT)
    assert current is not None and all(math.isfinite(x) for x in current.logits)
    books = account(store, agent.written + corrupt)
    record("bad input: score documents", backend.kind, faults=len(corrupt) - len(valid),
           episodes=len(agent.written), lost=books.lost, double=len(books.double))
    assert books.lost == 0 and books.double == set()


def _valid_score(row: dict[str, Any] | None) -> bool:
    from agent_learning.documents import Score

    try:
        score = Score.from_dict(row)
    except InvalidDocument:
        return False
    return score.agent_id == AGENT and score.action_id in ACTIONS


# --------------------------------------------------------------------------- settings

_setting_values = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e309", "-1", "0", "", " ", "1_000", "0x10", "true", "none", "[]", "{}",
                     "１", "5e-324", "1e-400", "-0"]),
    st.text(max_size=12).filter(lambda s: "\x00" not in s),
    st.floats().map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)


@FUZZ
@given(name=st.sampled_from(sorted(environment_names().values())), value=_setting_values)
def test_fuzzed_settings_are_rejected_naming_the_variable(name: str, value: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        for key in list(os.environ):
            if key.startswith("AGENT_LEARNING_"):
                patch.delenv(key)
        patch.setenv(name, value)
        try:
            loaded = load_settings()
        except ConfigurationError as exc:
            message = str(exc)
            # A bad value is named; a valid one that needs another setting names the missing one.
            assert name.upper() in message.upper() or "missing" in message, message
            return
    assert isinstance(loaded, Settings)
    RewardFunction(loaded.reward_config())  # what the settings configure accepts them too
    Reinforce(loaded.learner_config())
    for field, info in Settings.model_fields.items():
        if info.annotation is float:
            assert math.isfinite(getattr(loaded, field)), field


# --------------------------------------------------------------------------- oversized documents on Service Bus


# The deployed pair: Cosmos DB and Service Bus.
@only_on("durable_store", "cosmos")
def test_an_oversized_episode_does_not_block_the_change_feed_on_service_bus(
    backend: Backend, amqp_broker: Any
) -> None:
    """The Cosmos trigger retries a failed batch without limit, so a document whose message
    Service Bus cannot take would stop every episode behind it. An episode document may hold
    anything up to Cosmos DB's 2 MB, e.g. a 300 KB ``agent_id`` from a broken agent."""
    from agent_learning.queue.servicebus import ServiceBusQueue

    amqp_broker.queue("score-episodes", max_delivery_count=2)
    queue = ServiceBusQueue.from_connection_string(amqp_broker.connection_string, "score-episodes",
                                                   max_wait_time=1)
    clock = ManualClock()
    start_policy(backend.store, clock)
    host = FunctionsHost(backend.store, queue, clock)
    agent = Agent(backend.store, clock)
    agent.run(3)
    backend.put_raw("episodes", {**make_episode("huge", agent_id=AGENT).to_dict(), "agent_id": "a" * 300_000})
    agent.run(3)
    try:
        host.pump()
        host.score()
        host.tick()
        letters = queue.dead_letters(100)
        # Replaying it (the recovery tool on the Service Bus adapter) changes nothing: it is poison.
        assert replay_dead_letters(queue).replayed == ["huge"]
        host.score()
        assert [d.message_id for d in queue.dead_letters(100)] == ["huge"]
    finally:
        queue.close()

    books = account(backend.store, agent.written, {d.message_id for d in letters})
    record("bad input: episodes", backend.kind, faults=1, episodes=len(agent.written) + 1, lost=books.lost,
           double=len(books.double), kept=len(books.kept))
    assert books.lost == 0 and books.double == set() and books.kept == {"huge"}
    assert backend.store.get_episode("huge") is not None


# --------------------------------------------------------------------------- regressions of what the fuzzing found


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_a_message_nested_too_deeply_is_dead_lettered_not_a_recursion_error(depth: int, tmp_path: Any) -> None:
    from agent_learning.store.sqlite import SQLiteStore

    scorer = Scorer(SQLiteStore(tmp_path / "s.db"), OfflineJudge(), RewardFunction(), ManualClock())
    outcome = score_message(_nested(depth).encode(), scorer)
    assert (outcome.status, outcome.reason) == ("dead_letter", "InvalidMessage")
    assert "nested too deeply" in outcome.description


def test_a_current_policy_whose_logits_over_temperature_overflow_is_invalid_everywhere(backend: Backend) -> None:
    """Schema-valid numbers (a tiny temperature, large logits) whose probabilities are NaN."""
    import azure.functions as func

    clock = ManualClock()
    start_policy(backend.store, clock)
    agent = Agent(backend.store, clock)
    good = agent.client.policy()
    doc = {k: v for k, v in backend.store.get_current_policy(AGENT).doc.items()  # type: ignore[union-attr]
           if not k.startswith("_")}
    backend.put_raw("policies", {**doc, "temperature": 5e-324, "logits": [1.0, -1.0, 0.0, 0.0]})

    assert agent.client.refresh().probabilities == good.probabilities  # the agent keeps the last good one
    assert "temperature" in (agent.client.last_error or "")
    outcome = train_agent(AGENT, backend.store, Reinforce(), clock=clock)
    assert outcome.status == "invalid_policy" and "temperature" in outcome.reason
    host = FunctionsHost(backend.store, SQLiteQueue(backend.path / "queue.db", clock=clock), clock)
    request = func.HttpRequest(method="GET", url=f"/api/policies/{AGENT}", route_params={"agent_id": AGENT},
                               headers={}, body=b"")
    with host.active():
        response = FUNCTIONS["policy"](request)
    assert response.status_code == 503 and "temperature" in json.loads(response.get_body())["error"]
