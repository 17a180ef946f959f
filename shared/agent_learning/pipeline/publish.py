"""Publish: every write of an agent's current policy document, and its one validated loader.

The current document is the agent's policy and the training cursor over its scores. It
changes only here, always by an ETag compare-and-swap, and each change is idempotent:

* :func:`create_policy` — the first version; never overwrites an existing policy.
* :func:`publish` — the swap the trainer makes to publish the next version.
* :func:`set_pinned`, :func:`rollback`, :func:`revise`, :func:`import_policy` — operators' interventions (below).

History is never rewritten. A rollback publishes the logits (and temperature and exploration
floor) of an earlier version as a *new* version with ``source="rollback"``; the training
cursor stays where it is, so no score is learned twice and none is forgotten, and so does the
learner state (the reward evidence gathered up to that cursor: what the episodes showed is
still true after a rollback). Pinning freezes learning: it sets ``pinned`` on the current
document only (no new version), the trainer then leaves the agent alone and its cursor stays
put, and unpinning resumes learning from there, so scores that arrived meanwhile are learned
then. A revision changes the actions themselves (adds, removes, renames) as a new version with
``source="revise"``: an action that stays keeps its logit and its evidence in the learner
state, a renamed one keeps those of its old id, and an added one starts at the mean logit of
those that stay (neither favoured nor starved) with no evidence. Scores of an action the
revision removed, or renamed, are skipped by later training runs (the new policy never draws
that id, so its importance weight is 0) and counted as the run's ``skipped`` rows. A rollback
to a version with other actions restores those actions too. Every intervention is a
compare-and-swap retried when a trainer published in between, and repeating one changes
nothing: pinning a pinned policy, repeating a rollback or a revision.

Before it replaces the current document, every intervention writes the version and run
records of the version it replaces (:func:`materialise`): a trainer that died between
publishing a version and writing its records leaves only the current document holding it,
and agents may already have logged episodes under it. The trainer checks the same at the start
of every run.

Requests. After a won swap, :func:`publish` writes the new version's records without reading
first (:func:`record`): a create-only version (compared with what is stored only when the
create conflicts) and the run. Checking that a version's records exist costs one point read
(:func:`materialise`): the run record when the version has one (it is written after the version
record, so it existing means both do), else the version record.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_learning.core import notices
from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import (
    AlreadyExists,
    ConcurrencyConflict,
    InvalidDocument,
    NotFound,
    StoredDocumentInvalid,
    TransientError,
)
from agent_learning.documents import MAX_NOTE_CHARS, Action, PolicyDocument, stored_policy
from agent_learning.store.base import Store, same_document

log = logging.getLogger(__name__)

ATTEMPTS = 5
"""How often an intervention re-reads and retries when a trainer publishes in between."""


@dataclass(frozen=True)
class Current:
    """The validated current policy document and the ETag it was read with."""

    policy: PolicyDocument
    etag: str


def load_current_tagged(store: Store, agent_id: str) -> Current | None:
    """The agent's current policy document, validated, with its ETag; ``None`` if it has none.

    Raises :class:`~agent_learning.core.errors.InvalidDocument` if the document does not validate.
    """
    tagged = store.get_current_policy(agent_id)
    return None if tagged is None else Current(stored_policy(tagged.doc), tagged.etag)


def load_current(store: Store, agent_id: str) -> PolicyDocument | None:
    """The agent's current policy document, validated, or ``None``."""
    current = load_current_tagged(store, agent_id)
    return None if current is None else current.policy


def materialise(store: Store, current: PolicyDocument) -> None:
    """Make sure the version and run records of ``current`` exist (idempotent): one point read
    when they do, the writes of :func:`record` when a crash left them unwritten.

    Raises :class:`~agent_learning.core.errors.ConcurrencyConflict` if a version record without a run
    differs from ``current`` (it is immutable history: nothing overwrites it).
    """
    if current.run is not None:
        if store.get_run(current.run.id) is not None:
            return  # written after the version record: both exist
    else:
        stored = store.get_policy_version(current.agent_id, current.version)
        if stored is not None:
            if not same_document(stored, current.as_kind("version").to_dict()):
                raise ConcurrencyConflict(f"policy version {current.agent_id}:v{current.version} differs from the "
                                          "current document that holds it")
            return
    record(store, current)


def record(store: Store, current: PolicyDocument) -> None:
    """Write the version record of ``current``, then its run record, without reading first.

    The version is create-only (an identical stored one is accepted: compared only when the
    create conflicts); the run is written as it is (the current document holds the record).
    """
    store.create_policy_version(current.as_kind("version"))
    if current.run is not None:
        store.put_run(current.run)


def publish(store: Store, new: PolicyDocument, etag: str | None) -> PolicyDocument:
    """Make ``new`` the current document if it still has ``etag`` (``None``: if there is none),
    then write its version and run records (:func:`record`). The whole document is validated
    again first.

    Raises :class:`~agent_learning.core.errors.ConcurrencyConflict` when another writer got there first.
    Once the swap succeeded, ``new`` is published: a store outage while writing its records is
    logged, not raised (the next run or intervention writes them, :func:`materialise`), so that
    the caller does not report as failed a version agents already use.
    """
    new = PolicyDocument.from_dict(new.to_dict())
    store.replace_current_policy(new, etag)
    notices.policy_changed(new.agent_id)  # clients in this process pick it up at their next choice
    try:
        record(store, new)
    except TransientError as exc:
        log.warning("%s v%d is published; writing its version and run records failed (%s), the next run "
                    "writes them", new.agent_id, new.version, exc)
    return new


def create_policy(store: Store, policy_doc: PolicyDocument) -> PolicyDocument:
    """Publish the first version of an agent's policy and return the agent's current document.

    Each creation gets a new :data:`~agent_learning.documents.Incarnation` (unless the document
    names one), which every later version keeps: an agent deleted and created again under the
    same id never learns from its predecessor's episodes still queued (the scorer dead-letters
    them, training refuses their scores).

    Idempotent: when the agent's version 1 is this document already (made at another time: the
    creation time, and the incarnation when the document names none, are not compared), nothing
    is written and the current document, perhaps of a later version, is returned. Raises
    :class:`~agent_learning.core.errors.AlreadyExists`, naming the agent, when it has another policy:
    a policy is never overwritten.
    """
    if policy_doc.version != 1 or policy_doc.source != "init":
        raise ValueError("a new policy starts at version 1 with source 'init'")
    ignore: tuple[str, ...] = ("created_at",)
    if policy_doc.incarnation is None:
        policy_doc = policy_doc.model_copy(update={"incarnation": uuid.uuid4().hex})
        ignore += ("incarnation",)
    try:
        return publish(store, policy_doc.as_kind("current"), None)
    except ConcurrencyConflict:
        pass
    agent_id = policy_doc.agent_id
    first = store.get_policy_version(agent_id, 1)
    current = load_current(store, agent_id)
    if first is None and current is not None and current.version == 1:  # its records not written yet
        first = current.as_kind("version").to_dict()
    if current is not None and first is not None and same_document(
        first, policy_doc.as_kind("version").to_dict(), ignore=ignore
    ):
        return current
    raise AlreadyExists(
        f"agent {agent_id!r} already has a policy, made from other actions or settings; it is never overwritten: "
        f"change its actions with `agent-learn policy revise --agent-id {agent_id} --actions FILE` (what it "
        "learned is kept), roll it back or pin it (`agent-learn policy --help`), or create this one under a new "
        "agent id"
    )


# --------------------------------------------------------------------------- interventions


@dataclass(frozen=True)
class Change:
    """The current policy after an intervention, and whether it changed anything."""

    policy: PolicyDocument
    changed: bool
    replaced_invalid: str = ""
    """When a rollback replaced an invalid current document: what was wrong with it."""
    resumed_from: int = 0
    """And the version record whose training cursor and learner state stood in for it."""


def swap(store: Store, agent_id: str, change: Callable[[PolicyDocument], PolicyDocument | None]) -> Change:
    """Apply ``change`` to the current document with compare-and-swap, re-reading on a lost race.

    ``change`` returns the new document, or ``None`` when there is nothing to change.
    """
    for _ in range(ATTEMPTS):
        loaded = load_current_tagged(store, agent_id)
        if loaded is None:
            raise NotFound(f"agent_id: {agent_id!r} has no policy")
        new = change(loaded.policy)
        if new is None:
            return Change(loaded.policy, False)
        materialise(store, loaded.policy)  # the version being replaced must not be lost with it
        try:
            return Change(publish(store, new, loaded.etag), True)
        except ConcurrencyConflict:
            continue
    raise ConcurrencyConflict(f"the policy of {agent_id!r} kept changing; try again")


def set_pinned(store: Store, agent_id: str, pinned: bool, reason: str = "") -> Change:
    """Pin (freeze learning) or unpin an agent's policy. Idempotent. An unpin records the version
    it resumes from (``unpinned_version``): a drift warning pins the agent again only on the
    evidence of the runs after it, not on the runs the operator has just seen."""

    def change(current: PolicyDocument) -> PolicyDocument | None:
        if current.pinned == pinned:
            return None
        if pinned:
            return current.model_copy(update={"pinned": True, "pin_reason": reason[:MAX_NOTE_CHARS]})
        return current.model_copy(update={"pinned": False, "pin_reason": "", "unpinned_version": current.version})

    return swap(store, agent_id, change)


def rollback(store: Store, agent_id: str, version: int, *, clock: Clock = SYSTEM_CLOCK, note: str = "") -> Change:
    """Publish version ``version``'s logits (and actions) as the next version. The learner state
    merges: an action the current version has keeps its evidence up to the current cursor (what
    was learned since ``version`` stays true), and an action that ``version`` has and the current
    version lacks (a revision dropped or renamed it) gets back the evidence ``version`` had for
    it; the change test's recent sums likewise. Repeating it changes nothing.

    It also repairs an agent whose current document is invalid (edited by hand, say), which
    stops its training and which no other intervention can read: the newest valid version
    record stands in for it (:func:`_stand_in`)."""
    raw = store.get_policy_version(agent_id, version)
    if raw is None:
        current = store.get_current_policy(agent_id)
        if current is None:
            raise NotFound(f"agent_id: {agent_id!r} has no policy")
        # Versions run from 1 (create_policy) to the current one: no need to read them all to say so.
        newest = current.doc.get("version") if isinstance(current.doc, dict) else "?"
        if newest == version:  # a crash left the current version unrecorded (the next run records it)
            raise ValueError(f"VERSION: v{version} is the current version of {agent_id!r}; nothing to roll back")
        if type(newest) is int and version < newest:
            raise NotFound(f"VERSION: the record of {agent_id!r} v{version} is missing (versions 1 to {newest}; "
                           f"agent-learn audit --agent-id {agent_id} checks them)")
        raise NotFound(f"VERSION: {agent_id!r} has no version {version} (versions 1 to {newest})")
    target = stored_policy(raw)

    def copy(current: PolicyDocument, next_version: int, from_: str) -> PolicyDocument:
        return adopted(current, target, next_version, "rollback", version, clock,
                       noted(f"rollback from {from_} to v{version}", note))

    def change(current: PolicyDocument) -> PolicyDocument | None:
        if current.source == "rollback" and current.parent_version == version:
            return None  # already rolled back to it
        if current.version == version:
            raise ValueError(f"VERSION: v{version} is the current version of {agent_id!r}; nothing to roll back")
        return copy(current, current.version + 1, f"v{current.version}")

    for _ in range(ATTEMPTS):
        try:
            return swap(store, agent_id, change)
        except StoredDocumentInvalid as problem:  # the current document, as swap read it
            tagged = store.get_current_policy(agent_id)
            if tagged is None:
                raise NotFound(f"agent_id: {agent_id!r} has no policy") from None
            try:  # only over the document read now: if it was fixed meanwhile, the swap takes it
                stored_policy(tagged.doc)
                continue
            except StoredDocumentInvalid:
                pass
            stand_in, next_version = _stand_in(store, agent_id, tagged.doc, target)
            new = copy(stand_in, next_version, f"an invalid current document (training resumes from "
                                               f"v{stand_in.version}'s cursor)")
            try:
                return Change(publish(store, new, tagged.etag), True, str(problem), stand_in.version)
            except ConcurrencyConflict:
                continue  # someone else wrote it meanwhile: read it again
    raise ConcurrencyConflict(f"the policy of {agent_id!r} kept changing; try again")


def adopted(current: PolicyDocument, target: PolicyDocument, next_version: int, source: str,
            parent_version: int | None, clock: Clock, note: str) -> PolicyDocument:
    """``current`` with ``target``'s actions, logits and settings as version ``next_version``:
    the training cursor stays, and the learner state merges as a rollback's does."""
    return current.model_copy(
        update={
            "version": next_version,
            "actions": list(target.actions),
            "learner_state": remap_state(
                current.learner_state, current.action_ids, target.action_ids, {},
                earlier=(target.learner_state, target.action_ids),
            ),
            "logits": list(target.logits),
            "temperature": target.temperature,
            "exploration_floor": target.exploration_floor,
            "dimensions": target.dimensions,
            "excluded": target.excluded,
            "features": target.features,
            "schema_version": target.schema_version,
            "source": source,
            "parent_version": parent_version,
            "run": None,
            "created_at": clock.now(),
            "note": note,
        }
    )


def import_policy(store: Store, agent_id: str, target: PolicyDocument, *, clock: Clock = SYSTEM_CLOCK,
                  note: str = "") -> Change:
    """Publish ``target``'s actions, logits and settings (a policy exported from this agent or
    another) as the agent's next version, ``source="import"``; the training cursor stays, as a
    rollback's does. Importing what the current version already is changes nothing."""
    same = ("actions", "logits", "temperature", "exploration_floor", "dimensions", "excluded", "features")

    def change(current: PolicyDocument) -> PolicyDocument | None:
        if all(getattr(current, k) == getattr(target, k) for k in same):
            return None
        return adopted(current, target, current.version + 1, "import", None, clock,
                       noted(f"imported over v{current.version}", note))

    return swap(store, agent_id, change)


def noted(text: str, note: str) -> str:
    """The note a new version stores: the intervention's own ``text``, then the operator's ``note``,
    within :data:`MAX_NOTE_CHARS`. Without a note, ``text`` is cut to fit; a note that does not fit
    after ``text`` is refused (``ValueError`` naming ``--note``) rather than cut unsaid."""
    if not note:
        return text[:MAX_NOTE_CHARS]
    room = MAX_NOTE_CHARS - len(text) - 2
    if len(note) > room:
        start = text if len(text) <= 60 else text[:57] + "..."
        raise ValueError(f"--note: is {len(note):,} characters; the version's note starts with {len(text) + 2:,} "
                         f"of its own ({start!r}), so at most {max(room, 0):,} of the {MAX_NOTE_CHARS:,} are left")
    return f"{text}: {note}"


def repair_hint(agent_id: str) -> str:
    """What repairs an agent whose current document is invalid (:func:`rollback`), for messages."""
    return f"`agent-learn policy rollback --agent-id {agent_id} VERSION` repairs it"


STAND_IN_RECORDS = 16
"""How many of the newest version records a rollback over an invalid current document reads to
find a valid one (a crash leaves at most one version unrecorded; a corrupted store, more)."""


def _stand_in(store: Store, agent_id: str, invalid: Any, target: PolicyDocument) -> tuple[PolicyDocument, int]:
    """What replaces an invalid current document: the newest valid version record (its logits,
    learner state and training cursor: when it is the version the invalid document holds, as
    after a hand edit, nothing is lost; when it is older, the scores the versions after it had
    learned are learned again from its cursor), or ``target`` if none of the newest
    :data:`STAND_IN_RECORDS` is valid, with the pin of the invalid document when that is
    readable; and the number the next version takes, past every version recorded and the one the
    invalid document holds if a crash left it unrecorded (agents may have logged episodes under
    any of them)."""
    records = store.list_policy_versions(agent_id, STAND_IN_RECORDS)
    valid = [target]
    for record_ in records:
        try:
            valid.append(stored_policy(record_))
        except InvalidDocument:
            continue
    newest = max(n for r in records if type(n := r.get("version")) is int)
    invalid = invalid if isinstance(invalid, dict) else {}  # a JSON list edited in by hand: no field readable
    if invalid.get("version") == newest + 1:
        newest += 1  # a version whose records a crash left unwritten; a number edited in is not taken
    pinned, reason = invalid.get("pinned"), invalid.get("pin_reason")
    stand_in = max(valid, key=lambda v: v.version).as_kind("current").model_copy(
        update={"pinned": pinned is True,
                "pin_reason": reason[:MAX_NOTE_CHARS] if pinned is True and isinstance(reason, str) else ""}
    )
    return stand_in, newest + 1


def revise(
    store: Store,
    agent_id: str,
    actions: list[Action],
    *,
    renames: dict[str, str] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    note: str = "",
) -> Change:
    """Publish ``actions`` as the agent's actions in a new version (module docstring: a revision).

    ``renames`` maps an old action id to its new id in ``actions``, an id the current version
    does not have. Repeating a revision changes nothing.
    """
    renames = dict(renames or {})
    new_ids = [a.id for a in actions]
    if not actions:
        raise ValueError("--actions: a policy needs at least one action")
    if len(set(new_ids)) != len(new_ids):
        raise ValueError(f"--actions: duplicate action ids {sorted({i for i in new_ids if new_ids.count(i) > 1})}")
    for old, new in renames.items():
        if new not in new_ids:
            raise ValueError(f"--rename: {old} {new}: {new!r} is not among the new actions")
        if old in new_ids:
            raise ValueError(f"--rename: {old} {new}: {old!r} is still among the new actions")
    targets = list(renames.values())
    for old, new in renames.items():
        if targets.count(new) > 1:
            others = [o for o, n in renames.items() if n == new and o != old]
            raise ValueError(f"--rename: {old} {new}: {others[0]} is renamed to {new!r} too; rename one action to it")

    def change(current: PolicyDocument) -> PolicyDocument | None:
        if current.structured:
            raise ValueError(
                f"--actions: {agent_id!r} has dimensions or context features; revising them is not supported: "
                "create a new agent with the new configuration and move traffic to it"
            )
        if list(current.actions) == list(actions):
            return None  # already these actions (a repeated revision: its renames are done)
        unknown = sorted(set(renames) - set(current.action_ids))
        if unknown:
            raise ValueError(f"--rename: {unknown} are not actions of {agent_id!r} (actions: {current.action_ids})")
        for old, new in renames.items():
            if new in current.action_ids:
                raise ValueError(
                    f"--rename: {old} {new}: {new!r} is already an action of {agent_id!r} v{current.version}, and "
                    f"a rename onto it would replace its logit and evidence with those of {old!r}; rename to a new "
                    f"id, or remove {new!r} in one revision and rename in the next"
                )
        source = {new: old for old, new in renames.items()}
        logit = dict(zip(current.action_ids, current.logits, strict=True))
        kept = [logit[source.get(i, i)] for i in new_ids if source.get(i, i) in logit]
        start = sum(kept) / len(kept) if kept else 0.0
        logits = [logit.get(source.get(i, i), start) for i in new_ids]
        mean = sum(logits) / len(logits)
        added = [i for i in new_ids if source.get(i, i) not in logit]
        removed = [i for i in current.action_ids if i not in new_ids and i not in renames]
        before = {a.id: a for a in current.actions}
        kept_as = [(before[source.get(a.id, a.id)], a) for a in actions if source.get(a.id, a.id) in before]
        reconfigured = [a.id for old, a in kept_as if old.config != a.config]
        redescribed = [a.id for old, a in kept_as if old.description != a.description]
        parts = [f"added {added}" if added else "", f"removed {removed}" if removed else "",
                 f"renamed {', '.join(f'{o}→{n}' for o, n in renames.items())}" if renames else "",
                 f"config changed for {reconfigured}" if reconfigured else "",
                 f"description changed for {redescribed}" if redescribed else ""]
        summary = "; ".join(p for p in parts if p) or "order changed"
        return current.model_copy(
            update={
                "version": current.version + 1,
                "actions": list(actions),
                "logits": [x - mean for x in logits],
                "learner_state": remap_state(current.learner_state, current.action_ids, new_ids, source),
                "source": "revise",
                "parent_version": current.version,
                "run": None,
                "created_at": clock.now(),
                "note": noted(f"revised actions: {summary}", note),
            }
        )

    return swap(store, agent_id, change)


def remap_state(
    state: dict,
    old_ids: list[str],
    new_ids: list[str],
    source: dict[str, str],
    earlier: tuple[dict | None, list[str]] | None = None,
) -> dict:
    """The learner state for another list of actions: every per-action list (one entry per old
    action), at the top or in a nested mapping such as the change test's recent sums, is
    reordered to ``new_ids`` (``source`` maps a new id to the old id it was renamed from). An
    action the old list lacks takes its entry from the same place in ``earlier`` (a state and its
    action ids: the version a rollback restores) when that has one, else 0, which is "no
    evidence" for every per-action quantity the learner keeps. Other entries are kept as they are."""
    position = {a: i for i, a in enumerate(old_ids)}
    earlier_state, earlier_ids = earlier if earlier is not None else (None, [])
    earlier_position = {a: i for i, a in enumerate(earlier_ids)}
    out = {}
    for key, value in state.items():
        back = (earlier_state or {}).get(key)
        if isinstance(value, dict):
            out[key] = remap_state(value, old_ids, new_ids, source,
                                   (back if isinstance(back, dict) else None, earlier_ids))
        elif isinstance(value, list) and len(value) == len(old_ids):
            if not (isinstance(back, list) and len(back) == len(earlier_ids)):
                back = None
            out[key] = [
                value[position[source.get(i, i)]] if source.get(i, i) in position
                else back[earlier_position[i]] if back is not None and i in earlier_position
                else 0.0
                for i in new_ids
            ]
        else:
            out[key] = value
    return out
