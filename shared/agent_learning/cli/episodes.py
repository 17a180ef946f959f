"""``agent-learn episodes``: episodes with their scores, judges' reasons and feedback."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from agent_learning.cli.access import _current, _dead_letter_row, _dead_letters, _store, _where
from agent_learning.cli.options import COUNT, _agent_id, db_option, json_option
from agent_learning.cli.output import _echo_json, _fmt, _ms, _n, _user_fields, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import InvalidDocument, NotFound


@main.group()
def episodes() -> None:
    """Episodes with their scores, judges' reasons and feedback."""


@episodes.command("list")
@click.option("--agent-id", default=None, callback=_agent_id, help="Only this agent's episodes.")
@click.option("--limit", type=COUNT, default=20, show_default=True, help="The newest N episodes.")
@json_option
@db_option
@_handle_errors
def episodes_list(agent_id: str | None, limit: int, as_json: bool, db: str | None) -> None:
    """The newest episodes and their rewards."""
    from agent_learning.pipeline import message_id_of
    from agent_learning.rewards.feedback import score_rows
    with _store(db) as (store, settings):
        docs = store.list_episodes(agent_id, limit)
        if agent_id is not None and not docs:
            _current(store, settings, agent_id)  # no episodes and no policy: an unknown agent
        rows = []
        letters: dict[str, Any] | None = None  # read once, when an episode has neither score nor unjudged record
        for d in docs:
            scores = score_rows(store, str(d.get("id")), str(d.get("agent_id")))
            rejected = _rejected(scores)
            record = None if scores else store.get_unjudged(str(d.get("id")), str(d.get("agent_id")))
            if not scores and not record and letters is None:
                letters = _dead_letters(db)
            letter = None if scores or record else (letters or {}).get(message_id_of(str(d.get("id"))))
            rows.append(
                {
                    "id": d.get("id"),
                    "agent_id": d.get("agent_id"),
                    "action_id": d.get("action_id"),
                    "policy_version": d.get("policy_version"),
                    "ended_at": d.get("ended_at"),
                    "reward": scores[-1].get("reward") if scores and not rejected else None,
                    "judged_reward": scores[0].get("reward") if scores and not rejected else None,
                    "corrections": max(0, len(scores) - 1),
                    "unjudged": record.get("reason") if record else None,
                    "dead_letter": letter.reason if letter else None,
                    "rejected": rejected,
                }
            )
    if as_json:
        _echo_json(rows)
        return
    unread = letters is None and any(r["reward"] is None and not r["unjudged"] and not r["rejected"] for r in rows)
    table = Table(title=_n(len(rows), "newest episode"), title_justify="left")
    for col in ("episode", "agent", "action", "version", "reward", "judged", "corr.", "ended"):
        table.add_column(col, justify="right" if col in ("version", "reward", "judged", "corr.") else "left",
                         no_wrap=col == "episode")
    for r in rows:
        table.add_row(
            str(r["id"]), str(r["agent_id"]), str(r["action_id"]), str(r["policy_version"]),
            _fmt(r["reward"]) if r["reward"] is not None else "rejected" if r["rejected"]
            else "unjudged" if r["unjudged"] else "dead-lettered" if r["dead_letter"]
            else "not scored?" if unread else "not scored",
            _fmt(r["judged_reward"]),
            str(r["corrections"]), str(r["ended_at"])[:19],
        )
    out.print(table)
    if unread:
        out.print("not scored?: not scored yet, or dead-lettered (the dead letters could not be read: "
                  "agent-learn dlq list)")
    if any(r["rejected"] for r in rows):
        out.print("rejected: a score document is invalid, so training skips it (agent-learn episodes show, "
                  "agent-learn audit)")


def _rejected(scores: list[dict[str, Any]]) -> str | None:
    """What is wrong with the first of an episode's score rows that does not validate (training
    rejects it, and the audit counts it so), or None when they all do."""
    from agent_learning.documents import Score
    for row in scores:
        try:
            Score.from_dict(row)
        except InvalidDocument as exc:
            return str(exc)
    return None


@episodes.command("show")
@click.argument("episode_id")
@json_option
@db_option
@_handle_errors
def episodes_show(episode_id: str, as_json: bool, db: str | None) -> None:
    """One episode, its score with every judge's reason, its corrections and feedback."""
    from agent_learning.documents import Episode
    from agent_learning.pipeline import message_id_of
    from agent_learning.rewards.feedback import score_rows
    with _store(db) as (store, settings):
        doc = store.get_episode(episode_id)
        if doc is None:
            where = _where(settings, how=True)
            raise NotFound(f"EPISODE_ID: no episode {episode_id!r} in {where} (agent-learn episodes list)")
        scores = [_user_fields(s) for s in score_rows(store, episode_id, str(doc.get("agent_id")))]
        feedback = [_user_fields(f) for f in store.list_feedback(episode_id)]
        record = None if scores else store.get_unjudged(episode_id, str(doc.get("agent_id")))
    episode = _user_fields(doc)
    try:
        Episode.from_dict(doc)
        invalid = None
    except InvalidDocument as exc:  # edited by hand, or written around the library: shown as stored
        invalid = str(exc)
    unjudged = _user_fields(record) if record else None
    letters = _dead_letters(db) if not scores and not record else {}
    letter = (letters or {}).get(message_id_of(episode_id))
    dead_letter = _dead_letter_row(letter) if letter else None
    if as_json:
        _echo_json({"episode": episode, "invalid": invalid, "scores": scores, "feedback": feedback,
                    "unjudged": unjudged, "dead_letter": dead_letter})
        return
    if invalid:
        out.print(f"{episode_id} as stored is an {invalid} (the scorer dead-letters such an episode)", highlight=False)
    out.print(Text.assemble((episode_id, "bold"), f": agent {episode.get('agent_id')}, action "
                            f"{episode.get('action_id')} (p={_fmt(episode.get('probability'), 4)}) under "
                            f"v{episode.get('policy_version')}, {str(episode.get('ended_at'))[:19]}"))
    out.print(f"input: {str(episode.get('input', ''))[:300]}", highlight=False)
    out.print(f"output: {str(episode.get('output', ''))[:300]}", highlight=False)
    for step in episode.get("steps", []):
        error = f" — {step.get('error')}" if step.get("error") else ""
        out.print(f"  step {step.get('name')} ({step.get('kind')}): {step.get('status')}, "
                  f"{_ms(step.get('latency_ms'))}{error}", highlight=False)
    if unjudged:
        why = "sampled out" if unjudged.get("reason") == "sampled_out" else "over the rate"
        out.print(f"not judged: {why} by AGENT_LEARNING_JUDGING {unjudged.get('rule')} "
                  f"({str(unjudged.get('recorded_at'))[:19]}); agent-learn rescore --unjudged judges it")
    elif dead_letter:
        tries = _n(dead_letter["delivery_count"], "delivery attempt")
        out.print(f"dead-lettered: {dead_letter['reason']} after {tries}"
                  f" ({str(dead_letter['dead_lettered_at'])[:19]}): {dead_letter['description']}; it is scored "
                  "only if replayed (agent-learn dlq replay --id ...)", highlight=False)
    elif not scores:
        out.print("not scored yet" if letters is not None
                  else "not scored yet, or dead-lettered (the dead letters could not be read: agent-learn dlq list)")
    elif rejected := _rejected(scores[:1]):
        out.print(f"score {scores[0].get('id')} rejected: {rejected}; training skips it (agent-learn audit)",
                  highlight=False)
    else:
        base = scores[0]
        table = Table(title=f"judged reward {base['reward']:.3f} ({base['reward_function']['version']})",
                      title_justify="left")
        for col in ("metric", "raw", "normalised", "result", "reason"):
            table.add_column(col, justify="right" if col in ("raw", "normalised") else "left")
        for name, m in base.get("metrics", {}).items():
            result = str(m.get("result") or "")
            table.add_row(name, f"{m['raw']:g}", f"{m['normalised']:.3f}", result, m.get("reason", ""))
        out.print(table)
        for c in scores[1:]:
            if rejected := _rejected([c]):
                out.print(f"correction {c.get('id')} rejected: {rejected}; training skips it", highlight=False)
                continue
            out.print(f"correction r{c['revision']}: reward {c['reward']:.3f} ({c['reward_delta']:+.3f}), "
                      f"{str(c['scored_at'])[:19]}")
    for f in feedback:
        verdict = f"thumb {f['thumb']}" if f.get("thumb") else f"score {f.get('score')}"
        out.print(f"feedback from {f['source']}: {verdict}{' — ' + f['comment'] if f.get('comment') else ''}",
                  highlight=False)
