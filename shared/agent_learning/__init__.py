"""agent_learning: agents learn which configuration to use from judged experience.

The agent side needs only :mod:`agent_learning.policy`, :mod:`agent_learning.agent.capture` and a
store; the learner (numpy) and the judges (azure-ai-evaluation) are imported only where
training and scoring run.

The names of the ``azure-agents-learning-sdk`` README (``Action``, ``EpisodeCapture``,
``LearningRunner``, ``SoftmaxPolicy``) are importable from here; each is loaded when first used
(:mod:`agent_learning.app.seed`, docs/migrating.md).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

LAZY = {"Action": "app.seed", "EpisodeCapture": "app.seed", "LearningRunner": "app.seed", "SoftmaxPolicy": "app.seed"}
"""Name importable from the package → the module it is loaded from when first used."""


def __getattr__(name: str) -> Any:
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY])
