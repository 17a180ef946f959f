"""An in-memory store for unit tests: dicts behind one lock, same semantics as the others."""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from agent_learning.core.errors import ConcurrencyConflict
from agent_learning.documents import (
    CorrectionLedger,
    Episode,
    Feedback,
    PolicyDocument,
    Score,
    ScoreCursor,
    TrainingRun,
    UnjudgedRecord,
    policy_doc_id,
)
from agent_learning.store.base import (
    AgentCursor,
    FeedPage,
    RawDoc,
    Store,
    Tagged,
    UnjudgedMark,
    agent_cursor,
    check_limit,
    same_document,
    sources_full,
)


class MemoryStore(Store):
    """Everything in process memory; lost when the object goes away."""

    location = "the memory store"

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._episodes: dict[str, RawDoc] = {}
        self._feed: list[str] = []
        self._scores: dict[str, RawDoc] = {}
        self._next_seq = 1
        self._policies: dict[str, Tagged] = {}
        self._runs: dict[str, RawDoc] = {}
        self._checkpoints: dict[str, str] = {}
        self._feedback: dict[str, RawDoc] = {}
        self._feedback_lsn: dict[str, int] = {}
        self._next_feedback_lsn = 1
        self._markers: set[str] = set()
        self._unjudged: dict[str, RawDoc] = {}
        self._ledgers: dict[str, Tagged] = {}

    # episodes
    def add_episode(self, episode: Episode) -> None:
        doc = episode.to_dict()
        with self._lock:
            existing = self._episodes.get(episode.id)
            if existing is not None:
                if same_document(existing, doc):
                    return
                raise ConcurrencyConflict(f"episode {episode.id!r} already exists with different content")
            self._episodes[episode.id] = doc
            self._feed.append(episode.id)

    def get_episode(self, episode_id: str) -> RawDoc | None:
        with self._lock:
            doc = self._episodes.get(episode_id)
            return copy.deepcopy(doc) if doc is not None else None

    def read_episodes(self, continuation: str | None, max_items: int = 100) -> FeedPage:
        position = int(continuation) if continuation else 0
        items: list[RawDoc] = []
        with self._lock:
            # A deleted episode is skipped, and the page goes on past it: a page of nothing but
            # deleted ones would read as the end of the feed and stall it there.
            while position < len(self._feed) and len(items) < max_items:
                episode = self._episodes.get(self._feed[position])
                if episode is not None:
                    items.append(copy.deepcopy(episode))
                position += 1
        return FeedPage(items, str(position))

    def list_episodes(self, agent_id: str | None = None, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        with self._lock:
            out: list[RawDoc] = []
            for eid in reversed(self._feed):
                if len(out) >= limit:
                    break
                doc = self._episodes.get(eid)
                if doc is not None and (agent_id is None or doc.get("agent_id") == agent_id):
                    out.append(copy.deepcopy(doc))
            return out

    def episode_ids(self, agent_id: str) -> Iterator[str]:
        with self._lock:
            ids = [eid for eid in self._feed if self._episodes.get(eid, {}).get("agent_id") == agent_id]
        yield from ids

    # scores
    def add_score(self, score: Score) -> Score:
        with self._lock:
            if score.id in self._scores:
                raise ConcurrencyConflict(f"episode {score.id!r} already has a score")
            return self.put_score(score)

    def put_score(self, score: Score) -> Score:
        with self._lock:
            existing = self._scores.get(score.id)
            update: dict[str, object] = {}
            if existing is not None and isinstance(existing.get("seq"), int):
                update["seq"] = existing["seq"]
                update["late_write"] = existing.get("late_write") is True
            else:
                update["seq"] = self._next_seq
                self._next_seq += 1
            self._unjudged.pop(score.id, None)
            if score.id in self._markers:
                self._markers.discard(score.id)
                update["feedback_pending"] = True
            stored = score.model_copy(update=update)
            self._scores[score.id] = stored.to_dict()
            return stored

    def get_score(self, episode_id: str, agent_id: str) -> RawDoc | None:
        with self._lock:
            doc = self._scores.get(episode_id)
            return copy.deepcopy(doc) if doc is not None and doc.get("agent_id") == agent_id else None

    def read_scores(
        self, agent_id: str, after: ScoreCursor | None, limit: int, *, settled: bool = True
    ) -> list[RawDoc]:
        check_limit(limit)
        key = (after.seq, after.id) if after else None
        with self._lock:
            rows = [
                d
                for d in self._scores.values()
                if d.get("agent_id") == agent_id
                and isinstance(d.get("seq"), int)
                and (key is None or (d["seq"], d["id"]) > key)
            ]
            rows.sort(key=lambda d: (d["seq"], d["id"]))
            return copy.deepcopy(rows[:limit])

    def has_new_scores(self, agent_id: str, after: ScoreCursor | None) -> bool:
        return bool(self.read_scores(agent_id, after, 1))

    # unjudged episodes
    def mark_unjudged(self, record: UnjudgedRecord) -> UnjudgedMark:
        with self._lock:
            if record.id in self._scores:
                return "scored"
            if record.id in self._unjudged:
                return "kept"
            self._unjudged[record.id] = record.to_dict()
            return "recorded"

    def get_unjudged(self, episode_id: str, agent_id: str) -> RawDoc | None:
        with self._lock:
            doc = self._unjudged.get(episode_id)
            return self._with_pending(doc) if doc is not None and doc.get("agent_id") == agent_id else None

    def list_unjudged(self, agent_id: str, after: str | None = None, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        with self._lock:
            ids = sorted(
                i for i, d in self._unjudged.items() if d.get("agent_id") == agent_id and (after is None or i > after)
            )
            return [self._with_pending(self._unjudged[i]) for i in ids[:limit]]

    def _with_pending(self, doc: RawDoc) -> RawDoc:
        return {**copy.deepcopy(doc), "feedback_pending": doc["id"] in self._markers}

    # feedback
    def put_feedback(self, feedback: Feedback, max_sources: int | None = None) -> None:
        with self._lock:
            if max_sources is not None and feedback.id not in self._feedback:
                given = sum(d.get("episode_id") == feedback.episode_id for d in self._feedback.values())
                if given >= max_sources:
                    raise sources_full(feedback.episode_id, given)
            self._feedback[feedback.id] = feedback.to_dict()
            self._feedback_lsn[feedback.id] = self._next_feedback_lsn
            self._next_feedback_lsn += 1

    def list_feedback(self, episode_id: str) -> list[RawDoc]:
        with self._lock:
            docs = [copy.deepcopy(d) for d in self._feedback.values() if d.get("episode_id") == episode_id]
        return sorted(docs, key=lambda d: d["id"])

    def mark_feedback_waiting(self, episode_id: str, agent_id: str) -> bool:
        with self._lock:
            if episode_id in self._scores:
                return False
            self._markers.add(episode_id)
            return True

    def read_feedback_changes(self, continuation: str | None, max_items: int = 100) -> FeedPage:
        after = int(continuation) if continuation else 0
        with self._lock:
            changed = sorted((lsn, fid) for fid, lsn in self._feedback_lsn.items() if lsn > after)[:max_items]
            items = [copy.deepcopy(self._feedback[fid]) for _, fid in changed]
        return FeedPage(items, str(changed[-1][0] if changed else after))

    def get_correction_ledger(self, episode_id: str, agent_id: str) -> Tagged | None:
        with self._lock:
            tagged = self._ledgers.get(episode_id)
            if tagged is None or tagged.doc.get("agent_id") != agent_id:
                return None
            return Tagged(copy.deepcopy(tagged.doc), tagged.etag)

    def put_correction_ledger(self, ledger: CorrectionLedger, etag: str | None) -> str:
        with self._lock:
            existing = self._ledgers.get(ledger.episode_id)
            if (existing.etag if existing else None) != etag:
                raise ConcurrencyConflict(f"the correction ledger of {ledger.episode_id!r} changed (stale ETag)")
            new_etag = uuid.uuid4().hex
            self._ledgers[ledger.episode_id] = Tagged(ledger.to_dict(), new_etag)
            return new_etag

    # policies
    def get_current_policy(self, agent_id: str) -> Tagged | None:
        with self._lock:
            tagged = self._policies.get(policy_doc_id(agent_id, None))
            return Tagged(copy.deepcopy(tagged.doc), tagged.etag) if tagged else None

    def get_policy_version(self, agent_id: str, version: int) -> RawDoc | None:
        with self._lock:
            tagged = self._policies.get(policy_doc_id(agent_id, version))
            return copy.deepcopy(tagged.doc) if tagged else None

    def replace_current_policy(self, doc: PolicyDocument, etag: str | None) -> str:
        if doc.kind != "current":
            raise ValueError("replace_current_policy needs a kind='current' document")
        with self._lock:
            existing = self._policies.get(doc.id)
            if etag is None and existing is not None:
                raise ConcurrencyConflict(f"current policy of {doc.agent_id!r} already exists")
            if etag is not None and (existing is None or existing.etag != etag):
                raise ConcurrencyConflict(f"current policy of {doc.agent_id!r} changed (stale ETag)")
            new_etag = uuid.uuid4().hex
            self._policies[doc.id] = Tagged(doc.to_dict(), new_etag)
            return new_etag

    def create_policy_version(self, doc: PolicyDocument) -> None:
        if doc.kind != "version":
            raise ValueError("create_policy_version needs a kind='version' document")
        data = doc.to_dict()
        with self._lock:
            existing = self._policies.get(doc.id)
            if existing is not None:
                if same_document(existing.doc, data):
                    return
                raise ConcurrencyConflict(f"policy version {doc.id!r} already exists with different content")
            self._policies[doc.id] = Tagged(data, uuid.uuid4().hex)

    def list_policy_versions(
        self, agent_id: str, newest: int | None = None, *, between: tuple[int, int] | None = None
    ) -> list[RawDoc]:
        with self._lock:
            docs = sorted(
                (
                    t.doc
                    for t in self._policies.values()
                    if t.doc.get("agent_id") == agent_id
                    and t.doc.get("kind") == "version"
                    and (between is None or between[0] <= t.doc.get("version", 0) <= between[1])
                ),
                key=lambda d: d.get("version", 0),
            )
            kept = docs if newest is None else docs[max(len(docs) - newest, 0) :]
            return [copy.deepcopy(d) for d in kept]

    def policy_version_times(self, agent_id: str) -> list[tuple[int, Any]]:
        with self._lock:
            return sorted(
                (t.doc.get("version", 0), t.doc.get("created_at"))
                for t in self._policies.values()
                if t.doc.get("agent_id") == agent_id and t.doc.get("kind") == "version"
            )

    def list_agents(self) -> list[str]:
        with self._lock:
            return sorted(t.doc["agent_id"] for t in self._policies.values() if t.doc.get("kind") == "current")

    def training_cursors(self) -> list[AgentCursor]:
        with self._lock:
            current = [agent_cursor(t.doc) for t in self._policies.values() if t.doc.get("kind") == "current"]
        return sorted(current, key=lambda c: c.agent_id)

    # runs
    def delete_agent(self, agent_id: str) -> dict[str, int]:
        with self._lock:
            policies = [k for k, v in self._policies.items() if v.doc.get("agent_id") == agent_id]
            policies.sort(key=lambda k: not k.endswith(":current"))  # the current document first
            return {"policies": _drop(self._policies, policies),
                    "runs": _drop(self._runs, [k for k, d in self._runs.items() if d.get("agent_id") == agent_id]),
                    **self.delete_logs(agent_id)}

    def delete_logs(self, agent_id: str) -> dict[str, int]:
        with self._lock:
            episodes = {k for k, d in self._episodes.items() if d.get("agent_id") == agent_id}

            def mine(table: dict[str, RawDoc]) -> list[str]:
                return [k for k, d in table.items() if d.get("agent_id") == agent_id]

            deleted = {
                "scores": _drop(self._scores, mine(self._scores)),
                "feedback": _drop(self._feedback, mine(self._feedback)),
                "episodes": _drop(self._episodes, list(episodes)),
            }
            ledgers = [k for k, tagged in self._ledgers.items() if tagged.doc.get("agent_id") == agent_id]
            deleted["scores"] += _drop(self._ledgers, ledgers) + _drop(self._unjudged, mine(self._unjudged))
            for fid in [f for f in self._feedback_lsn if f not in self._feedback]:
                del self._feedback_lsn[fid]
            self._markers -= episodes
            return deleted

    def put_run(self, run: TrainingRun) -> None:
        with self._lock:
            self._runs[run.id] = run.to_dict()

    def get_run(self, run_id: str) -> RawDoc | None:
        with self._lock:
            doc = self._runs.get(run_id)
            return copy.deepcopy(doc) if doc is not None else None

    def list_runs(self, agent_id: str, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        with self._lock:
            docs = [copy.deepcopy(d) for d in self._runs.values() if d.get("agent_id") == agent_id]
        docs.sort(key=lambda d: d.get("policy_version", 0), reverse=True)
        return docs[:limit]

    # checkpoints
    def get_checkpoint(self, name: str) -> str | None:
        with self._lock:
            return self._checkpoints.get(name)

    def set_checkpoint(self, name: str, value: str) -> None:
        with self._lock:
            self._checkpoints[name] = value

    def list_checkpoints(self, prefix: str) -> dict[str, str]:
        with self._lock:
            return {k: v for k, v in self._checkpoints.items() if k.startswith(prefix)}

    def delete_checkpoint(self, name: str) -> None:
        with self._lock:
            self._checkpoints.pop(name, None)


def _drop(table: dict[str, Any], keys: list[str]) -> int:
    for key in keys:
        del table[key]
    return len(keys)
