"""``agent-learn train`` and ``rescore``: run the pipeline's scoring and training from the command line."""

from __future__ import annotations

import json
import sys
from contextlib import suppress

import click

from agent_learning.cli.access import _current, _embedded, _existing, _settings, _store
from agent_learning.cli.options import COUNT, IntRange, _agent_id, agent_option, db_option, json_option
from agent_learning.cli.output import _counts, _echo_json, _ids, _n, _progress, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import StoredDocumentInvalid


@main.command()
@agent_option
@click.option("--episode-id", "episode_ids", multiple=True, help="Only this episode (repeatable; default: all).")
@click.option("--rejudge", is_flag=True, help="Judge them again (default: keep the metrics, reshape the reward).")
@click.option("--unjudged", is_flag=True,
              help="Judge the episodes AGENT_LEARNING_JUDGING left unjudged instead (learned once each).")
@click.option("--limit", type=COUNT, default=None,
              help="With --unjudged: judge at most N (in episode-id order: a random part of the backlog).")
@json_option
@db_option
@_handle_errors
def rescore(agent_id: str, episode_ids: tuple[str, ...], rejudge: bool, unjudged: bool, limit: int | None,
            as_json: bool, db: str | None) -> None:
    """Score an agent's episodes again with the settings' reward function (and judge, with --rejudge).

    Episodes a published version already learned from keep the update they made: their new
    score is recorded, not learned again. Episodes not trained yet are learned once, with their
    new score. With --unjudged, judge the episodes the agent's judging rule left unjudged: each
    is learned once, by the next training run; running it again judges only those still
    unjudged. Exits with 1 when an episode could not be (re-)scored (it keeps what it had)."""
    from agent_learning.app import wiring
    from agent_learning.ops.recovery import rescore as run_rescore
    if unjudged and (episode_ids or rejudge):
        raise ValueError("--unjudged: judges every episode recorded unjudged (up to --limit); "
                         "it takes neither --episode-id nor --rejudge")
    if limit is not None and not unjudged:
        raise ValueError("--limit: only with --unjudged")
    if unjudged:
        _judge_unjudged(agent_id, limit, as_json, db)
        return
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        with _progress("re-scoring", transient=True) as bar:
            task = bar.add_task("re-scoring", total=len(set(episode_ids)) if episode_ids else None)
            result = run_rescore(
                store,
                wiring.open_scorer(settings, store),
                agent_id,
                episode_ids=list(episode_ids) if episode_ids else None,
                rejudge=rejudge,
                progress=lambda n: bar.update(task, completed=n),
            )
    failed = [{"episode_id": e, "reason": r, "description": d} for e, r, d in result.failed]
    if as_json:
        _echo_json({"already_trained": result.already_trained, "lost": result.lost, "pending": result.pending,
                    "failed": failed})
    else:
        out.print(f"re-scored {_n(result.rescored, 'episode')} of {agent_id}")
        out.print(
            f"already trained ({len(result.already_trained)}; recorded, not learned again): "
            + _ids(result.already_trained)
        )
        if result.lost:
            out.print(f"lost ({len(result.lost)}; no run learned their earlier score and none reads behind the"
                      " cursor: recorded, not learned): " + _ids(result.lost))
        out.print(f"pending ({len(result.pending)}; learned once, with the new score): " + _ids(result.pending))
        for f in failed:
            out.print(f"failed: {f['episode_id']}: {f['reason']}: {f['description']}")
    if failed:
        sys.exit(1)


def _judge_unjudged(agent_id: str, limit: int | None, as_json: bool, db: str | None) -> None:
    from agent_learning.app import wiring
    from agent_learning.ops.recovery import judge_unjudged
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        with _progress("judging", transient=True) as bar:
            task = bar.add_task("judging", total=limit)
            result = judge_unjudged(store, wiring.open_scorer(settings, store), agent_id, limit=limit,
                                    progress=lambda n: bar.update(task, completed=n))
    failed = [{"episode_id": e, "reason": r, "description": d} for e, r, d in result.failed]
    if as_json:
        _echo_json({"judged": result.judged, "duplicates": result.duplicates, "failed": failed,
                    "stopped": result.stopped, "more": result.more})
    else:
        out.print(f"judged {_n(len(result.judged), 'unjudged episode')} of {agent_id} (each learned once, by the next "
                  f"training run): " + _ids(result.judged))
        if result.duplicates:
            out.print(f"judged meanwhile ({len(result.duplicates)}): " + _ids(result.duplicates))
        for f in failed:
            out.print(f"failed: {f['episode_id']}: {f['reason']}: {f['description']} (it stays unjudged)")
        stuck = len(failed) - bool(result.stopped)  # a stopped run's last failure is worth retrying
        if stuck:
            out.print(f"not judged, for a reason retrying does not fix: {_n(stuck, 'episode')}; each run tries "
                      "them again without counting them against --limit, so it goes on to the others")
        if result.stopped:
            out.print(f"stopped: {result.stopped}")
        if result.more:
            out.print("more episodes remain unjudged: run it again (agent-learn audit counts them)")
    if failed:
        sys.exit(1)


TRAINING_FAILED = ("invalid_policy", "unavailable", "failed")
"""Training outcomes that make ``agent-learn train`` exit with 1."""


@main.command()
@click.option("--agent-id", default=None, callback=_agent_id, help="Train one agent (default: every agent).")
@click.option("--limit", type=IntRange(1, None), default=None,
              help="Score at most this many episodes and learn from at most this many per agent (default: all).")
@json_option
@db_option
@_handle_errors
def train(agent_id: str | None, limit: int | None, as_json: bool, db: str | None) -> None:
    """Enqueue and score new episodes, apply feedback left unapplied, then run one training step
    (what the timer does).

    Exits with 1 if an episode could not be scored (it is tried again on a later run) or an agent
    could not be trained (the others are scored and trained all the same)."""
    from agent_learning.app.embedded import open_local
    from agent_learning.app.personalizer.sweep import sweep_events
    from agent_learning.rewards.feedback import sweep
    settings = _existing(_settings(db))
    with _embedded(settings, "store"):
        pipeline = open_local(settings)
    try:
        if agent_id is not None:
            with suppress(StoredDocumentInvalid):  # an invalid policy is what training reports, as for every agent
                _current(pipeline.store, settings, agent_id)  # an unknown agent is bad input, as everywhere
        sweep_events(pipeline.store, pipeline.clock)  # Personalizer events whose reward wait is over
        enqueued = pipeline.pump()
        with _progress("scoring", as_json) as bar:
            task = bar.add_task("score", total=enqueued or None)
            # Messages already waiting (a replayed dead letter, an earlier run's leftovers) are scored
            # too: the total grows with them rather than read 3/2.
            outcomes = pipeline.score_pending(
                max_messages=limit, progress=lambda n: bar.update(task, completed=n, total=max(n, enqueued) or None)
            )
        sweep(pipeline.store, clock=pipeline.clock)
        results = pipeline.train([agent_id] if agent_id else None, limit=limit)
    finally:
        pipeline.close()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "enqueued": enqueued,
                    "outcomes": dict(outcomes),  # as demo --json and LocalPipeline.run_once name them
                    "scored": dict(outcomes),  # the same, under the name it had first (scripts read it)
                    "training": [
                        {
                            "agent_id": r.agent_id,
                            "status": r.status,
                            "version": r.version,
                            "reason": r.reason,
                            "episodes": r.run.episodes if r.run else 0,
                            # corrections alone have no batch mean, as in the text
                            "mean_reward": r.run.metrics["mean_reward"] if r.run and r.run.episodes else None,
                        }
                        for r in results
                    ],
                },
                indent=2,
            )
        )
    else:
        out.print(f"enqueued {enqueued}; scoring outcomes: {_counts(outcomes)}")
        for r in results:
            line = f"{r.agent_id}: {r.status}" + (
                f" → v{r.version}" if r.status == "published" else f" (v{r.version} stays current)" if r.version else ""
            )
            if r.run and r.run.episodes:
                line += f" ({_n(r.run.episodes, 'episode')}, mean reward {r.run.metrics['mean_reward']:.3f})"
            if r.reason:  # for a publish: the guardrail in warn mode found the candidate worse
                line += f" — {'published although ' if r.status == 'published' else ''}{r.reason}"
            out.print(line)
    if outcomes["failed"] and not as_json:
        out.print(f"{outcomes['failed']} episode(s) could not be scored (the warning above says why); each is tried"
                  " again on a later run and dead-lettered after the queue's max deliveries")
    if outcomes["retry"] and not as_json:
        out.print(f"{_n(outcomes['retry'], 'scoring attempt')} found the judge unavailable (the warning above says"
                  " why); each episode is tried again on a later run and dead-lettered after the queue's max"
                  " deliveries (`agent-learn dlq replay` sends it back)")
    if outcomes["failed"] or outcomes["retry"] or any(r.status in TRAINING_FAILED for r in results):
        sys.exit(1)  # every episode and agent was tried; what failed is listed above
