"""The books of learning: for each agent, where every episode it wrote is, rebuilt from the store.

The trainer records what it consumed as cursor ranges, not id lists: version v ≥ 2 that a
training run published consumed the agent's scores in ``(cursor_from, cursor_to]`` of the
``(seq, id)`` order, and counted them (``episodes`` + ``corrections`` + ``rejected`` + ``skipped`` rows).
The audit reads every score row of the agent once, in that order, and every run, and decides
for each episode the agent wrote:

``learned``
    its judges' score lies in exactly one consumed range, and that range holds no more rows
    than its run counted.
``learned_twice``
    its score lies in two or more consumed ranges (ranges overlap: the chain of versions is
    broken, a cursor went backwards).
``lost``
    written and in none of the other states: its score lies behind the current cursor but in
    no consumed range, or in a range that holds more rows than its run counted — a score that
    landed after the run read the range (a late write on Cosmos DB, see ``late_write``), which
    no run will ever read. Such surplus rows are charged to the range's rows marked
    ``late_write`` first, then to its judges' scores.
``pending``
    not scored yet (and not dead-lettered: ``pending_scoring``), or scored after the current
    cursor (``pending_training``): the next ticks take care of it.
``dead_lettered``
    not scored, and its scoring message is in the dead-letter queue (by reason). An episode
    that was dead-lettered and later scored (replayed) counts as scored.
``skipped``
    its judges' score lies in exactly one consumed range, but the version that range's run trained
    lacked its configuration (a ``policy revise`` removed or renamed it), so the run counted it in
    ``skipped`` and learned nothing from it; neither lost nor pending.
``unjudged``
    not scored because its agent's ``AGENT_LEARNING_JUDGING`` rule left it out: recorded in its
    score slot (by reason: ``sampled_out``, ``over_rate``), neither lost nor pending; it is
    learned only if it is judged later (``agent-learn rescore --unjudged``).
``rejected``
    not scored validly: its score document does not validate (``invalid_scores``), so training
    skips it for good (counted in its run's ``rejected``); neither lost nor pending.

Episodes of another incarnation of the agent (deleted and created again under its id since they
were written) are not the agent's episodes: ``other_incarnation`` counts their scoring messages
in the dead-letter queue (``IncarnationMismatch``) and any score of theirs, which training refuses.

Every episode is in exactly one of these states, so ``episodes = learned + learned_twice +
skipped + lost + pending + dead_lettered + unjudged + rejected``. Feedback is audited per
episode: ``feedback_unapplied`` counts scored episodes whose learned reward (judges' score +
correction deltas) is not what their stored feedback calls for (see
:func:`agent_learning.rewards.feedback.unapplied`); a sweep on the next tick applies it.
``pending_corrections`` counts the correction rows after the current cursor: the next tick
learns them. Versions and
runs are checked as a chain: versions 1..N without gaps, each published by training backed by a
run starting where the previous version's cursor was; anything else is listed in ``problems``.
Runs the publish guardrail held consumed nothing (their scores are learned by a later run) and
are only counted (``held_runs``). An audit is ``ok`` when nothing is lost or learned twice and
there are no problems.

Memory: the audit keeps a few sets of ids and one tuple per score row, streamed from the store.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import PolicyDocument, Score, ScoreCursor, TrainingRun
from agent_learning.pipeline import load_current, message_id_of
from agent_learning.pipeline.score import INCARNATION_MISMATCH
from agent_learning.policy.softmax import Layout
from agent_learning.queue.base import DeadLetter, WorkQueue
from agent_learning.rewards.feedback import unapplied
from agent_learning.store.base import Store

PAGE = 1_000
"""Score rows read per store call."""

VERSION_PAGE = 100
"""Policy version documents read per store call (each up to 64 KB)."""

DEAD_LETTER_LIMIT = 100_000
"""Most dead letters read from the queue (the audit says when it hit this)."""

Key = tuple[int, str]


@dataclass
class AgentAudit:
    """The books of one agent (see the module docstring for each state)."""

    agent_id: str
    episodes: int = 0
    scored: int = 0
    learned: int = 0
    learned_twice: int = 0
    skipped: int = 0
    """Consumed by a run whose version lacked the episode's configuration (a revision): not learned."""
    lost: int = 0
    pending: int = 0
    pending_scoring: int = 0
    pending_training: int = 0
    dead_lettered: int = 0
    dead_lettered_by_reason: dict[str, int] = field(default_factory=dict)
    unjudged: int = 0
    """Recorded unjudged by the agent's judging rule: not lost, not pending."""
    unjudged_by_reason: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    """Episodes whose score document is invalid: training skips it; not lost, not pending."""
    late: int = 0
    """Score rows (judges' scores or corrections) in consumed ranges beyond what their runs counted."""
    corrections: int = 0
    pending_corrections: int = 0
    """Feedback corrections scored after the current cursor: the next tick learns them."""
    feedback_episodes: int = 0
    """Episodes with stored feedback."""
    feedback_unapplied: int = 0
    invalid_scores: int = 0
    scores_without_episode: int = 0
    """Judges' scores whose episode is gone (expired by its TTL); not in ``episodes``."""
    other_incarnation: int = 0
    """Episodes of an earlier incarnation of the agent (deleted and created again since): scoring
    messages dead-lettered as ``IncarnationMismatch``, and judges' scores training refuses; not in
    ``episodes``, never learned."""
    versions: int = 0
    """Policy versions stored (an invalid document among them, named in ``problems``), and the
    current one if a crash left it unrecorded."""
    current_version: int | None = None
    runs: int = 0
    held_runs: int = 0
    """Candidates the publish guardrail held (their runs consumed nothing)."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.learned_twice == 0 and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass
class Audit:
    """The audit of every agent asked for."""

    agents: list[AgentAudit]
    dead_letters_read: bool = True
    """False when the queue could not list its dead letters (they then count as pending)."""
    notes: list[str] = field(default_factory=list)
    dead_letters: dict[str, dict[str, int]] = field(default_factory=dict)
    """Each queue read (scoring and training) → its dead letters by reason. A training dead letter
    loses nothing (the next tick asks for the agent's training again) and replaying it is safe."""

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.agents)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "dead_letters_read": self.dead_letters_read,
            "notes": list(self.notes),
            "dead_letters": {queue: dict(reasons) for queue, reasons in self.dead_letters.items()},
            "agents": {a.agent_id: a.to_dict() for a in self.agents},
        }


def audit(
    store: Store,
    queue: WorkQueue | None = None,
    agent_ids: Iterable[str] | None = None,
    *,
    train_queue: WorkQueue | None = None,
    seconds: float | None = None,
) -> Audit:
    """Audit ``agent_ids`` (every agent with a policy by default); ``queue`` (the scoring queue)
    supplies the episodes' dead letters; both queues' dead letters are counted by reason. With
    ``seconds``, no agent is started once that long has passed (an agent's audit reads all its
    scores): the agents left out are named in the notes, and have no book."""
    notes: list[str] = []
    counted: dict[str, dict[str, int]] = {}
    found = _dead_letters(queue, notes, counted)
    if queue is None:
        notes.append("no queue given: dead-lettered episodes count as pending")
    elif found is None:
        notes[-1] += "; they count as pending"
    _dead_letters(train_queue, notes, counted)
    letters = {d.message_id: d.reason for d in found or []}
    agents = list(agent_ids) if agent_ids is not None else store.list_agents()
    feedback = episodes_with_feedback(store)  # one pass over the feedback feed, for every agent
    earlier = Counter(d.properties.get("agent_id") for d in found or [] if d.reason == INCARNATION_MISMATCH)
    started, books = time.monotonic(), []
    for a in agents:
        if seconds is not None and books and time.monotonic() - started > seconds:
            left = agents[len(books):]
            named = ", ".join(left[:5]) + (", …" if len(left) > 5 else "")
            notes.append(f"{len(left):,} agent{'s' if len(left) > 1 else ''} not audited within {seconds:g} s "
                         f"({named}): `agent-learn audit` counts every agent")
            break
        books.append(audit_agent(store, a, letters, feedback.get(a, set()), other_incarnation=earlier[a]))
    return Audit(books, queue is not None and found is not None, notes, counted)


def _dead_letters(
    queue: WorkQueue | None, notes: list[str], counted: dict[str, dict[str, int]]
) -> list[DeadLetter] | None:
    """``queue``'s dead letters, counted by reason under its name in ``counted``; None when there
    is no queue or it cannot list them (said in ``notes``: the audit does not fail for it)."""
    if queue is None:
        return None
    name = queue.name
    try:
        found = queue.dead_letters(DEAD_LETTER_LIMIT)
    except Exception as exc:  # a queue that cannot list them: say so, do not fail the audit
        notes.append(f"dead letters of {name} could not be read ({type(exc).__name__}: {exc})")
        return None
    if len(found) >= DEAD_LETTER_LIMIT:
        notes.append(f"only the first {DEAD_LETTER_LIMIT} dead letters of {name} were read")
    counted[name] = dict(sorted(Counter(d.reason for d in found).items()))
    return found


def audit_agent(
    store: Store,
    agent_id: str,
    dead_letters: dict[str, str] | None = None,
    with_feedback: set[str] | None = None,
    *,
    lost: set[str] | None = None,
    other_incarnation: int = 0,
) -> AgentAudit:
    """The books of one agent. ``dead_letters`` maps message ids to dead-letter reasons;
    ``with_feedback`` is the agent's episodes with feedback (read from the store if not given);
    ``lost``, if given, receives the ids of the lost episodes; ``other_incarnation`` is how many
    dead letters are of the agent's earlier incarnations."""
    result = AgentAudit(agent_id, other_incarnation=other_incarnation)
    ranges, current, incarnation = _consumed_ranges(store, agent_id, result)
    by_low = sorted(ranges, key=lambda r: r.low)
    lows = [r.low for r in by_low]
    highs = sorted(r.high for r in ranges)
    cursor = max((r.high for r in ranges), default=None)
    if current is not None:
        cursor = current if cursor is None else max(cursor, current)

    # One pass over the agent's score rows, in the trainer's order.
    # (key, revision, late_write, episode id, action id, of another incarnation)
    rows: list[tuple[Key, int, bool, str, str, bool]] = []
    invalid: set[str] = set()  # episode ids named by invalid score documents
    after = None
    while True:
        page = store.read_scores(agent_id, after, PAGE, settled=False)
        for row in page:
            key = (int(row["seq"]), str(row["id"]))
            try:
                score = Score.from_dict(row)
            except InvalidDocument:
                result.invalid_scores += 1
                rows.append((key, -1, False, "", "", False))
                if isinstance(row.get("episode_id"), str):
                    invalid.add(row["episode_id"])
                continue
            other = incarnation is not UNKNOWN and score.incarnation != incarnation
            rows.append((key, score.revision, score.late_write, score.episode_id, score.action_id, other))
        if len(page) < PAGE:
            break
        after = ScoreCursor.of_row(page[-1])

    # Surplus rows per range (scores that landed after the run read it), charged to late
    # writes first, then to judges' scores, then to anything else.
    keys = [row[0] for row in rows]  # sorted: read_scores returns the trainer's order
    unlearned: set[Key] = set()
    for r in ranges:
        inside = rows[bisect_right(keys, r.low) : bisect_right(keys, r.high)]
        counted = r.counted
        if r.corrections_unknown:  # a run from before runs counted their corrections
            counted += sum(1 for row in inside if row[1] > 0)
        surplus = len(inside) - counted
        if surplus < 0:
            result.problems.append(
                f"the run of v{r.version} counted {counted} score rows but its range holds {len(inside)}"
            )
        elif surplus:
            result.late += surplus
            ranked = sorted(inside, key=lambda row: (not row[2], row[1] != 0))
            unlearned.update(row[0] for row in ranked[:surplus])

    episodes = set(store.episode_ids(agent_id))
    result.episodes = len(episodes)
    scored: set[str] = set()
    for key, revision, _late, episode_id, action_id, other in rows:
        if revision != 0:
            result.corrections += revision > 0
            result.pending_corrections += revision > 0 and (cursor is None or key > cursor)
            continue
        if other:
            result.other_incarnation += 1
            continue
        if episode_id not in episodes:
            result.scores_without_episode += 1
            continue
        scored.add(episode_id)
        covered = bisect_left(lows, key) - bisect_left(highs, key)  # ranges with low < key <= high
        if cursor is None or key > cursor:
            result.pending_training += 1
        elif covered == 0 or key in unlearned:
            result.lost += 1
            if lost is not None:
                lost.add(episode_id)
        elif covered == 1:
            i = bisect_left(lows, key)
            trained = next(r for r in reversed(by_low[:i]) if key <= r.high)
            if trained.knows is None or trained.knows(action_id):
                result.learned += 1
            else:
                result.skipped += 1
        else:
            result.learned_twice += 1
    result.scored = len(scored)

    unjudged = unjudged_reasons(store, agent_id)
    left_out: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for episode_id in episodes - scored:
        if episode_id in unjudged:
            left_out[unjudged[episode_id]] += 1
            continue
        if episode_id in invalid:
            result.rejected += 1
            continue
        reason = (dead_letters or {}).get(message_id_of(episode_id))
        if reason is None:
            result.pending_scoring += 1
        else:
            reasons[reason] += 1
    result.dead_lettered = sum(reasons.values())
    result.dead_lettered_by_reason = dict(sorted(reasons.items()))
    result.unjudged = sum(left_out.values())
    result.unjudged_by_reason = dict(sorted(left_out.items()))
    result.pending = result.pending_scoring + result.pending_training
    if with_feedback is None:
        with_feedback = episodes_with_feedback(store).get(agent_id, set())
    _audit_feedback(store, scored, with_feedback, result)
    return result


@dataclass(frozen=True)
class _Range:
    version: int
    low: Key
    high: Key
    counted: int
    """Rows the run says it consumed."""
    corrections_unknown: bool
    """The run counted no corrections: it may predate ``TrainingRun.corrections``, so the
    range's correction rows are taken as consumed (a late correction there goes unnoticed)."""
    knows: Callable[[str], bool] | None
    """Whether the version the run trained has a configuration (None: unknown, taken as yes)."""


class _Link(NamedTuple):
    """A version's place in the chain: what the audit keeps of its document."""

    version: int
    source: str
    cursor: ScoreCursor | None
    run: TrainingRun | None
    knows: Callable[[str], bool] | None
    """Whether the version has a configuration, as training parses it (None: not known)."""

    @classmethod
    def of(cls, doc: PolicyDocument, known: dict[Any, Callable[[str], bool]]) -> _Link:
        """The link of ``doc``; ``known`` holds one ``knows`` per distinct set of configurations."""
        shape = (tuple(doc.action_ids), tuple((d.name, d.size) for d in doc.dimensions or []))
        if shape not in known:
            parse = Layout.of(doc).parse
            known[shape] = lambda action_id: parse(action_id) is not None
        return cls(doc.version, doc.source, doc.cursor, doc.run, known[shape])


UNKNOWN = object()
"""The incarnation of an agent whose current policy document is missing or invalid."""


def _consumed_ranges(store: Store, agent_id: str, result: AgentAudit) -> tuple[list[_Range], Key | None, Any]:
    """The score ranges the published versions consumed, the current cursor and incarnation
    (:data:`UNKNOWN` without a valid current document), with the chain's problems noted."""
    versions: list[_Link] = []
    known: dict[Any, Callable[[str], bool]] = {}
    invalid: set[int] = set()  # versions whose documents are invalid (named as such, not as missing)
    stored = [v for v, _ in store.policy_version_times(agent_id)]
    for i in range(0, len(stored), VERSION_PAGE):  # a page of documents at a time, kept as links
        page = stored[i : i + VERSION_PAGE]
        for raw in store.list_policy_versions(agent_id, between=(page[0], page[-1])):
            try:
                versions.append(_Link.of(PolicyDocument.from_dict(raw), known))
            except InvalidDocument as exc:
                result.problems.append(f"version {raw.get('id')!r} is invalid: {exc}")
                if type(number := raw.get("version")) is int:
                    invalid.add(number)
    current = None
    try:
        current = load_current(store, agent_id)
        if current is None:
            result.problems.append("the agent has no current policy")
    except InvalidDocument as exc:
        result.problems.append(f"the current policy document is invalid: {exc}")
    numbers = [v.version for v in versions]
    if current is not None:
        result.current_version = current.version
        if current.version not in numbers:
            # A trainer crashed between its swap and the records: the next tick writes them.
            versions.append(_Link.of(current, known))
            numbers.append(current.version)
    versions.sort(key=lambda v: v.version)
    numbers = [v.version for v in versions]
    result.versions = len(set(numbers) | invalid)
    if numbers and numbers != list(range(1, numbers[-1] + 1)):
        missing = sorted(set(range(1, numbers[-1] + 1)) - set(numbers) - invalid)
        if missing:
            result.problems.append(f"versions {missing} are missing")

    runs: dict[int, TrainingRun] = {}
    for raw in store.list_runs(agent_id, 1_000_000):
        try:
            run = TrainingRun.from_dict(raw)
        except InvalidDocument as exc:
            result.problems.append(f"run {raw.get('id')!r} is invalid: {exc}")
            continue
        if run.held:
            result.held_runs += 1
            continue
        runs[run.policy_version] = run
    result.runs = len(runs)
    # A trained version whose document is invalid still consumed its run's range: its scores
    # were learned, not lost.
    recovered = [
        _Link(v, "train", runs[v].cursor_to, runs[v], None) for v in sorted(invalid - set(numbers)) if v in runs
    ]
    if recovered:
        versions = sorted([*versions, *recovered], key=lambda v: v.version)
        numbers = [v.version for v in versions]

    ranges: list[_Range] = []
    previous: _Link | None = None
    for version in versions:
        run = version.run or runs.get(version.version)
        if version.source == "train":
            if run is None:
                result.problems.append(f"v{version.version} was trained but has no run record")
            elif previous is not None and (run.base_version != previous.version or run.cursor_from != previous.cursor):
                result.problems.append(
                    f"the run of v{version.version} starts at v{run.base_version}'s cursor {_fmt(run.cursor_from)}, "
                    f"not at v{previous.version}'s {_fmt(previous.cursor)}"
                )
        elif previous is not None and version.cursor != previous.cursor:
            result.problems.append(f"v{version.version} ({version.source}) moved the cursor without a run")
        if run is not None and version.source == "train":
            low = (run.cursor_from.seq, run.cursor_from.id) if run.cursor_from else (-1, "")
            high = (run.cursor_to.seq, run.cursor_to.id)
            if high < low:
                result.problems.append(f"the run of v{version.version} ends before it starts")
            counted = run.episodes + run.corrections + run.rejected + (run.skipped or 0)
            base = previous.knows if previous is not None else None
            ranges.append(_Range(version.version, low, high, counted, run.corrections == 0, base))
        previous = version
    orphans = sorted(set(runs) - set(numbers))
    if orphans:
        result.problems.append(f"runs for versions {orphans} that were never published")
    cursor = None if current is None or current.cursor is None else (current.cursor.seq, current.cursor.id)
    return ranges, cursor, UNKNOWN if current is None else current.incarnation


def unjudged_reasons(store: Store, agent_id: str) -> dict[str, str]:
    """The agent's episodes recorded unjudged, each with why, read page by page."""
    found: dict[str, str] = {}
    after = None
    while page := store.list_unjudged(agent_id, after, PAGE):
        for row in page:
            found[str(row["id"])] = str(row.get("reason"))
        after = str(page[-1]["id"])
        if len(page) < PAGE:
            break
    return found


def episodes_with_feedback(store: Store) -> dict[str, set[str]]:
    """Agent id → its episodes with stored feedback, from one pass over the feedback feed."""
    found: dict[str, set[str]] = {}
    continuation = None
    while True:
        page = store.read_feedback_changes(continuation, PAGE)
        for doc in page.items:
            agent_id, episode_id = doc.get("agent_id"), doc.get("episode_id")
            if isinstance(agent_id, str) and isinstance(episode_id, str):
                found.setdefault(agent_id, set()).add(episode_id)
        if not page.items or page.continuation in (None, continuation):
            return found
        continuation = page.continuation


def _audit_feedback(store: Store, scored: set[str], with_feedback: set[str], result: AgentAudit) -> None:
    """Episodes with feedback, and how many of the scored ones do not have it applied yet."""
    result.feedback_episodes = len(with_feedback)
    for episode_id in sorted(with_feedback & scored):
        raw = store.get_score(episode_id, result.agent_id)
        try:
            base = Score.from_dict(raw)
        except InvalidDocument:
            continue
        if unapplied(store, base):
            result.feedback_unapplied += 1


def _fmt(cursor: Any) -> str:
    return "start" if cursor is None else f"({cursor.seq}, {cursor.id})"
