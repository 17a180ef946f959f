"""The Cosmos DB adapter of the store port (``azure-cosmos``).

Containers and partition keys (Bicep creates them in Azure; :meth:`CosmosStore.ensure_containers`
creates them on a local server). Cosmos caps a logical partition (every document with one
value of the full partition key) at 20 GB, so each key keeps a logical partition bounded
however long an agent keeps running:

============  ====================  ====================================================
container     partition key         why
============  ====================  ====================================================
episodes      ``/id``               one document per logical partition: bounded however
                                    long an agent runs; the scorer point-reads by id
agent-scores  ``/agent_id``,        hierarchical (MultiHash): a logical partition is one
              ``/id``               document of an episode's score slot (its score, a
                                    feedback marker, a correction ``{episode}~r{k}`` or the
                                    ledger ``{episode}~ledger``), so it stays one document
                                    small; the first level keeps an agent's documents
                                    together without a cap, so the trainer's "new scores of
                                    agent A after cursor C" is a query scoped to A (one
                                    physical partition while A's data fits in one) served
                                    by the composite index (agent_id, seq, id): its cost
                                    follows the new scores, not the number of physical
                                    partitions or the agent's history. Point reads and
                                    writes give the full key [agent_id, id]
policies      ``/agent_id``         every version of an agent together: the current
                                    document is a point read, history is a
                                    single-partition query; one ~2 KB version per
                                    training run stays far below the 20 GB cap
runs          ``/agent_id``         as policies; also holds the local runner's checkpoints
                                    under the reserved partition ``_checkpoints``
feedback      ``/episode_id``       all feedback of one episode together (a handful of
                                    documents): listing it is a single-partition query
leases        ``/id``               the change-feed trigger's leases (never touched here)
============  ====================  ====================================================

Deployments from before the hierarchical key keep their scores in ``scores`` (partition key
``/id``, where the trainer's query crossed every physical partition). Cosmos cannot change a
container's partition key, so the scores live in a new container, and
:func:`copy_legacy_scores` copies the old one into it (``agent-learn store migrate-scores``, through
:func:`agent_learning.ops.recovery.migrate_scores`, which pauses the agents it copies for; docs/operating.md
gives the order of the steps).

Training cursor. A score's ``seq`` is the writer's clock in microseconds, taken right
before a create that must finish within ``write_timeout`` seconds (strictly increasing per
process). :meth:`read_scores` returns only scores older than ``settle_seconds``, so a score
written by another instance cannot land behind a cursor that has already passed it as long
as writes finish within the settle window and instance clocks agree to within it. Both are
checked rather than assumed:

* the window must exceed the write timeout plus a clock-skew allowance
  (:func:`~agent_learning.core.clock.check_settle_window`; the defaults, 10 s + 5 s and 60 s,
  leave a wide margin), or the store refuses to start;
* the clock is the server's where it is ahead of the local one
  (:class:`~agent_learning.core.clock.ServerClock`): every write's answer carries the server's time
  of the write (``_ts``), and before its first score an instance makes one small write to learn
  it, so a scorer whose clock lags cannot push ``seq`` behind the cursor;
* a score whose create completed later (by ``_ts``) than its ``seq`` plus the settle window (a
  write or a process that stalled that long) may have landed behind a cursor: it is logged as
  an error naming the episode and marked ``late_write`` on the stored score, never skipped
  silently (``agent-learn audit`` counts a score behind a consumed cursor as lost).

Re-scoring keeps ``seq``; SQLite and the memory store assign ``seq`` atomically and need no
window.

Feedback markers are small documents of type ``feedback_marker`` at an episode's score id
(without ``seq``, so the trainer's query never sees them); the score's create conflicts with
one, and the marker is then replaced by the score with an ETag condition. Unjudged records
(type ``unjudged``) sit in the same slot and are replaced the same way; feedback for an
unjudged episode sets ``feedback_pending`` on the record instead of leaving a marker. Correction ledgers
(type ``correction_ledger``, id ``{episode_id}~ledger``) live in ``agent-scores`` too, also without
``seq``: a point read next to the score they describe, and not in the feedback change feed,
which :meth:`CosmosStore.read_feedback_changes` reads like the episodes' one.

The sources that gave feedback on an episode (type ``feedback_sources``, id
``{episode_id}~sources``, in ``agent-scores`` beside the ledger, at most ``max_sources`` names)
are what makes ``put_feedback``'s cap atomic: a source new to the episode is added to the list
by a compare-and-swap on its ETag before its feedback is written, so a post that loses the
swap reads the list again and counts the winner. The list only grows, so a post loses at most
``max_sources`` + 1 swaps. An episode whose feedback predates the list gets one, made from its
feedback documents, at the next new post. A post that dies between the swap and the write
leaves its source listed without feedback: the source keeps its place and may post again.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.cosmos import ContainerProxy, CosmosClient, DatabaseProxy, PartitionKey
from azure.cosmos import exceptions as cosmos_errors

from agent_learning.core.clock import (
    SCORE_SETTLE_SECONDS,
    SCORE_WRITE_TIMEOUT_SECONDS,
    SYSTEM_CLOCK,
    Clock,
    ServerClock,
    check_settle_window,
)
from agent_learning.core.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    NotFound,
    StoredDocumentInvalid,
    TransientError,
)
from agent_learning.core.telemetry import SCORES_LATE, count
from agent_learning.documents import (
    CorrectionLedger,
    Episode,
    Feedback,
    PolicyDocument,
    Score,
    ScoreCursor,
    TrainingRun,
    UnjudgedRecord,
    correction_ledger_id,
    feedback_sources_id,
    policy_doc_id,
)
from agent_learning.store.base import (
    NOT_MODIFIED,
    AgentCursor,
    FeedPage,
    NotModified,
    RawDoc,
    Store,
    Tagged,
    UnjudgedMark,
    agent_cursor,
    check_limit,
    same_document,
    sources_full,
)

log = logging.getLogger(__name__)

CHECKPOINT_PARTITION = "_checkpoints"
CLOCK_PROBE = {"id": "clock-probe", "agent_id": CHECKPOINT_PARTITION, "type": "clock_probe"}
"""The document an instance writes before its first score to learn the server's time."""
TRANSIENT_STATUS = {408, 429, 449, 500, 502, 503}


@dataclass(frozen=True)
class ContainerSpec:
    """A container this adapter expects: name, partition key path(s) and extra indexes.

    Several paths make a hierarchical partition key (MultiHash, version 2, at most three levels).
    """

    name: str
    partition_key: tuple[str, ...]
    composite_indexes: list[list[dict[str, str]]] = field(default_factory=list)

    @property
    def hierarchical(self) -> bool:
        return len(self.partition_key) > 1

    @property
    def partition_key_definition(self) -> dict[str, Any]:
        """The definition as Bicep declares it (a single path keeps the service's default version)."""
        if self.hierarchical:
            return {"paths": list(self.partition_key), "kind": "MultiHash", "version": 2}
        return {"paths": list(self.partition_key), "kind": "Hash"}

    def sdk_partition_key(self) -> PartitionKey:
        if self.hierarchical:
            return PartitionKey(path=list(self.partition_key), kind="MultiHash", version=2)
        return PartitionKey(path=self.partition_key[0])

    @property
    def indexing_policy(self) -> dict[str, Any]:
        policy: dict[str, Any] = {
            "indexingMode": "consistent",
            "includedPaths": [{"path": "/*"}],
            "excludedPaths": [{"path": '/"_etag"/?'}],
        }
        if self.composite_indexes:
            policy["compositeIndexes"] = self.composite_indexes
        return policy


SCORES = "agent-scores"
"""The score slots' container (hierarchical key [agent_id, id])."""
LEGACY_SCORES = "scores"
"""Where deployments from before the hierarchical key kept scores (partition key ``/id``)."""
BY_AGENT_SEQ_ID = [
    [
        {"path": "/agent_id", "order": "ascending"},
        {"path": "/seq", "order": "ascending"},
        {"path": "/id", "order": "ascending"},
    ]
]
CONTAINERS: dict[str, ContainerSpec] = {
    "episodes": ContainerSpec("episodes", ("/id",)),
    SCORES: ContainerSpec(SCORES, ("/agent_id", "/id"), BY_AGENT_SEQ_ID),
    "policies": ContainerSpec("policies", ("/agent_id",)),
    "runs": ContainerSpec("runs", ("/agent_id",)),
    "feedback": ContainerSpec("feedback", ("/episode_id",)),
}
MARKER = "feedback_marker"
LEDGER = "correction_ledger"
SOURCES = "feedback_sources"
LEASES = ContainerSpec("leases", ("/id",))
CURSOR_PAGE = 1_000
"""Current documents per page of :meth:`CosmosStore.training_cursors` (one request each)."""
AFTER_CURSOR = (
    "c.agent_id = @agent AND IS_NUMBER(c.seq) AND c.seq <= @cutoff "
    "AND c.seq >= @seq AND (c.seq > @seq OR c.id > @id)"
)
"""An agent's settled scores after a cursor: ``c.seq >= @seq`` bounds the index range, and the
cursor's tie-break on id narrows it."""
UNJUDGED = "unjudged"
PLACEHOLDERS = (MARKER, UNJUDGED)
"""Documents in a score slot that the episode's first score replaces."""


UNREACHABLE = (ServiceRequestError, ServiceResponseError, cosmos_errors.CosmosClientTimeoutError)
"""Cosmos DB not reached at all (a connection refused or dropped, the client's own timeout):
an outage, transient like a throttled request, whichever call meets it."""

T = TypeVar("T")


def _container_missing(exc: cosmos_errors.CosmosResourceNotFoundError) -> bool:
    """Whether a 404 says that the database or the container does not exist, rather than the
    document: azure-cosmos reads a container's properties before its first request to it (a 404
    on that request's URL, which names no document), and Cosmos answers a request to a container
    deleted since with sub-status 1003. Reads must not take it for "no such document"."""
    path = _request_path(exc)
    return exc.sub_status == 1003 or (path.startswith("/dbs/") and "/docs" not in path)


def _request_path(exc: cosmos_errors.CosmosHttpResponseError) -> str:
    """The path of the request an SDK error answers (empty when the error carries none)."""
    request = getattr(getattr(exc, "response", None), "request", None)
    return urlsplit(str(getattr(request, "url", "") or "")).path


def _translate_transient_errors(cls: type[T]) -> type[T]:
    """Every public method of ``cls`` (a generator's iteration and a coroutine included) raises
    :class:`TransientError` for :data:`UNREACHABLE` and for the statuses in
    :data:`TRANSIENT_STATUS`, so callers classify an outage by the port's error, not by the SDK's.
    Methods catch the statuses they expect (404, 409, 412) themselves; any other SDK error
    passes through as it is."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, _guarded(member))
    return cls


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def wait(*args: Any, **kwargs: Any) -> Any:
            with _port_errors():
                return await method(*args, **kwargs)

        return wait
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def iterate(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with _port_errors():
                yield from method(*args, **kwargs)

        return iterate

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _port_errors():
            return method(*args, **kwargs)

    return call


@contextlib.contextmanager
def _port_errors() -> Iterator[None]:
    """Raise the port's :class:`TransientError` for an outage or a transient status, and
    :class:`ConfigurationError` for a database or container that does not exist
    (:func:`_container_missing`); any other SDK error passes through as it is."""
    try:
        yield
    except UNREACHABLE as exc:
        raise TransientError(f"Cosmos DB unreachable ({type(exc).__name__}: {exc})") from exc
    except cosmos_errors.CosmosResourceNotFoundError as exc:
        if not _container_missing(exc):
            raise
        segments = _request_path(exc).strip("/").split("/")  # dbs/{db}/colls/{c}/...
        database, container = (segments + ["?"] * 4)[1:4:2]
        raise ConfigurationError(
            f"Cosmos DB has no container {container!r} in the database {database!r}: check "
            "AGENT_LEARNING_COSMOS_DATABASE, or create the containers (azd provision)"
        ) from exc
    except cosmos_errors.CosmosHttpResponseError as exc:
        if exc.status_code in TRANSIENT_STATUS:
            raise TransientError(f"Cosmos DB answered {exc.status_code}: {exc.message}") from exc
        raise


@_translate_transient_errors
class CosmosStore(Store):
    """The store port on a Cosmos DB (NoSQL) database. Throttling, timeouts, server errors and
    an unreachable account raise :class:`TransientError`; a database or container that does not
    exist raises :class:`ConfigurationError` (never read as a missing document)."""

    def __init__(
        self,
        database: DatabaseProxy,
        *,
        settle_seconds: float = SCORE_SETTLE_SECONDS,
        write_timeout: float = SCORE_WRITE_TIMEOUT_SECONDS,
        clock: Clock = SYSTEM_CLOCK,
        async_factory: Any = None,
    ) -> None:
        if not write_timeout > 0:
            raise ValueError(f"write_timeout: {write_timeout} must be > 0")
        check_settle_window(settle_seconds, write_timeout)
        self.database = database
        self.settle_seconds = settle_seconds
        self.write_timeout = write_timeout
        self.clock = clock
        self.server_clock = ServerClock(clock)
        self._async_factory = async_factory
        self._async_db: Any = None
        self._async_client: Any = None
        self._seq_lock = threading.Lock()
        self._query_lock = threading.Lock()  # see _query
        self._last_seq = 0
        self._c: dict[str, ContainerProxy] = {name: database.get_container_client(name) for name in CONTAINERS}
        self._client: CosmosClient | None = None

    @property
    def location(self) -> str:
        return f"Cosmos DB database {self.database.id}"

    # ------------------------------------------------------------------ construction

    @classmethod
    def connect(
        cls,
        endpoint: str,
        database: str,
        *,
        key: str | None = None,
        managed_identity_client_id: str | None = None,
        create_containers: bool = False,
        client_kwargs: Mapping[str, Any] | None = None,
        **store_kwargs: Any,
    ) -> CosmosStore:
        """Connect with an account key (local servers) or with Entra ID: ``DefaultAzureCredential``,
        which is the managed identity in Azure (``managed_identity_client_id`` for a
        user-assigned one). The client reads the account at once: an account that cannot be
        reached raises :class:`TransientError` here too."""
        credential = key if key else _default_credential(managed_identity_client_id)
        kwargs = dict(client_kwargs or {})
        with _port_errors():  # a classmethod: the class decorator does not guard it
            client = CosmosClient(endpoint, credential=credential, **kwargs)
            db = (
                client.create_database_if_not_exists(database)
                if create_containers
                else client.get_database_client(database)
            )

        def async_factory() -> Any:
            from azure.cosmos.aio import CosmosClient as AsyncCosmosClient  # lazy: only for async episode writes

            aio_credential = key if key else _default_credential(managed_identity_client_id, aio=True)
            return AsyncCosmosClient(endpoint, credential=aio_credential, **kwargs), database

        store = cls(db, async_factory=async_factory, **store_kwargs)
        store._client = client
        if create_containers:
            store.ensure_containers()
        return store

    def ensure_containers(self, include_leases: bool = True) -> None:
        """Create the containers if missing (local servers; in Azure, Bicep creates them)."""
        specs = [*CONTAINERS.values(), *([LEASES] if include_leases else [])]
        for spec in specs:
            self.database.create_container_if_not_exists(
                id=spec.name, partition_key=spec.sdk_partition_key(), indexing_policy=spec.indexing_policy
            )
        self._c = {name: self.database.get_container_client(name) for name in CONTAINERS}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        if self._async_client is not None:
            await self._async_client.close()
            self._async_client = self._async_db = None

    # ------------------------------------------------------------------ episodes

    def add_episode(self, episode: Episode) -> None:
        doc = episode.to_dict()
        try:
            self._c["episodes"].create_item(doc)
        except cosmos_errors.CosmosResourceExistsError:
            existing = self.get_episode(episode.id)
            if existing is None or not same_document(existing, doc):
                raise ConcurrencyConflict(f"episode {episode.id!r} already exists with different content") from None

    async def add_episode_async(self, episode: Episode) -> None:
        """``add_episode`` on the async client (used by ``EpisodeCapture.aend``)."""
        if self._async_factory is None:
            raise RuntimeError("this CosmosStore was built without an async client; use CosmosStore.connect")
        if self._async_db is None:
            self._async_client, name = self._async_factory()
            self._async_db = self._async_client.get_database_client(name)
        doc = episode.to_dict()
        container = self._async_db.get_container_client("episodes")
        try:
            await container.create_item(doc)
        except cosmos_errors.CosmosResourceExistsError:
            existing = await container.read_item(episode.id, partition_key=episode.id)
            if not same_document(existing, doc):
                raise ConcurrencyConflict(f"episode {episode.id!r} already exists with different content") from None

    def get_episode(self, episode_id: str) -> RawDoc | None:
        return self._read("episodes", episode_id, episode_id)

    def read_episodes(self, continuation: str | None, max_items: int = 100) -> FeedPage:
        """One page of the change feed (latest version of each episode), resumable."""
        return self._read_feed("episodes", continuation, max_items)

    def _read_feed(self, name: str, continuation: str | None, max_items: int) -> FeedPage:
        """One change-feed page and the token after it. azure-cosmos 4.17 takes that token from the
        client's *last* response headers, which another thread's request (a scorer's point read)
        may have replaced by then, and such a token fails every later read; so it is taken from
        this request's own headers, which the response hook receives and the SDK then updates
        with the token (also after a page that found nothing)."""
        container = self._c[name]
        answered: list[Mapping[str, Any]] = []
        kwargs: dict[str, Any] = {"max_item_count": max_items, "response_hook": lambda h, _: answered.append(h)}
        if continuation:
            kwargs["continuation"] = continuation
        else:
            kwargs["start_time"] = "Beginning"
        pages = container.query_items_change_feed(**kwargs).by_page()
        items = list(next(pages, []))
        token = answered[-1].get("etag") if answered else None
        return FeedPage(items, token or continuation)

    def list_episodes(self, agent_id: str | None = None, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        if limit == 0:
            return []
        where = " WHERE c.agent_id = @agent" if agent_id is not None else ""
        params = [{"name": "@n", "value": limit}]
        if agent_id is not None:
            params.append({"name": "@agent", "value": agent_id})
        return self._query("episodes", f"SELECT TOP @n * FROM c{where} ORDER BY c._ts DESC", params)

    def episode_ids(self, agent_id: str) -> Iterator[str]:
        """A cross-partition query (episodes are partitioned by id), read page by page, each page
        fetched as :meth:`_query` fetches (one query at a time per store)."""
        pages = self._c["episodes"].query_items(
            "SELECT c.id FROM c WHERE c.agent_id = @agent",
            parameters=[{"name": "@agent", "value": agent_id}],
            enable_cross_partition_query=True,
            max_item_count=1000,
        ).by_page()
        while True:
            with self._query_lock:  # not held while the caller works through a page
                page = next(pages, None)
                rows = None if page is None else list(page)
            if rows is None:  # (a page may be empty and yet not the last)
                return
            for row in rows:
                yield str(row["id"])

    # ------------------------------------------------------------------ scores

    def _next_seq(self) -> int:
        if not self.server_clock.observed:  # learn the server's time before the first seq
            self._observe(self._c["runs"].upsert_item(dict(CLOCK_PROBE), timeout=self.write_timeout))
        with self._seq_lock:
            self._last_seq = max(int(self.server_clock.time() * 1_000_000), self._last_seq + 1)
            return self._last_seq

    def _observe(self, written: Mapping[str, Any]) -> Mapping[str, Any]:
        """A write's answer: its server time (``_ts``) corrects the clock."""
        self.server_clock.observe(written.get("_ts"))
        return written

    def _check_late(self, stored: Score, written: Mapping[str, Any]) -> Score:
        """Flag a score whose create completed later than its ``seq`` plus the settle window
        allows (``_ts`` is whole seconds, so it may have completed up to 1 s after it)."""
        ts = written.get("_ts")
        if stored.seq is None or not isinstance(ts, int | float) or ts + 1 <= stored.seq / 1e6 + self.settle_seconds:
            return stored
        log.error(
            "score %s (episode %s, agent %s) completed %.1f s after its seq, beyond the %g s settle window: a trainer "
            "may already have passed it, and then it is never learned (marked late_write; see agent-learn audit)",
            stored.id, stored.episode_id, stored.agent_id, ts - stored.seq / 1e6, self.settle_seconds,
        )
        count(SCORES_LATE, 1, {"agent_id": stored.agent_id})
        late = stored.model_copy(update={"late_write": True})
        return late if self._replace_if_unchanged(late, str(written.get("_etag"))) else stored

    def add_score(self, score: Score) -> Score:
        stored = score.model_copy(update={"seq": self._next_seq(), "late_write": False})
        try:
            written = self._observe(self._c[SCORES].create_item(stored.to_dict(), timeout=self.write_timeout))
        except cosmos_errors.CosmosResourceExistsError:
            replaced = self._replace_marker(score, None)
            if replaced is None:
                raise ConcurrencyConflict(f"episode {score.id!r} already has a score") from None
            return replaced
        return self._check_late(stored, written)

    def put_score(self, score: Score) -> Score:
        for _ in range(10):
            try:
                existing = self._c[SCORES].read_item(score.id, partition_key=[score.agent_id, score.id])
            except cosmos_errors.CosmosResourceNotFoundError:
                try:
                    return self.add_score(score)
                except ConcurrencyConflict:
                    continue  # created meanwhile: overwrite it, keeping its seq
            if existing.get("type") in PLACEHOLDERS:
                replaced = self._replace_marker(score, existing)
                if replaced is not None:
                    return replaced
                continue
            kept = {"seq": existing.get("seq"), "late_write": existing.get("late_write") is True}
            stored = score.model_copy(update=kept)
            if self._replace_if_unchanged(stored, existing["_etag"]) is not None:
                return stored
        raise TransientError(f"score {score.id!r} kept changing while it was being re-scored")

    def _replace_marker(self, score: Score, existing: RawDoc | None) -> Score | None:
        """Replace a feedback marker or an unjudged record by ``score``; ``None`` if the slot
        holds a real score."""
        if existing is None:
            existing = self._c[SCORES].read_item(score.id, partition_key=[score.agent_id, score.id])
        if existing.get("type") not in PLACEHOLDERS:
            return None
        pending = existing.get("type") == MARKER or existing.get("feedback_pending") is True
        stored = score.model_copy(update={"seq": self._next_seq(), "feedback_pending": pending, "late_write": False})
        written = self._replace_if_unchanged(stored, existing["_etag"])
        return None if written is None else self._check_late(stored, written)

    def _replace_if_unchanged(self, score: Score, etag: str) -> Mapping[str, Any] | None:
        """Replace a score document if its ETag is still ``etag``; None if it changed meanwhile."""
        try:
            return self._observe(
                self._c[SCORES].replace_item(
                    score.id,
                    score.to_dict(),
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                    timeout=self.write_timeout,
                )
            )
        except (cosmos_errors.CosmosAccessConditionFailedError, cosmos_errors.CosmosResourceNotFoundError):
            return None

    def get_score(self, episode_id: str, agent_id: str) -> RawDoc | None:
        doc = self._read(SCORES, episode_id, [agent_id, episode_id])
        return None if doc is None or doc.get("type") in (MARKER, LEDGER, UNJUDGED, SOURCES) else doc

    def read_scores(
        self, agent_id: str, after: ScoreCursor | None, limit: int, *, settled: bool = True
    ) -> list[RawDoc]:
        """A query scoped to the agent (the first level of the key), ordered by the composite index."""
        check_limit(limit)
        if limit == 0:
            return []
        return self._query(
            SCORES,
            f"SELECT TOP @n * FROM c WHERE {AFTER_CURSOR} ORDER BY c.agent_id, c.seq, c.id",
            [{"name": "@n", "value": limit}, *self._after(agent_id, after, settled)],
            partition_key=[agent_id],
        )

    def has_new_scores(self, agent_id: str, after: ScoreCursor | None) -> bool:
        """One request: the first id of ``read_scores`` (same conditions, settle window included)."""
        rows = self._query(
            SCORES,
            f"SELECT TOP 1 VALUE c.id FROM c WHERE {AFTER_CURSOR} ORDER BY c.agent_id, c.seq, c.id",
            self._after(agent_id, after, settled=True),
            partition_key=[agent_id],
        )
        return bool(rows)

    def _after(self, agent_id: str, after: ScoreCursor | None, settled: bool) -> list[dict[str, Any]]:
        """The parameters of :data:`AFTER_CURSOR`."""
        cutoff = int((self.server_clock.time() - self.settle_seconds) * 1_000_000) if settled else 2**62
        seq, sid = (after.seq, after.id) if after else (-1, "")
        return [
            {"name": "@agent", "value": agent_id},
            {"name": "@cutoff", "value": cutoff},
            {"name": "@seq", "value": seq},
            {"name": "@id", "value": sid},
        ]

    # ------------------------------------------------------------------ unjudged episodes

    def mark_unjudged(self, record: UnjudgedRecord) -> UnjudgedMark:
        """Create the record in the score slot; over a feedback marker, replace it (ETag) keeping
        its feedback pending."""
        doc = record.to_dict()
        for _ in range(10):
            try:
                self._observe(self._c[SCORES].create_item(doc, timeout=self.write_timeout))
                return "recorded"
            except cosmos_errors.CosmosResourceExistsError:
                existing = self._read(SCORES, record.id, [record.agent_id, record.id])
            if existing is None:
                continue  # deleted meanwhile: create again
            if existing.get("type") != MARKER:
                return "kept" if existing.get("type") == UNJUDGED else "scored"
            if self._replace_raw({**doc, "feedback_pending": True}, existing["_etag"]):
                return "recorded"
        raise TransientError(f"the score slot of {record.id!r} kept changing while it was being recorded unjudged")

    def _flag_feedback(self, record: RawDoc) -> bool:
        """Say ``feedback_pending`` on an unjudged record (ETag); False if a score replaced it."""
        for _ in range(10):
            if record.get("type") != UNJUDGED:
                return record.get("type") == MARKER
            if record.get("feedback_pending") is True:
                return True
            if self._replace_raw({**record, "feedback_pending": True}, record["_etag"]):
                return True
            again = self._read(SCORES, str(record["id"]), [str(record["agent_id"]), str(record["id"])])
            if again is None:
                return False
            record = again
        raise TransientError(f"the unjudged record of {record.get('id')!r} kept changing")

    def _replace_raw(self, doc: RawDoc, etag: str) -> bool:
        """Replace a document of the score slot if its ETag is still ``etag``."""
        body = {k: v for k, v in doc.items() if not k.startswith("_")}
        try:
            self._c[SCORES].replace_item(
                body["id"], body, etag=etag, match_condition=MatchConditions.IfNotModified, timeout=self.write_timeout
            )
            return True
        except (cosmos_errors.CosmosAccessConditionFailedError, cosmos_errors.CosmosResourceNotFoundError):
            return False

    def get_unjudged(self, episode_id: str, agent_id: str) -> RawDoc | None:
        doc = self._read(SCORES, episode_id, [agent_id, episode_id])
        return doc if doc is not None and doc.get("type") == UNJUDGED and doc.get("agent_id") == agent_id else None

    def list_unjudged(self, agent_id: str, after: str | None = None, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        if limit == 0:
            return []
        return self._query(
            SCORES,
            "SELECT TOP @n * FROM c WHERE c.agent_id = @agent AND c.type = @type AND c.id > @after ORDER BY c.id",
            [
                {"name": "@n", "value": limit},
                {"name": "@agent", "value": agent_id},
                {"name": "@type", "value": UNJUDGED},
                {"name": "@after", "value": after or ""},
            ],
            partition_key=[agent_id],
        )

    # ------------------------------------------------------------------ feedback

    def put_feedback(self, feedback: Feedback, max_sources: int | None = None) -> None:
        if max_sources is not None:
            self._list_source(feedback, max_sources)
        self._c["feedback"].upsert_item(feedback.to_dict())

    def _list_source(self, feedback: Feedback, max_sources: int) -> None:
        """Add the feedback's source to its episode's sources (module docstring) unless listed."""
        doc_id, episode_id = feedback_sources_id(feedback.episode_id), feedback.episode_id
        key = [feedback.agent_id, doc_id]
        for _ in range(max_sources + 2):
            doc = self._read(SCORES, doc_id, key)
            if doc is None:  # none yet: the sources of the episode's feedback, if any
                sources = sorted({str(d.get("source")) for d in self.list_feedback(episode_id)})
            else:
                sources = doc.get("sources")
                if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
                    raise StoredDocumentInvalid(f"document {doc_id!r}", [("sources", "must be a list of strings")])
            if feedback.source in sources and doc is not None:
                return
            if feedback.source not in sources:
                if len(sources) >= max_sources:
                    raise sources_full(episode_id, len(sources))
                sources = [*sources, feedback.source]
            body = {"id": doc_id, "type": SOURCES, "episode_id": episode_id, "agent_id": feedback.agent_id,
                    "sources": sources}
            try:
                if doc is None:
                    self._c[SCORES].create_item(body, timeout=self.write_timeout)
                else:
                    self._c[SCORES].replace_item(doc_id, body, etag=doc["_etag"],
                                                 match_condition=MatchConditions.IfNotModified,
                                                 timeout=self.write_timeout)
                return
            except (
                cosmos_errors.CosmosResourceExistsError,
                cosmos_errors.CosmosAccessConditionFailedError,
                cosmos_errors.CosmosResourceNotFoundError,
            ):
                continue  # another post changed the list: count again
        raise TransientError(f"the feedback sources of episode {episode_id!r} kept changing")

    def list_feedback(self, episode_id: str) -> list[RawDoc]:
        rows = self._query(
            "feedback",
            "SELECT * FROM c WHERE c.episode_id = @episode",
            [{"name": "@episode", "value": episode_id}],
            partition_key=episode_id,
        )
        return sorted(rows, key=lambda d: str(d.get("id")))

    def mark_feedback_waiting(self, episode_id: str, agent_id: str) -> bool:
        marker = {"id": episode_id, "type": MARKER, "episode_id": episode_id, "agent_id": agent_id}
        try:
            self._observe(self._c[SCORES].create_item(marker, timeout=self.write_timeout))
            return True
        except cosmos_errors.CosmosResourceExistsError:
            existing = self._read(SCORES, episode_id, [agent_id, episode_id])
            if existing is not None and existing.get("type") == UNJUDGED:
                return self._flag_feedback(existing)
            return existing is not None and existing.get("type") == MARKER

    def read_feedback_changes(self, continuation: str | None, max_items: int = 100) -> FeedPage:
        """One page of the feedback container's change feed (latest version of each document)."""
        return self._read_feed("feedback", continuation, max_items)

    def get_correction_ledger(self, episode_id: str, agent_id: str) -> Tagged | None:
        ledger_id = correction_ledger_id(episode_id)
        doc = self._read(SCORES, ledger_id, [agent_id, ledger_id])
        return None if doc is None or doc.get("type") != LEDGER else Tagged(doc, str(doc.get("_etag")))

    def put_correction_ledger(self, ledger: CorrectionLedger, etag: str | None) -> str:
        container = self._c[SCORES]
        try:
            if etag is None:
                result = container.create_item(ledger.to_dict(), timeout=self.write_timeout)
            else:
                result = container.replace_item(
                    ledger.id,
                    ledger.to_dict(),
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                    timeout=self.write_timeout,
                )
        except (
            cosmos_errors.CosmosResourceExistsError,
            cosmos_errors.CosmosAccessConditionFailedError,
            cosmos_errors.CosmosResourceNotFoundError,
        ):
            raise ConcurrencyConflict(f"the correction ledger of {ledger.episode_id!r} changed (stale ETag)") from None
        return str(result["_etag"])

    # ------------------------------------------------------------------ policies

    def get_current_policy(self, agent_id: str) -> Tagged | None:
        doc = self._read("policies", policy_doc_id(agent_id, None), agent_id)
        return None if doc is None else Tagged(doc, str(doc.get("_etag")))

    def get_current_policy_if_changed(self, agent_id: str, etag: str | None) -> Tagged | NotModified | None:
        """A conditional point read (``If-None-Match``): an unchanged document answers 304 and
        costs no transfer. azure-cosmos returns an empty dict for a 304 rather than raising, and
        raises ValueError for an empty ETag, which is therefore a full read."""
        if not etag:
            return self.get_current_policy(agent_id)
        try:
            doc = self._c["policies"].read_item(
                policy_doc_id(agent_id, None),
                partition_key=agent_id,
                etag=etag,
                match_condition=MatchConditions.IfModified,
            )
        except cosmos_errors.CosmosResourceNotFoundError as exc:
            if _container_missing(exc):
                raise
            return None
        if not doc:
            return NOT_MODIFIED
        return Tagged(doc, str(doc.get("_etag")))

    def get_policy_version(self, agent_id: str, version: int) -> RawDoc | None:
        return self._read("policies", policy_doc_id(agent_id, version), agent_id)

    def replace_current_policy(self, doc: PolicyDocument, etag: str | None) -> str:
        if doc.kind != "current":
            raise ValueError("replace_current_policy needs a kind='current' document")
        container = self._c["policies"]
        try:
            if etag is None:
                result = container.create_item(doc.to_dict())
            else:
                result = container.replace_item(
                    doc.id, doc.to_dict(), etag=etag, match_condition=MatchConditions.IfNotModified
                )
        except cosmos_errors.CosmosResourceExistsError:
            raise ConcurrencyConflict(f"current policy of {doc.agent_id!r} already exists") from None
        except (cosmos_errors.CosmosAccessConditionFailedError, cosmos_errors.CosmosResourceNotFoundError):
            raise ConcurrencyConflict(f"current policy of {doc.agent_id!r} changed (stale ETag)") from None
        self._observe(result)
        return str(result["_etag"])

    def create_policy_version(self, doc: PolicyDocument) -> None:
        if doc.kind != "version":
            raise ValueError("create_policy_version needs a kind='version' document")
        data = doc.to_dict()
        try:
            self._c["policies"].create_item(data)
        except cosmos_errors.CosmosResourceExistsError:
            existing = self.get_policy_version(doc.agent_id, doc.version)
            if existing is None or not same_document(existing, data):
                raise ConcurrencyConflict(f"policy version {doc.id!r} already exists with different content") from None

    def list_policy_versions(
        self, agent_id: str, newest: int | None = None, *, between: tuple[int, int] | None = None
    ) -> list[RawDoc]:
        where = "c.agent_id = @agent AND c.kind = 'version'"
        params: list[dict[str, Any]] = [{"name": "@agent", "value": agent_id}]
        if between is not None:
            where += " AND c.version >= @low AND c.version <= @high"
            params += [{"name": "@low", "value": between[0]}, {"name": "@high", "value": between[1]}]
        if newest is None:
            return self._query("policies", f"SELECT * FROM c WHERE {where} ORDER BY c.version", params, agent_id)
        if newest <= 0:
            return []
        docs = self._query(
            "policies",
            f"SELECT TOP @n * FROM c WHERE {where} ORDER BY c.version DESC",
            [{"name": "@n", "value": newest}, *params],
            agent_id,
        )
        return docs[::-1]

    def policy_version_times(self, agent_id: str) -> list[tuple[int, Any]]:
        rows = self._query(
            "policies",
            "SELECT c.version, c.created_at FROM c WHERE c.agent_id = @agent AND c.kind = 'version'"
            " ORDER BY c.version",
            [{"name": "@agent", "value": agent_id}],
            agent_id,
        )
        return [(r["version"], r.get("created_at")) for r in rows if type(r.get("version")) is int]

    def list_agents(self) -> list[str]:
        rows = self._query("policies", "SELECT c.agent_id FROM c WHERE c.kind = 'current'", [])
        return sorted({str(r["agent_id"]) for r in rows})

    def training_cursors(self) -> list[AgentCursor]:
        """One cross-partition query reading every current document whole (a projection on the
        cursor's fields could not say whether the document validates), in pages of
        :data:`CURSOR_PAGE` (about one request per thousand agents)."""
        rows = self._query(
            "policies",
            "SELECT * FROM c WHERE c.kind = 'current'",
            [],
            page_size=CURSOR_PAGE,
        )
        return sorted((agent_cursor(row) for row in rows), key=lambda c: c.agent_id)

    # ------------------------------------------------------------------ runs

    def delete_agent(self, agent_id: str) -> dict[str, int]:
        """Queries each container for the agent's documents and deletes them one by one (the
        current policy first); a document already gone counts as deleted by someone else."""
        plan = (("policies", "agent_id", agent_id), ("runs", "agent_id", agent_id))
        return {**self._delete_by_agent(agent_id, plan), **self.delete_logs(agent_id)}

    def delete_logs(self, agent_id: str) -> dict[str, int]:
        plan = ((SCORES, "id", [agent_id]), ("feedback", "episode_id", None), ("episodes", "id", None))
        return self._delete_by_agent(agent_id, plan)

    def _delete_by_agent(self, agent_id: str, plan: tuple[tuple[str, str, Any], ...]) -> dict[str, int]:
        """Each ``(container, partition key field, partition)`` of ``plan``: its documents of the
        agent deleted, the current policy first; how many per container."""
        by_agent = "SELECT c.id, c.{key} AS pk FROM c WHERE c.agent_id = @agent"
        params = [{"name": "@agent", "value": agent_id}]
        deleted: dict[str, int] = {}
        for container, key, partition in plan:
            rows = self._query(container, by_agent.format(key=key), params, partition_key=partition)
            rows.sort(key=lambda r: not str(r["id"]).endswith(":current"))
            count = 0
            for row in rows:
                pk = [agent_id, row["id"]] if container == SCORES else row["pk"]
                try:
                    self._c[container].delete_item(row["id"], partition_key=pk)
                    count += 1
                except cosmos_errors.CosmosResourceNotFoundError:
                    continue
            deleted["scores" if container == SCORES else container] = count
        return deleted

    def put_run(self, run: TrainingRun) -> None:
        self._c["runs"].upsert_item(run.to_dict())

    def get_run(self, run_id: str) -> RawDoc | None:
        agent_id = run_id.split(":run:", 1)[0]
        return self._read("runs", run_id, agent_id)

    def list_runs(self, agent_id: str, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        if limit == 0:
            return []
        return self._query(
            "runs",
            "SELECT TOP @n * FROM c WHERE c.agent_id = @agent AND c.type = 'run' ORDER BY c.policy_version DESC",
            [{"name": "@n", "value": limit}, {"name": "@agent", "value": agent_id}],
            partition_key=agent_id,
        )

    # ------------------------------------------------------------------ checkpoints

    def get_checkpoint(self, name: str) -> str | None:
        doc = self._read("runs", f"checkpoint:{name}", CHECKPOINT_PARTITION)
        return None if doc is None else str(doc["value"])

    def set_checkpoint(self, name: str, value: str) -> None:
        self._c["runs"].upsert_item(
            {"id": f"checkpoint:{name}", "agent_id": CHECKPOINT_PARTITION, "type": "checkpoint", "value": value}
        )

    def list_checkpoints(self, prefix: str) -> dict[str, str]:
        rows = self._query("runs", 'SELECT c.id, c["value"] AS v FROM c WHERE STARTSWITH(c.id, @prefix)',
                           [{"name": "@prefix", "value": f"checkpoint:{prefix}"}], partition_key=CHECKPOINT_PARTITION)
        return {str(r["id"]).removeprefix("checkpoint:"): str(r["v"]) for r in rows}

    def delete_checkpoint(self, name: str) -> None:
        with contextlib.suppress(cosmos_errors.CosmosResourceNotFoundError):
            self._c["runs"].delete_item(f"checkpoint:{name}", partition_key=CHECKPOINT_PARTITION)

    # ------------------------------------------------------------------ plumbing

    def _read(self, container: str, item_id: str, partition_key: str | list[str]) -> RawDoc | None:
        try:
            return self._c[container].read_item(item_id, partition_key=partition_key)
        except cosmos_errors.CosmosResourceNotFoundError as exc:
            if _container_missing(exc):
                raise
            return None

    def _query(
        self,
        container: str,
        sql: str,
        params: list[dict[str, Any]],
        partition_key: str | list[str] | None = None,
        *,
        page_size: int | None = None,
    ) -> list[RawDoc]:
        """Every row of a query, read page by page (of ``page_size`` rows: the server's choice by
        default). One query at a time per store: azure-cosmos 4.17 keeps one response-header dict
        per client that each query page clears and refills, so two threads querying through one
        client can fail with "OrderedDict mutated during iteration" (seen with 16 concurrent
        queries)."""
        kwargs: dict[str, Any] = {"query": sql, "parameters": params}
        if page_size is not None:
            kwargs["max_item_count"] = page_size
        if partition_key is None:
            kwargs["enable_cross_partition_query"] = True
        else:
            kwargs["partition_key"] = partition_key
        with self._query_lock:
            return list(self._c[container].query_items(**kwargs))

    def copy_legacy_scores(self, **options: Any) -> ScoreCopy:
        """:func:`copy_legacy_scores` of this store (``agent-learn store migrate-scores``)."""
        return copy_legacy_scores(self, **options)


SYSTEM_FIELDS = ("_rid", "_self", "_etag", "_attachments", "_ts", "_lsn")
"""Properties Cosmos adds to every document; a copy gets its own."""


@dataclass
class ScoreCopy:
    """What :func:`copy_legacy_scores` did, document by document."""

    read: int = 0
    copied: int = 0
    """Created in the new container."""
    already: int = 0
    """Present there already with the same content (an earlier run copied them)."""
    overwritten: int = 0
    """Present with other content and replaced by the old container's (``overwrite``)."""
    differing: list[str] = field(default_factory=list)
    """Present with other content and left as they are (the ids)."""
    skipped: list[str] = field(default_factory=list)
    """Without a string ``agent_id``: no place under the new key (the ids; kept in the old container)."""
    paused: list[str] = field(default_factory=list)
    """Agents whose learning was paused for the copy and resumed after it
    (:func:`agent_learning.ops.recovery.migrate_scores`)."""

    def to_dict(self) -> dict[str, Any]:
        return {"read": self.read, "copied": self.copied, "already": self.already, "overwritten": self.overwritten,
                "differing": self.differing, "skipped": self.skipped, "paused": self.paused}


@_guarded
def copy_legacy_scores(
    store: CosmosStore,
    *,
    source: str = LEGACY_SCORES,
    overwrite: bool = False,
    page_size: int = 1_000,
    progress: Any = None,
    before_agent: Callable[[str], None] | None = None,
) -> ScoreCopy:
    """Copy every document of the old ``scores`` container (partition key ``/id``) into the
    score slots' container (key [agent_id, id]), as it is: ``seq`` and every other field are
    kept, so the training cursors stored in the current policies stay valid.

    Idempotent: a document whose copy exists with the same content is left alone, so an
    interrupted copy is finished by running it again. A copy with other content is left as it is
    and reported in ``differing`` (the old container changed after it was copied, or the new one
    was written meanwhile), unless ``overwrite`` replaces it with the old container's version.
    ``progress`` is called with the count read so far after each page; ``before_agent`` with each
    agent id before the first of its documents is copied.
    """
    if source == SCORES:
        raise ValueError(f"--source: {source!r} is the container the scores are copied into")
    old = store.database.get_container_client(source)
    target = store.database.get_container_client(SCORES)
    for container, role, fix in (
        (old, "--source: no container to copy scores from", "is the name right?"),
        (target, "no container to copy scores into", "deploy the infrastructure first (azd provision)"),
    ):
        try:
            container.read()
        except cosmos_errors.CosmosResourceNotFoundError:
            raise NotFound(
                f"{role}: the database {store.database.id!r} has no container {container.id!r}; {fix}"
            ) from None
    result = ScoreCopy()
    seen: set[Any] = set()
    pages = old.query_items("SELECT * FROM c", enable_cross_partition_query=True, max_item_count=page_size)
    for batch in pages.by_page():
        for doc in batch:
            result.read += 1
            if before_agent is not None and isinstance(agent_id := doc.get("agent_id"), str) and agent_id not in seen:
                before_agent(agent_id)
                seen.add(agent_id)
            _copy_one({k: v for k, v in doc.items() if k not in SYSTEM_FIELDS}, target, overwrite, result)
        if progress is not None:
            progress(result.read)
    return result


def _copy_one(doc: RawDoc, target: ContainerProxy, overwrite: bool, result: ScoreCopy) -> None:
    doc_id, agent_id = str(doc.get("id")), doc.get("agent_id")
    if not isinstance(agent_id, str) or not agent_id:
        result.skipped.append(doc_id)
        return
    try:
        target.create_item(doc)
        result.copied += 1
        return
    except cosmos_errors.CosmosResourceExistsError:
        pass
    existing = target.read_item(doc_id, partition_key=[agent_id, doc_id])
    if same_document(existing, doc):
        result.already += 1
    elif overwrite:
        target.upsert_item(doc)
        result.overwritten += 1
    else:
        result.differing.append(doc_id)


def _default_credential(client_id: str | None, aio: bool = False) -> Any:
    if aio:
        from azure.identity.aio import DefaultAzureCredential as AsyncDefaultAzureCredential  # lazy: only with Entra ID

        return AsyncDefaultAzureCredential(managed_identity_client_id=client_id)
    from azure.identity import DefaultAzureCredential  # lazy: only with Entra ID

    return DefaultAzureCredential(managed_identity_client_id=client_id)
