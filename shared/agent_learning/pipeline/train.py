"""Train: fold an agent's new scores into its policy and publish the next version.

The current policy document holds the logits and the cursor of the last score folded into
them; a run reads the scores after that cursor and publishes the next version with one
compare-and-swap on the document's ETag (:func:`~agent_learning.pipeline.publish.publish`). A
second trainer (or a replay) that read the same version loses the swap and changes nothing,
so every score is learned from exactly once. Version and run records are written after the
swap and re-created from the current document if a crash interrupted that.

One run, step by step (:func:`_train_agent`): load the current document, :func:`collect` the
score rows after its cursor, :func:`learn` from them, :func:`next_version` builds the new
document with its :class:`~agent_learning.documents.TrainingRun`, the publish guardrail
evaluates it against the current version on the batch's episodes
(:func:`agent_learning.evaluation.review`), and it is published — or, when the guardrail holds
it, only its run is recorded (``status="held"``): nothing is consumed, the current version and
cursor stay, and the next run learns the same scores again with the newer ones. After a
published version, :func:`train_agent` reviews it for drift warnings and pins the agent when
the drift settings ask for it.
"""

from __future__ import annotations

import logging
import math
import weakref
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any, Literal

from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument, TransientError
from agent_learning.core.telemetry import MEAN_REWARD, POLICY_ENTROPY, SPAN_TRAIN, TRAINING_RUNS, count, record, span
from agent_learning.documents import (
    MAX_TRAIN_BATCH,
    TRAIN_BATCH,
    Action,
    ActionFeature,
    Candidate,
    ContextFeature,
    Interaction,
    Measures,
    PolicyDocument,
    Rejected,
    Score,
    ScoreCursor,
    TrainingRun,
    held_run_doc_id,
    run_doc_id,
)
from agent_learning.pipeline.drift import DriftConfig, review
from agent_learning.pipeline.publish import (
    load_current,
    load_current_tagged,
    materialise,
    publish,
    repair_hint,
    set_pinned,
)
from agent_learning.pipeline.score import other_incarnation
from agent_learning.policy.softmax import Layout, policy_choices, policy_probabilities, served_entropy
from agent_learning.rewards.feedback import TOLERANCE
from agent_learning.store.base import RawDoc, Store

log = logging.getLogger(__name__)
_held_said: weakref.WeakKeyDictionary[Store, dict[str, str]] = weakref.WeakKeyDictionary()
"""Per store, agent id → the held run this process logged last: holding the same batch again
(nothing new since, a tick later) is logged at DEBUG, not as a new warning every tick."""


@dataclass(frozen=True)
class TrainOutcome:
    """The result of :func:`train_agent`."""

    status: Literal[
        "published",
        "held",
        "no_new_scores",
        "too_few_scores",
        "pinned",
        "lost_race",
        "no_policy",
        "invalid_policy",
        "unavailable",
        "failed",
    ]
    """``held``: the publish guardrail held the candidate (``run`` is the held run, ``reason`` why);
    ``lost_race``: another writer replaced the document the run read, and the run changed nothing;
    ``published`` with a ``reason``: the guardrail in ``warn`` mode found the candidate worse;
    ``invalid_policy``: the current document does not validate (an operator must fix it);
    ``unavailable``: the store (or another dependency) failed transiently, the next tick retries;
    ``failed``: anything else went wrong (``reason`` names the exception)."""
    agent_id: str
    version: int | None = None
    """The agent's current version after the run: the one it published, or the one that stays
    (after a ``lost_race``, the winner's); ``None`` when unknown (no policy, or the run failed)."""
    run: TrainingRun | None = None
    reason: str = ""
    probabilities: list[float] | None = None
    """π of the published version (exploration floor included; a structured policy's with no context)."""
    choices: int | None = None
    """How many configurations ``probabilities`` choose among (:func:`~agent_learning.policy.policy_choices`)."""
    entropy: float | None = None
    """The published version's entropy as the batch's requests draw from it, averaged over them
    (:func:`~agent_learning.policy.served_entropy`: a contextual policy's per segment)."""


def train_agent(
    agent_id: str,
    store: Store,
    learner: Any,
    *,
    clock: Clock = SYSTEM_CLOCK,
    max_batch: int = TRAIN_BATCH,
    min_batch: int = 1,
    drift: DriftConfig | None = None,
    guardrail: Any = None,
) -> TrainOutcome:
    """Fold an agent's new scores into its policy and publish the next version.

    A run reads at most ``max_batch`` score rows after the cursor. While some but fewer than
    ``min_batch`` of them are new episodes it waits (``too_few_scores``), unless the page is
    full: then more rows wait behind it, and what was read is learned, so that feedback
    corrections never block the episodes behind them. Feedback corrections without new
    episodes are learned at once (:meth:`Collected.waits`). An episode's corrections in one batch
    enter the update as one row, their net reward change (none if it nets to zero).

    ``learner`` is a :class:`~agent_learning.learning.reinforce.Reinforce` (imported by the caller, so
    that importing this module does not import numpy). ``drift`` turns on the warnings of
    :mod:`agent_learning.pipeline.drift`; with its ``auto_pin`` a warning pins the agent's policy (a review
    that fails is logged, and the outcome stays ``published``).
    ``guardrail`` (an :class:`~agent_learning.evaluation.GuardrailConfig`; ``None``: none)
    evaluates each candidate before it is published.
    """
    if not 1 <= max_batch <= MAX_TRAIN_BATCH:
        raise ValueError(f"max_batch: {max_batch} is not between 1 and {MAX_TRAIN_BATCH} (MAX_TRAIN_BATCH)")
    with span(SPAN_TRAIN, {"agent_id": agent_id}) as sp:
        outcome = _train_agent(agent_id, store, learner, clock, max_batch, min_batch, guardrail)
        sp.set_attribute("status", outcome.status)
        count(TRAINING_RUNS, 1, {"agent_id": agent_id, "status": outcome.status})
        if outcome.status == "published" and outcome.run is not None and outcome.entropy is not None:
            attrs = {"agent_id": agent_id}
            sp.set_attribute("version", outcome.version or 0)
            if outcome.run.episodes:
                record(MEAN_REWARD, outcome.run.metrics["mean_reward"], attrs)
            record(POLICY_ENTROPY, outcome.entropy, attrs)
            if drift is not None:
                try:
                    review_published(store, agent_id, outcome, drift, sp)
                except Exception as exc:  # the version is published: the outcome must say so
                    log.error("training %s: v%s is published, but its drift review failed: %s: %s", agent_id,
                              outcome.version, type(exc).__name__, exc, exc_info=not isinstance(exc, TransientError))
        return outcome


def review_published(store: Store, agent_id: str, outcome: TrainOutcome, drift: DriftConfig, sp: Any) -> None:
    """Review a published version for drift warnings, and pin the agent if they ask for it (on the
    evidence of the runs after an operator's unpin, if there was one)."""
    unpinned = None
    if drift.auto_pin:
        current = load_current_tagged(store, agent_id)
        unpinned = current.policy.unpinned_version if current is not None else None
    warnings = review(store, agent_id, outcome.version or 0, outcome.entropy or 0.0, outcome.choices or 1, drift, sp,
                      pin_after=unpinned)
    if warnings and drift.auto_pin:
        set_pinned(store, agent_id, True, reason="; ".join(w.message for w in warnings))
        log.warning("policy of %s pinned automatically; unpin with `agent-learn policy unpin`", agent_id)


def _train_agent(
    agent_id: str, store: Store, learner: Any, clock: Clock, max_batch: int, min_batch: int, guardrail: Any
) -> TrainOutcome:
    started = clock.now()
    try:
        loaded = load_current_tagged(store, agent_id)
    except InvalidDocument as exc:
        return invalid_policy(agent_id, str(exc))
    if loaded is None:
        return TrainOutcome("no_policy", agent_id, reason="the agent has no current policy")
    current = loaded.policy
    materialise(store, current)
    if current.pinned:
        return TrainOutcome("pinned", agent_id, current.version, reason=paused(current.pin_reason))

    rows = store.read_scores(agent_id, current.cursor, max_batch)
    if not rows:
        return TrainOutcome("no_new_scores", agent_id, current.version)
    page_full = len(rows) >= max_batch
    if page_full and guardrail is not None:
        # No halved page smaller than the guardrail can evaluate: it would be held, or (before) published unjudged.
        smallest = max(min_batch, math.ceil(guardrail.min_effective_samples))
        rows = _past_held_pages(store, agent_id, current.version, rows, smallest)
    batch = collect(agent_id, rows, current)
    if batch.waits(min_batch, page_full=page_full):
        return TrainOutcome(
            "too_few_scores",
            agent_id,
            current.version,
            reason=f"{batch.episodes} new scores and {batch.corrections} feedback corrections; "
            f"training waits for {min_batch} new scores",
        )
    update = learn(learner, current, batch)
    cursor_to = ScoreCursor.of_row(rows[-1])
    new = next_version(current, learner, update, batch, cursor_to, started, clock.now())
    if guardrail is not None:
        new, held = _guard(guardrail, current, new, batch)
        if held is not None:
            store.put_run(held)
            said = _held_said.setdefault(store, {})
            again = said.get(agent_id) == held.id  # the same batch held at the tick before: no news
            said[agent_id] = held.id
            log.log(
                logging.DEBUG if again else logging.WARNING,
                "training %s: candidate v%d held, v%d stays: %s",
                agent_id,
                current.version + 1,
                current.version,
                held.evaluation.reason if held.evaluation else "",
            )
            return TrainOutcome(
                "held", agent_id, current.version, held, reason=held.evaluation.reason if held.evaluation else ""
            )
    try:
        new = publish(store, new, loaded.etag)
    except ConcurrencyConflict:
        return lost_race(store, agent_id, current.version)
    evaluation = new.run.evaluation if new.run is not None else None
    warned = evaluation.reason if evaluation is not None and evaluation.verdict == "warned" else ""
    return TrainOutcome("published", agent_id, new.version, new.run, reason=warned,
                        probabilities=policy_probabilities(new), choices=policy_choices(new),
                        entropy=served_entropy(new, batch.contexts[: batch.episodes]))


def lost_race(store: Store, agent_id: str, base: int) -> TrainOutcome:
    """The outcome of a run whose swap another writer (a second trainer, a rollback, a pin) won
    after the run read v``base``: nothing was published; ``version`` is the one current now (one
    point read; ``None`` if it cannot be read)."""
    try:
        now = load_current(store, agent_id)
    except (InvalidDocument, TransientError):
        now = None
    reason = f"another writer replaced v{base} while this run trained from it; this run published nothing"
    return TrainOutcome("lost_race", agent_id, now.version if now is not None else None, reason=reason)


def invalid_policy(agent_id: str, problem: str) -> TrainOutcome:
    """The outcome of an agent whose current document does not validate (``problem``), logged as
    an error: no run trains it until ``agent-learn policy rollback`` repairs the document."""
    reason = f"{problem}; {repair_hint(agent_id)}"
    log.error("not training %s: its current policy document is invalid: %s", agent_id, reason)
    return TrainOutcome("invalid_policy", agent_id, reason=reason)


def paused(pin_reason: str) -> str:
    """The reason a pinned agent is not trained."""
    return "learning is paused for this agent" + (f": {pin_reason}" if pin_reason else "")


HELD_PAGE_HALVINGS = 3
"""How many times a full page is halved for the next run when the guardrail held the candidate
learned from it (down to an eighth, and never below ``AGENT_LEARNING_TRAIN_MIN_BATCH`` scores nor below
the guardrail's ``min_effective_samples``, the fewest episodes it can evaluate).
Behind a full page the same rows come back at every run, so the same candidate would get the same
verdict for as long as the backlog keeps the page full, and a sound candidate wrongly held (at
most 2.5% of them) would stop the agent's learning. Each half is a new candidate on fewer scores;
a persistent problem is held at every size (and a page too small to evaluate is never published unjudged)."""


def _past_held_pages(store: Store, agent_id: str, version: int, rows: list[RawDoc], min_batch: int) -> list[RawDoc]:
    """``rows`` (a full page), or its first half, quarter or eighth when the candidate of every
    larger one was held already (its held run's record is there: one point read per size); never
    fewer than ``min_batch`` rows (the fewest new scores worth a run, and the fewest the guardrail evaluates)."""
    size, floor = len(rows), max(len(rows) >> HELD_PAGE_HALVINGS, min_batch, 1)
    while size // 2 >= floor:
        last = rows[size - 1]
        if store.get_run(held_run_doc_id(agent_id, version, ScoreCursor.of_row(last))) is None:
            break
        size //= 2
    if size < len(rows):
        log.info("training %s: the candidate of a full page of %d scores was held before (and of each page "
                 "between); learning from the first %d", agent_id, len(rows), size)
    return rows[:size]


def _guard(
    guardrail: Any, current: PolicyDocument, new: PolicyDocument, batch: Collected
) -> tuple[PolicyDocument, TrainingRun | None]:
    """``new`` with the guardrail's evaluation on its run (shrunk towards ``current`` when the guardrail
    shrank it), and the held run if it is held.

    A shrunk version keeps the candidate's learner state. That state is evidence about the world, not
    about the logits: per action (and segment) the faded counts and reward sums of the episodes up to
    the version's cursor, and the moments of numeric features not fitted yet (a feature fitted by the
    candidate keeps its centre and scale when shrunk, :func:`~agent_learning.evaluation.toward`). The
    shrunk version consumes the same batch as the candidate, so the current version's state would lose
    those episodes for good; with the candidate's, each is counted once. The next run starts from the
    shrunk logits with that evidence, so its bounds may propose the rest of the step again, and the
    guardrail judges it on the new episodes."""
    from agent_learning.evaluation import review  # numpy, like the learner: only where training runs

    n = batch.episodes  # corrections are reward changes, not episodes: they are not evaluated
    reviewed = review(
        guardrail,
        current,
        new,
        batch.actions[:n],
        batch.rewards[:n],
        batch.probabilities[:n],
        batch.contexts[:n],
        batch.measures,
        batch.candidates[:n] if any(batch.candidates) else None,
    )
    if reviewed is None or new.run is None:
        return new, None
    evaluation, new = reviewed
    assert new.run is not None
    run = new.run.model_copy(update={"evaluation": evaluation})
    if evaluation.verdict == "warned":
        log.warning("training %s: v%d published although %s", new.agent_id, new.version, evaluation.reason)
    if evaluation.verdict == "shrunk":
        log.info("training %s: v%d %s", new.agent_id, new.version, evaluation.reason)
        new = new.model_copy(update={"note": f"{new.note}; its step shrunk to {evaluation.step:g} by the guardrail"})
    if evaluation.verdict != "held":
        return new.model_copy(update={"run": run}), None
    assert new.cursor is not None
    held = run.model_copy(
        update={
            "id": held_run_doc_id(new.agent_id, current.version, new.cursor),
            "policy_version": current.version,
            "status": "held",
        }
    )
    return new, held


@dataclass
class Collected:
    """A page of score rows sorted into what the learner takes: one row per new episode, then
    one per corrected episode with its net reward change (``flags`` marks those)."""

    actions: list[Any] = field(default_factory=list)
    """Action indices (flat policies) or per-dimension value indices (structured ones)."""
    rewards: array[float] = field(default_factory=lambda: array("d"))
    """Each row's reward (new episodes) or net reward change (corrections): unboxed as each score is
    read, so that the learner takes the column without reading a float object per row."""
    probabilities: array[float] = field(default_factory=lambda: array("d"))
    """Each row's logged probability, as ``rewards``."""
    flags: list[bool] = field(default_factory=list)
    contexts: list[dict[str, Any] | None] = field(default_factory=list)
    """Each row's context (structured policies learn from it)."""
    candidates: list[list[Candidate] | None] = field(default_factory=list)
    """Each row's candidates, the actions its request offered (None: the policy's own); a row with
    candidates has as its action the chosen one's position among them."""
    measures: list[Measures | None] = field(default_factory=list)
    """Each new episode's latency, tool outcomes and tokens (the guardrail's metrics)."""
    learned: list[float] = field(default_factory=list)
    """Each new episode's reward with the feedback learned in the same batch: what the run reports."""
    episodes: int = 0
    """New episodes (rows of revision 0)."""
    corrections: int = 0
    """Feedback correction rows read (their episodes enter as one row each, netted)."""
    rejected: list[Rejected] = field(default_factory=list)
    """Rows that do not validate: not learned, counted in the run."""
    skipped: list[Rejected] = field(default_factory=list)
    """Valid scores of actions the current policy no longer has (``agent-learn policy revise``
    removed or renamed them): not learned (the policy never draws them, so their importance
    weight is 0), counted in the run."""

    def waits(self, min_batch: int, *, page_full: bool) -> bool:
        """Whether training waits for more new episodes: while there are some, but fewer than
        ``min_batch`` (the feedback corrections among them wait with them), and nothing is queued
        behind them (a full page). Feedback corrections alone never wait: with no new traffic
        they would never be learned."""
        return bool(
            0 < self.episodes < min_batch
            and not self.rejected
            and not self.skipped
            and not page_full
        )


def collect(agent_id: str, rows: Sequence[RawDoc], policy: PolicyDocument | Sequence[str]) -> Collected:
    """Validate ``rows`` and sort them into a :class:`Collected` batch for ``policy`` (the current
    document, or a flat policy's action ids).

    One row per corrected episode, with the net change of its reward: the learner's step grows
    with its rows, and feedback that nets to zero (a thumb toggled back) must change nothing.
    """
    if isinstance(policy, PolicyDocument):
        parse: Callable[[str], Any] = cache(Layout.of(policy).parse)  # one tuple per configuration, shared
    else:
        parse = {a: (i,) for i, a in enumerate(policy)}.get
    out = Collected()
    new_ids: list[str] = []
    corrected: dict[str, tuple[Any, float, float, Any, Any]] = {}  # episode id → (action, probability, net delta,
    # context, candidates)
    for row in rows:
        try:
            score = Score.from_dict(row)
            if score.agent_id != agent_id:
                raise InvalidDocument("score", [("agent_id", f"{score.agent_id!r} is not {agent_id!r}")])
            if isinstance(policy, PolicyDocument) and score.incarnation != policy.incarnation:
                why = other_incarnation(f"score {score.id!r}", score.incarnation, policy.incarnation, agent_id)
                raise InvalidDocument("score", [("incarnation", why)])
        except InvalidDocument as exc:
            out.rejected.append(Rejected(id=str(row.get("id")), error=str(exc)[:4000]))
            continue
        action = parse(score.action_id) if score.candidates is None else (
            [c.id for c in score.candidates].index(score.action_id),)  # the score checked it is one of them
        if action is None:
            out.skipped.append(
                Rejected(
                    id=score.id,
                    error=f"action {score.action_id!r} is not in the current policy (a revision removed or renamed it)",
                )
            )
            continue
        if score.is_correction:
            out.corrections += 1
            _, _, net, _, _ = corrected.get(score.episode_id, (0, 0.0, 0.0, None, None))
            delta = net + (score.reward_delta or 0.0)
            corrected[score.episode_id] = (action, score.probability, delta, score.context, score.candidates)
            continue
        out.actions.append(action)
        out.rewards.append(score.reward)
        new_ids.append(score.episode_id)
        out.probabilities.append(score.probability)
        out.contexts.append(score.context)
        out.candidates.append(score.candidates)
        out.measures.append(score.measures)
    if out.skipped:
        log.info("training %s: %d scores of actions a revision removed are not learned", agent_id, len(out.skipped))
    if out.rejected:
        log.error(
            "training %s: %d invalid score documents skipped (first: %s)",
            agent_id,
            len(out.rejected),
            out.rejected[0].error,
        )
    out.episodes = len(out.actions)
    out.learned = [r + corrected[e][2] if e in corrected else r for r, e in zip(out.rewards, new_ids, strict=True)]
    for action, probability, net, context, candidates in corrected.values():
        if abs(net) > TOLERANCE:
            out.actions.append(action)
            out.rewards.append(net)
            out.probabilities.append(probability)
            out.contexts.append(context)
            out.candidates.append(candidates)
    out.flags = [False] * out.episodes + [True] * (len(out.actions) - out.episodes)
    return out


def learn(learner: Any, current: PolicyDocument, batch: Collected) -> Any:
    """One learner update of ``current`` on ``batch`` (a :class:`~agent_learning.learning.reinforce.Update`)."""
    # numpy only where training runs: enqueueing and scoring import this package without it.
    from agent_learning.learning.reinforce import Rows

    offered = batch.candidates if any(batch.candidates) else None
    rows = Rows(batch.actions, batch.rewards, batch.probabilities, batch.flags, batch.contexts, offered)
    update = learner.learn(current, rows)
    _warn_state_reset(update, current)
    return update


def _warn_state_reset(update: Any, current: PolicyDocument) -> None:
    if update.metrics.get("state_reset"):
        log.warning(
            "training %s: the learner state of v%d was unusable; its evidence restarts",
            current.agent_id,
            current.version,
        )
    elif update.metrics.get("recent_reset"):
        log.warning(
            "training %s: the change test's recent evidence in the learner state of v%d was unusable; it restarts",
            current.agent_id,
            current.version,
        )


def next_version(
    current: PolicyDocument,
    learner: Any,
    update: Any,
    batch: Collected,
    cursor_to: ScoreCursor,
    started: datetime,
    finished: datetime,
) -> PolicyDocument:
    """The document that publishes ``update`` as the version after ``current``, with its run."""
    new_version = current.version + 1
    run = TrainingRun(
        id=run_doc_id(current.agent_id, new_version),
        agent_id=current.agent_id,
        base_version=current.version,
        policy_version=new_version,
        cursor_from=current.cursor,
        cursor_to=cursor_to,
        episodes=batch.episodes,
        corrections=batch.corrections,
        rejected=len(batch.rejected),
        rejected_samples=batch.rejected[:20],
        skipped=len(batch.skipped) or None,
        metrics={**update.metrics, **learned_reward(batch)},
        learner={"name": getattr(learner, "name", type(learner).__name__), **learner.config.to_dict()},
        started_at=started,
        finished_at=finished,
    )
    note = f"trained on {batch.episodes} episodes"
    if batch.corrections:
        note += f" and {batch.corrections} feedback corrections"
    if batch.rejected:
        note += f", rejected {len(batch.rejected)} invalid"
    if batch.skipped:
        note += f", skipped {len(batch.skipped)} of removed actions"
    fields = update.fields()
    for name, kind in (("features", ContextFeature), ("actions", Action), ("action_features", ActionFeature),
                       ("interactions", Interaction)):
        if name in fields:
            fields[name] = [kind.model_validate(x) for x in fields[name]]
    return current.model_copy(
        update={
            "version": new_version,
            **fields,
            "source": "train",
            "parent_version": current.version,
            "cursor": cursor_to,
            "run": run,
            "created_at": finished,
            "note": note,
            "learner_state": update.state,
        }
    )


def learned_reward(batch: Collected) -> dict[str, float]:
    """The run's ``mean_reward`` and ``episode_reward_std``: of its new episodes' rewards with the
    feedback learned in the same batch (the learner's own are of the judges' scores alone)."""
    if not batch.learned:
        return {}
    n = len(batch.learned)
    mean = math.fsum(batch.learned) / n
    return {"mean_reward": mean, "episode_reward_std": math.sqrt(math.fsum((r - mean) ** 2 for r in batch.learned) / n)}


def train_all(
    store: Store,
    learner: Any,
    *,
    agent_ids: Iterable[str] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    max_batch: int = TRAIN_BATCH,
    min_batch: int = 1,
    drift: DriftConfig | None = None,
    guardrail: Any = None,
) -> list[TrainOutcome]:
    """:func:`train_safely` for ``agent_ids`` (default: every agent with a policy), one after the
    other in this process. The timer and the embedded runner fan out instead
    (:mod:`agent_learning.pipeline.fanout`); this is the same work without a queue."""
    return [
        train_safely(
            agent_id,
            store,
            learner,
            clock=clock,
            max_batch=max_batch,
            min_batch=min_batch,
            drift=drift,
            guardrail=guardrail,
        )
        for agent_id in (store.list_agents() if agent_ids is None else agent_list(agent_ids))
    ]


def agent_list(agent_ids: Iterable[str] | None) -> list[str] | None:
    """``agent_ids`` as a list; a single string is refused (it would be read as its characters,
    which name no agent, and nothing would be trained)."""
    if isinstance(agent_ids, str):
        raise TypeError(f"agent_ids: {agent_ids!r} is one string; pass a list of agent ids, [{agent_ids!r}]")
    return None if agent_ids is None else list(agent_ids)


def train_safely(agent_id: str, store: Store, learner: Any, **train_kwargs: Any) -> TrainOutcome:
    """:func:`train_agent` that never raises, so that one agent's failure does not stop the rest
    (:func:`failure_outcome` says what the failure was)."""
    try:
        return train_agent(agent_id, store, learner, **train_kwargs)
    except Exception as exc:
        return failure_outcome(agent_id, exc)


def failure_outcome(agent_id: str, exc: Exception) -> TrainOutcome:
    """The outcome of a training step that raised: a transient failure (a store outage) is
    ``unavailable`` and logged as a warning, anything else ``failed`` and logged as an error with
    its traceback."""
    reason = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TransientError):
        log.warning("training %s: unavailable, the next run retries: %s", agent_id, exc)
        return TrainOutcome("unavailable", agent_id, reason=reason)
    log.error("training %s failed", agent_id, exc_info=exc)
    return TrainOutcome("failed", agent_id, reason=reason)
