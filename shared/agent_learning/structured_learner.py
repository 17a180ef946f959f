"""The learner of policies with dimensions, exclusions and context features: the one learner of
:mod:`agent_learning.learner` (``StructuredReinforce`` is :class:`~agent_learning.learner.Reinforce`),
re-exported here under the names this module had."""

from __future__ import annotations

from .learner import (
    MIN_ALLOWED_MASS,
    NUMBER_FIT_EPISODES,
    NUMBER_PROBE,
    PENDING_NUMBERS,
    ContextBatch,
    Contexts,
    Model,
    Params,
    Reinforce,
    Rows,
    StructuredReinforce,
    StructuredUpdate,
    Tallies,
    centre,
    dimension_softmax,
    gradient,
    learn_structured,
    prepare,
    row_arrays,
    surrogate,
)

__all__ = [
    "MIN_ALLOWED_MASS",
    "NUMBER_FIT_EPISODES",
    "NUMBER_PROBE",
    "PENDING_NUMBERS",
    "ContextBatch",
    "Contexts",
    "Model",
    "Params",
    "Reinforce",
    "Rows",
    "StructuredReinforce",
    "StructuredUpdate",
    "Tallies",
    "centre",
    "dimension_softmax",
    "gradient",
    "learn_structured",
    "prepare",
    "row_arrays",
    "surrogate",
]
