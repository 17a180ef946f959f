"""The data contract's plain rules: the id patterns, the temperature range and new policies'
defaults, with no validation library. :mod:`agent_learning.documents` builds its models on them;
``agent-learn`` checks its arguments with them without importing the models (its help and its
usage errors stay quick)."""

from __future__ import annotations

import re

AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$"
AGENT_ID_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 characters"
AGENT_PATTERN = re.compile(r"^[A-Za-z0-9._\-*?\[\]!]{1,128}$")
"""An agent id (letters, digits, ``.``, ``_``, ``-``) with ``fnmatch`` wildcards (``*``, ``?``, ``[...]``)."""
DOC_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,199}$"
"""A document id. Cosmos ids may not contain / \\ ? # and are at most 255 characters."""
DOC_ID_RULE = "letters, digits, '.', '_', ':' and '-', starting with a letter or digit, at most 200 characters"

MIN_TEMPERATURE = 0.01
"""The lowest policy temperature. A policy is already greedy well above it (a logit gap of 0.5
is odds of e^50 at T = 0.01), so lower values only shrink the numbers the math works with:
the learner's gradient grows as 1/T and overflows near T = 1e-300, and logits / T must stay
finite for logits up to ``MAX_LOGIT``. A document below it fails validation, so a policy that
could never be trained is refused when it is created, not at every training run."""
MAX_TEMPERATURE = 100.0
"""The highest policy temperature: above it every policy is practically uniform."""
DEFAULT_TEMPERATURE = 1.0
"""The temperature new policies get unless configured otherwise (settings, CLI and Python API alike)."""
DEFAULT_EXPLORATION_FLOOR = 0.001
"""The exploration floor new policies get unless configured otherwise (settings, CLI and Python API
alike; docs/benchmarks.md: Learning benchmark). A stored document without the field has none (0)."""


def agent_id_problem(value: object) -> str | None:
    """Why ``value`` is not an agent id, in one plain sentence (None if it is one)."""
    return _id_problem(value, AGENT_ID_PATTERN, "agent id", AGENT_ID_RULE)


def episode_id_problem(value: object) -> str | None:
    """Why ``value`` is not an episode id, in one plain sentence (None if it is one)."""
    return _id_problem(value, DOC_ID_PATTERN, "episode id", DOC_ID_RULE)


def _id_problem(value: object, pattern: str, name: str, rule: str) -> str | None:
    if not isinstance(value, str) or not value:
        return f"{name} must be a non-empty string, got {value!r:.80}"
    if not re.fullmatch(pattern, value):
        return f"{value[:80]!r} is not an {name}: use {rule}"
    return None
