"""The store port: where episodes, scores, policies and training runs live.

Adapters: :class:`~agent_learning.store.memory.MemoryStore` (unit tests),
:class:`~agent_learning.store.sqlite.SQLiteStore` (the local default, one file) and the Cosmos
DB adapter. All of them pass the same contract tests (``tests/store/test_store_contract.py``).

Reads return raw dicts (Cosmos items) rather than parsed documents, so that a corrupt or
foreign document reaches the caller that knows how to reject it and keep going, instead of
failing inside the store.

Semantics every adapter keeps:

* ``add_episode`` creates; writing the same episode again is a no-op, a different document
  with an existing id is a :class:`ConcurrencyConflict` (episodes are immutable).
* ``read_episodes`` is a change feed: every episode once, in write order, resumable from an
  opaque continuation token (Cosmos: the change-feed continuation; SQLite: a sequence number).
* ``add_score`` creates (a second score for the same episode is a conflict); ``put_score``
  creates or overwrites. On the first write the store assigns ``seq``, a number that
  increases with write order; overwrites keep it. The trainer reads an agent's scores ordered
  by ``(seq, id)`` after a cursor, so a re-scored episode is never read twice.
* ``replace_current_policy`` is compare-and-swap on the ETag; ``create_policy_version`` is
  create-only (an identical existing version is accepted, a different one conflicts).
* Feedback: ``put_feedback`` creates or overwrites (the id is per episode and source). Given
  ``max_sources``, it refuses a source new to the episode once that many sources gave feedback
  on it, counting and writing as one atomic step, so posts racing each other cannot pass the cap.
  ``mark_feedback_waiting`` leaves a marker in an episode's score slot when it has no score
  yet; the first write of that score replaces the marker atomically and comes back with
  ``feedback_pending=True``, so the scorer knows to apply the feedback. Markers are never
  returned by ``get_score`` or ``read_scores``. This costs nothing for episodes without
  feedback, and no feedback can slip between the scorer's write and the feedback's.
  ``read_feedback_changes`` is a change feed of feedback documents like ``read_episodes``
  (an overwritten document comes again, at its new position), so feedback whose handler
  died before applying it can be found without scanning.
* Unjudged records (``AGENT_LEARNING_JUDGING``): ``mark_unjudged`` leaves an
  :class:`~agent_learning.documents.UnjudgedRecord` in the score slot of an episode the scorer
  did not judge, unless it has a score. A record already there stays (the first answer
  stands); a feedback marker is replaced and its feedback stays pending. Like markers, records
  have no ``seq`` and are never returned by ``get_score`` or ``read_scores``; ``get_unjudged``
  and ``list_unjudged`` read them. The first write of the episode's score replaces the record
  as it replaces a marker: with a new ``seq`` (so it is learned), and ``feedback_pending=True``
  if feedback waits (``mark_feedback_waiting`` on a recorded episode returns True).
* Correction ledgers (one per episode with feedback corrections): ``get_correction_ledger`` is
  a point read, ``put_correction_ledger`` a compare-and-swap on the ETag (``None``: create
  only). Ledgers are never returned by ``get_score``, ``read_scores`` or ``list_feedback``.
* An episode's score slot (its score, feedback marker, correction rows and ledger) is addressed
  by the episode's agent and the document's id together (``get_score(episode_id, agent_id)``):
  on Cosmos DB that pair is the document's partition key, so every point read of the slot
  needs both.
* For a training fan-out: ``training_cursors`` lists every agent's current version, cursor and
  pin, and whether its document validates, in one pass over the current documents;
  ``has_new_scores`` says whether ``read_scores`` would return anything, at the cost of one
  small request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from agent_learning.core.errors import InvalidDocument, LimitExceeded
from agent_learning.documents import (
    CorrectionLedger,
    Episode,
    Feedback,
    PolicyDocument,
    Score,
    ScoreCursor,
    TrainingRun,
    UnjudgedRecord,
    stored_policy,
)

RawDoc = dict[str, Any]


@dataclass(frozen=True)
class FeedPage:
    """One page of the episode change feed."""

    items: list[RawDoc]
    continuation: str | None
    """Pass it to the next ``read_episodes`` call; ``None`` only when nothing was ever read."""


class NotModified:
    """The answer of a conditional read whose document has not changed."""

    _instance: NotModified | None = None

    def __new__(cls) -> NotModified:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_MODIFIED"


NOT_MODIFIED = NotModified()


@dataclass(frozen=True)
class AgentCursor:
    """Where an agent's training stands: read from its current policy document."""

    agent_id: str
    version: int
    """The current version (0 when the document's version is unreadable)."""
    cursor: ScoreCursor | None
    """The last score learned (``None``: none yet, or the document's cursor is unreadable, which
    the trainer then reports when it loads the document)."""
    pinned: bool
    pin_reason: str = ""
    """Why learning is paused, when it is."""
    problem: str = ""
    """Why the current document does not validate (``""``: it does); the trainer refuses such a
    document whether or not the agent has new scores."""


def agent_cursor(doc: Any, agent_id: str | None = None) -> AgentCursor:
    """The :class:`AgentCursor` of a current policy document as stored (``agent_id``: the agent
    it is stored under; by default the document's own). The document is validated as the trainer
    validates it (:func:`~agent_learning.documents.stored_policy`), and its problem is kept in
    ``problem`` rather than failing the listing of every agent; its fields are read leniently,
    one that does not validate left at its "unknown" value."""
    try:
        stored_policy(doc)
        problem = ""
    except InvalidDocument as exc:
        problem = str(exc)
    if not isinstance(doc, dict):
        doc = {}
    version, raw_cursor, pinned = doc.get("version"), doc.get("cursor"), doc.get("pinned")
    reason = doc.get("pin_reason")
    cursor = None
    if raw_cursor is not None:
        try:
            cursor = ScoreCursor.model_validate(raw_cursor)
        except ValueError:
            cursor = None
    return AgentCursor(
        agent_id=agent_id if agent_id is not None else str(doc.get("agent_id")),
        version=version if isinstance(version, int) and not isinstance(version, bool) else 0,
        cursor=cursor,
        pinned=pinned is True,
        pin_reason=reason if isinstance(reason, str) else "",
        problem=problem,
    )


def check_limit(limit: int) -> None:
    """A listing's ``limit``: a whole number of at least 0 in every adapter (a negative one read
    as "all but the last", "all" or "none", depending on the store)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit: must be a whole number of at least 0, got {limit!r}")


def sources_full(episode_id: str, sources: int) -> LimitExceeded:
    """What :meth:`Store.put_feedback` raises for a new source of an episode that has feedback
    from ``sources`` sources, its ``max_sources``."""
    return LimitExceeded(f"source: episode {episode_id!r} already has feedback from {sources} sources")


@dataclass(frozen=True)
class Tagged:
    """A raw document with its ETag."""

    doc: RawDoc
    etag: str


UnjudgedMark = Literal["recorded", "kept", "scored"]
"""What :meth:`Store.mark_unjudged` did with an episode's score slot."""


class Store(ABC):
    """The persistence port. Thread-safe in every adapter."""

    @property
    def location(self) -> str:
        """Where the store keeps its documents, for messages (a file, a database)."""
        return type(self).__name__

    # ------------------------------------------------------------------ episodes

    @abstractmethod
    def add_episode(self, episode: Episode) -> None:
        """Store a new episode (idempotent for an identical document)."""

    @abstractmethod
    def get_episode(self, episode_id: str) -> RawDoc | None:
        """The raw episode document, or ``None``."""

    @abstractmethod
    def read_episodes(self, continuation: str | None, max_items: int = 100) -> FeedPage:
        """Up to ``max_items`` episodes written after ``continuation`` (``None``: from the start)."""

    @abstractmethod
    def list_episodes(self, agent_id: str | None = None, limit: int = 100) -> list[RawDoc]:
        """The newest episodes first, optionally of one agent."""

    @abstractmethod
    def episode_ids(self, agent_id: str) -> Iterator[str]:
        """The id of every episode of ``agent_id``, in no particular order, streamed in pages
        (for audits: memory stays bounded by what the caller keeps)."""

    # ------------------------------------------------------------------ scores

    @abstractmethod
    def add_score(self, score: Score) -> Score:
        """Create the score of an episode; returns it with its ``seq``. Raises
        :class:`ConcurrencyConflict` if the episode already has a score (the first stays).
        A feedback marker is replaced; the result then has ``feedback_pending=True``."""

    @abstractmethod
    def put_score(self, score: Score) -> Score:
        """Create or overwrite the score of an episode (re-scoring); keeps an existing ``seq``
        and its ``late_write`` mark, which says where that ``seq`` landed (a feedback marker is
        replaced as by :meth:`add_score`)."""

    @abstractmethod
    def get_score(self, episode_id: str, agent_id: str) -> RawDoc | None:
        """The raw score document ``episode_id`` (an episode's, or a correction's id) of the
        agent ``agent_id``, or ``None``."""

    @abstractmethod
    def read_scores(
        self, agent_id: str, after: ScoreCursor | None, limit: int, *, settled: bool = True
    ) -> list[RawDoc]:
        """Scores of ``agent_id`` ordered by ``(seq, id)`` strictly after ``after``.

        Every returned item has an int ``seq`` and a str ``id`` even if the rest is invalid.
        On Cosmos DB only scores older than the settle window are returned, unless ``settled``
        is False (audits: every score, however recent); other stores have no window.
        """

    @abstractmethod
    def has_new_scores(self, agent_id: str, after: ScoreCursor | None) -> bool:
        """Whether ``read_scores(agent_id, after, 1)`` would return a score (settle window
        included). On Cosmos DB one single-partition request."""

    # ------------------------------------------------------------------ unjudged episodes

    @abstractmethod
    def mark_unjudged(self, record: UnjudgedRecord) -> UnjudgedMark:
        """Record that an episode is not judged, in its score slot: ``recorded`` (a feedback marker
        there is replaced, its feedback stays pending); ``kept`` if a record is already there (it
        stays as it is: the first answer stands); ``scored`` (nothing changes) if it has a score."""

    @abstractmethod
    def get_unjudged(self, episode_id: str, agent_id: str) -> RawDoc | None:
        """The unjudged record of ``agent_id``'s episode (with ``feedback_pending`` as it stands), or ``None``."""

    @abstractmethod
    def list_unjudged(self, agent_id: str, after: str | None = None, limit: int = 100) -> list[RawDoc]:
        """Up to ``limit`` of the agent's unjudged records, in episode-id order after the episode id
        ``after`` (``None``: from the first), each with ``feedback_pending`` as it stands."""

    # ------------------------------------------------------------------ feedback

    @abstractmethod
    def put_feedback(self, feedback: Feedback, max_sources: int | None = None) -> None:
        """Create or overwrite one feedback document (its id is per episode and source). With
        ``max_sources``, a source new to the episode is refused (:func:`sources_full`) when
        ``max_sources`` sources already gave feedback on it, atomically with the write; a source
        that gave feedback may always overwrite it."""

    @abstractmethod
    def list_feedback(self, episode_id: str) -> list[RawDoc]:
        """Every feedback document of an episode, ordered by id."""

    @abstractmethod
    def mark_feedback_waiting(self, episode_id: str, agent_id: str) -> bool:
        """If the episode has no score yet, leave a marker in its score slot and return True
        (its scorer will apply the feedback); return False if the episode is scored. On an
        unjudged record, the record says ``feedback_pending`` (True)."""

    @abstractmethod
    def read_feedback_changes(self, continuation: str | None, max_items: int = 100) -> FeedPage:
        """Up to ``max_items`` feedback documents written or overwritten after ``continuation``
        (``None``: from the start), in write order; resumable like :meth:`read_episodes`."""

    @abstractmethod
    def get_correction_ledger(self, episode_id: str, agent_id: str) -> Tagged | None:
        """The correction ledger of ``agent_id``'s episode ``episode_id`` and its ETag, or ``None``."""

    @abstractmethod
    def put_correction_ledger(self, ledger: CorrectionLedger, etag: str | None) -> str:
        """Write the ledger if its ETag is still ``etag`` (``None``: it must not exist yet).
        Returns the new ETag; raises :class:`ConcurrencyConflict` otherwise."""

    # ------------------------------------------------------------------ policies

    @abstractmethod
    def get_current_policy(self, agent_id: str) -> Tagged | None:
        """The agent's current policy document and its ETag, or ``None``."""

    def get_current_policy_if_changed(self, agent_id: str, etag: str | None) -> Tagged | NotModified | None:
        """Like :meth:`get_current_policy`, but ``NOT_MODIFIED`` when its ETag is still ``etag``.

        ``None`` or an empty ``etag`` means no cached copy: a full read. Cosmos answers a
        matching read with 304 and no document; embedded stores compare.
        """
        tagged = self.get_current_policy(agent_id)
        if tagged is not None and etag and tagged.etag == etag:
            return NOT_MODIFIED
        return tagged

    @abstractmethod
    def get_policy_version(self, agent_id: str, version: int) -> RawDoc | None:
        """An immutable policy version document, or ``None``."""

    @abstractmethod
    def replace_current_policy(self, doc: PolicyDocument, etag: str | None) -> str:
        """Write the current document if its ETag is still ``etag`` (``None``: it must not
        exist yet). Returns the new ETag; raises :class:`ConcurrencyConflict` otherwise."""

    @abstractmethod
    def create_policy_version(self, doc: PolicyDocument) -> None:
        """Store an immutable version; identical re-creation is a no-op, a different
        document under the same id raises :class:`ConcurrencyConflict`."""

    @abstractmethod
    def list_policy_versions(
        self, agent_id: str, newest: int | None = None, *, between: tuple[int, int] | None = None
    ) -> list[RawDoc]:
        """Every version document of an agent, oldest first; with ``between=(low, high)``, only
        versions ``low`` to ``high`` (inclusive); with ``newest``, only the newest ``newest`` of
        those (still oldest first). So reading an agent's recent history, or a stretch of it,
        costs as much after a year of training as after a day."""

    @abstractmethod
    def policy_version_times(self, agent_id: str) -> list[tuple[int, Any]]:
        """Every version of an agent as (number, ``created_at`` as stored), oldest first: a
        projection, a few dozen bytes per version, from which a caller picks the versions of a
        time window before reading any document. (A document whose number is not an integer,
        which only an edit by hand makes, is left out; ``agent-learn audit`` reports the gap.)"""

    @abstractmethod
    def list_agents(self) -> list[str]:
        """Ids of the agents that have a current policy, sorted."""

    @abstractmethod
    def training_cursors(self) -> list[AgentCursor]:
        """The :class:`AgentCursor` of every agent that has a current policy, sorted by agent id,
        each document validated (:func:`agent_cursor`). On Cosmos DB one cross-partition query,
        read in pages of a thousand."""

    @abstractmethod
    def delete_agent(self, agent_id: str) -> dict[str, int]:
        """Delete everything of an agent: its current policy first (so that it stops being trained
        and chosen from), then its versions, runs, scores (corrections and ledgers included),
        feedback and episodes. Returns how many documents of each kind were deleted. Idempotent."""

    @abstractmethod
    def delete_logs(self, agent_id: str) -> dict[str, int]:
        """Delete an agent's logs: its scores (corrections and ledgers included), feedback and
        episodes, and keep its policy, versions and runs (what it learned, and how). Returns how
        many documents of each kind were deleted. Idempotent."""

    # ------------------------------------------------------------------ runs

    @abstractmethod
    def put_run(self, run: TrainingRun) -> None:
        """Create or overwrite a training run (its id is deterministic)."""

    @abstractmethod
    def get_run(self, run_id: str) -> RawDoc | None: ...

    @abstractmethod
    def list_runs(self, agent_id: str, limit: int = 100) -> list[RawDoc]:
        """The newest runs of an agent first."""

    # ------------------------------------------------------------------ checkpoints

    @abstractmethod
    def get_checkpoint(self, name: str) -> str | None:
        """A durable named value (the local runner keeps its feed continuation here)."""

    @abstractmethod
    def set_checkpoint(self, name: str, value: str) -> None: ...

    @abstractmethod
    def list_checkpoints(self, prefix: str) -> dict[str, str]:
        """Every checkpoint whose name starts with ``prefix``: name → value (for markers of work
        pending, such as Personalizer events waiting for their reward; keep such sets small)."""

    @abstractmethod
    def delete_checkpoint(self, name: str) -> None:
        """Delete a checkpoint (none of that name: nothing to do)."""

    def close(self) -> None:
        """Release connections."""
        return None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def same_document(a: RawDoc, b: RawDoc, ignore: Iterable[str] = ()) -> bool:
    """Equality of two stored documents as JSON (:func:`same_json`), ignoring store-added
    (``_``-prefixed) fields and those in ``ignore``."""
    skip = set(ignore)
    strip = lambda d: {k: v for k, v in d.items() if not k.startswith("_") and k not in skip}  # noqa: E731
    return same_json(strip(a), strip(b))


def same_json(a: Any, b: Any) -> bool:
    """Equality of two JSON values where a boolean equals only a boolean (Python has ``True == 1``),
    while numbers compare by value (``1 == 1.0``: Cosmos DB reads a written ``1.0`` back as ``1``).
    Iterative, so however deep a document nests."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if isinstance(x, dict):
            if not isinstance(y, dict) or x.keys() != y.keys():
                return False
            pending.extend((v, y[k]) for k, v in x.items())
        elif isinstance(x, list):
            if not isinstance(y, list) or len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif isinstance(x, bool) or isinstance(y, bool):
            if type(x) is not type(y) or x != y:
                return False
        elif x != y:
            return False
    return True
