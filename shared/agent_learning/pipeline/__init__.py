"""The pipeline's stages, in the order data flows: enqueue, score, train, publish.

The same code runs under Azure Functions (the triggers in ``function_app.py`` call these),
in the embedded local runner and in tests. Every handler is idempotent, because every
trigger delivers at least once:

* :mod:`.enqueue` — :func:`enqueue_episodes`: one scoring message per changed episode; the
  message id is the episode id, so queue duplicate detection drops a redelivered batch.
* :mod:`.score` — :func:`score_message`: judges an episode, shapes its reward, stores the
  score; an episode that already has a score is not judged again (unless ``force``).
* :mod:`.train` — :func:`train_agent`: folds the scores after the current document's cursor
  into the next policy version.
* :mod:`.fanout` — :func:`plan_training`: which agents a tick trains; one
  :class:`TrainRequest` message per agent, trained by :func:`train_requested`.
* :mod:`.publish` — every write of an agent's current policy document (the trainer's
  compare-and-swap, :func:`create_policy`, pin, unpin and rollback) and :func:`load_current`,
  its one validated loader.

Each stage runs in an OpenTelemetry span and records its metrics (:mod:`agent_learning.core.telemetry`).
"""

from agent_learning.documents import MAX_TRAIN_BATCH
from agent_learning.pipeline.enqueue import (
    EMBED_LIMIT_CHARS,
    EnqueueResult,
    enqueue_episodes,
    message_id_of,
    score_request_message,
)
from agent_learning.pipeline.fanout import TrainingPlan, TrainRequest, plan_training, send_plan, train_requested
from agent_learning.pipeline.publish import (
    Change,
    Current,
    create_policy,
    import_policy,
    load_current,
    load_current_tagged,
    materialise,
    publish,
    revise,
    rollback,
    set_pinned,
)
from agent_learning.pipeline.score import (
    ScoreOutcome,
    Scorer,
    run_judge,
    score_episode,
    score_message,
)
from agent_learning.pipeline.train import TrainOutcome, train_agent, train_all, train_safely

__all__ = [
    "EMBED_LIMIT_CHARS",
    "MAX_TRAIN_BATCH",
    "Change",
    "Current",
    "EnqueueResult",
    "ScoreOutcome",
    "Scorer",
    "TrainOutcome",
    "TrainRequest",
    "TrainingPlan",
    "create_policy",
    "enqueue_episodes",
    "import_policy",
    "load_current",
    "load_current_tagged",
    "materialise",
    "message_id_of",
    "plan_training",
    "publish",
    "revise",
    "rollback",
    "run_judge",
    "score_episode",
    "score_message",
    "score_request_message",
    "send_plan",
    "set_pinned",
    "train_agent",
    "train_all",
    "train_requested",
    "train_safely",
]
