"""``agent-learn feedback``: a user's feedback on an episode."""

from __future__ import annotations

import math
from typing import Any

import click

from agent_learning.cli.access import _dead_letters, _store
from agent_learning.cli.options import FloatRange, db_option, json_option
from agent_learning.cli.output import _echo_json, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import InvalidDocument, NotFound

FEEDBACK_OPTIONS = {"episode_id": "EPISODE_ID", "source": "--source", "comment": "--comment", "score": "--score",
                    "thumb": "--up/--down"}
"""The argument or option of ``agent-learn feedback`` behind each field of a feedback document."""


@main.command()
@click.argument("episode_id")
@click.option("--up", is_flag=True, help="Thumbs up.")
@click.option("--down", is_flag=True, help="Thumbs down.")
@click.option("--score", type=FloatRange(0, 1), default=None, help="A score from 0 to 1 instead of a thumb.")
@click.option("--source", default="user", show_default=True, help="Who gives it: one feedback per source.")
@click.option("--comment", default="", help="Why, in the user's words (stored with the feedback).")
@json_option
@db_option
@_handle_errors
def feedback(
    episode_id: str, up: bool, down: bool, score: float | None, source: str, comment: str, as_json: bool,
    db: str | None,
) -> None:
    """Attach a user's feedback to an episode; its reward is corrected exactly once."""
    from agent_learning.pipeline import message_id_of
    from agent_learning.rewards.feedback import record_feedback
    if up + down + (score is not None) != 1:
        raise ValueError("--up/--down/--score: give exactly one")
    if score is not None and not math.isfinite(score):
        raise ValueError(f"--score: {score} is not in the range 0<=x<=1.")
    thumb = "up" if up else "down" if down else None
    with _store(db) as (store, _):
        try:
            result = record_feedback(store, episode_id, thumb=thumb, score=score, source=source, comment=comment)
        except InvalidDocument as exc:
            if exc.kind != "feedback":
                raise
            raise ValueError("; ".join(f"{FEEDBACK_OPTIONS.get(name, name)}: {problem}"
                                       for name, problem in exc.problems)) from None
        except NotFound as exc:
            raise NotFound(f"EPISODE_ID: {str(exc).removeprefix('episode_id: ')}") from None
        unlearned = "" if result.reconciled.status == "unchanged" else _not_learned(store, result.feedback)
        agent_id = result.feedback.agent_id
        left_out = store.get_unjudged(episode_id, agent_id) if result.reconciled.status == "waiting" else None
    data = result.to_dict()
    if as_json:
        _echo_json(data)
        return
    if data["status"] == "corrected":
        said = f"stored; reward now {data['reward']:.3f} ({data['reward_delta']:+.3f})" + (unlearned or (
            ", learned from by the next training run that has new episodes (or a full batch of corrections)"))
    elif data["status"] == "unchanged":
        said = "stored; the reward already reflects it"
    elif data["status"] == "rejected":
        said = (f"stored, but not learned: the episode's score document is an {data['problem']}, so training "
                "skips the episode (agent-learn audit counts it rejected)")
    elif left_out is not None:
        said = (f"stored; AGENT_LEARNING_JUDGING left the episode unjudged ({left_out.get('reason')}), so it is "
                f"applied once `agent-learn rescore --agent-id {agent_id} --unjudged` judges it{unlearned}")
    elif (letter := (_dead_letters(db) or {}).get(message_id_of(episode_id))) is not None:
        said = (f"stored; the episode was dead-lettered ({letter.reason}), so it is applied only once "
                f"`agent-learn dlq replay --id {message_id_of(episode_id)}` has it scored{unlearned}")
    else:  # waiting: the episode has no score yet (not scored, or left unjudged)
        said = f"stored; it is applied when the episode is scored{unlearned}"
    out.print(f"feedback {data['feedback_id']}: {said}")


def _not_learned(store: Any, feedback: Any) -> str:
    """Why the reward feedback changed will not be learned when training runs next ("" if it
    will be): the episode's action is not in its agent's current policy (the trainer skips its
    rows), or its agent has no policy."""
    from agent_learning.pipeline import load_current
    from agent_learning.policy.softmax import knows_action
    episode = store.get_episode(feedback.episode_id) or {}
    action_id = str(episode.get("action_id"))
    try:
        current = load_current(store, feedback.agent_id)
    except InvalidDocument:
        return ""  # the trainer does not train it either, until the document is fixed: audit says so
    if current is None:
        return f", but not learned: {feedback.agent_id!r} has no policy (agent-learn agent list)"
    if knows_action(current, action_id):
        return ""
    return (f", but not learned: action {action_id!r} is not in {feedback.agent_id} v{current.version} (a "
            "revision removed or renamed it), so training skips it unless a rollback restores the action first")
