"""The candidate the next training run would publish, without publishing it (``agent-learn evaluate --candidate``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent_learning.core.errors import NotFound
from agent_learning.documents import TRAIN_BATCH, PolicyDocument, ScoreCursor
from agent_learning.evaluation.counterfactual import Distribution, of_document
from agent_learning.pipeline.train import collect, learn, next_version
from agent_learning.store.base import Store


def candidate_target(
    store: Store, current: PolicyDocument, learner: Any, max_batch: int = TRAIN_BATCH
) -> tuple[Distribution, int]:
    """The candidate the next training run would publish (not published), and its new episodes:
    ``learner`` on the ``max_batch`` score rows after the cursor, as the trainer reads them
    (``AGENT_LEARNING_TRAIN_MAX_BATCH``)."""
    rows = store.read_scores(current.agent_id, current.cursor, max_batch)
    batch = collect(current.agent_id, rows, current)
    if not batch.actions:
        raise NotFound(
            f"--candidate: {current.agent_id!r} has no new scores since v{current.version}; "
            "the next candidate would be the current version"
        )
    update = learn(learner, current, batch)
    cursor = ScoreCursor.of_row(rows[-1])
    now = datetime.now().astimezone()
    doc = next_version(current, learner, update, batch, cursor, now, now)
    return of_document(doc), batch.episodes

