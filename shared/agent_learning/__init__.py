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
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
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


MOVED = {
    "errors": "core.errors", "clock": "core.clock", "notices": "core.notices", "telemetry": "core.telemetry",
    "limits": "core.limits", "decision": "policy.decision", "structured": "policy.softmax",
    "client": "agent.client", "capture": "agent.capture", "judging": "judges.sampling",
    "learner": "learning.reinforce", "structured_learner": "learning.reinforce",
    "counterfactual": "evaluation.counterfactual", "feedback": "rewards.feedback", "drift": "pipeline.drift",
    "audit": "ops.audit", "recovery": "ops.recovery", "history": "ops.history", "report": "ops.report",
    "plots": "ops.plots", "admin": "ops.admin", "simulate": "sim.simulate", "demo": "app.demo",
    "config": "app.settings", "wiring": "app.wiring", "functions": "app.handlers", "local": "app.embedded",
    "callers": "app.callers", "ingestion": "app.ingestion", "compat": "app.seed",
}
"""Module of release 0.1.0 → where it is now (docs/development.md, "Layout"). ``import
agent_learning.client`` still gives :mod:`agent_learning.agent.client` itself, with a
:class:`DeprecationWarning` naming the new place."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved module under its old name, as the module at its new place."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        old = fullname.removeprefix(__name__ + ".")
        return importlib.util.spec_from_loader(fullname, self) if old in MOVED and old != fullname else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = f"{__name__}.{MOVED[spec.name.removeprefix(__name__ + '.')]}"
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module at its new place is already loaded."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
