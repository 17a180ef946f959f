"""How a context value enters a policy: the one reading the policy (at choose time) and the learner
(reading logged episodes) share, so that both see the same segment or the same number.

A feature learned as segments (a category, or a number declared with ``bins``) maps a value to a
segment name; a numeric feature maps a value x to ::

    x̃ = clip((t(x) − m) / s, ±NUMBER_CLIP),    t(x) = x (``standardise``) or ln(1 + x) (``log``, x ≥ 0)

with m and s its centre and scale (fitted by the learner on t(x)). A value that is not of the
feature's kind (a string for a number, a negative number for ``log``) gives nothing: it adds
nothing to the logits, as the learner reads it; ``choose()`` refuses it (:func:`refusal`).
Binned: edges e₁ < … < e_n make the bins ``<e₁``, ``[e₁,e₂)``, …, ``>=e_n``, named so.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from typing import Any

from agent_learning.documents import ContextFeature

NUMBER_CLIP = 4.0
"""A numeric feature enters as (t(x) − centre) / scale, clipped to ±4: an outlier cannot swing the policy."""


def is_number(value: Any) -> bool:
    """Whether ``value`` counts for a numeric feature: an int or a float, not a boolean."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def segment_name(value: Any) -> str:
    """The segment a categorical value names: the string itself, ``true``/``false`` for booleans,
    and a number's decimal form (a category given as a number)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)


def standardise(x: float, center: float, scale: float) -> float:
    """x̃ = clip((x − m) / s, ±NUMBER_CLIP)."""
    return max(-NUMBER_CLIP, min(NUMBER_CLIP, (x - center) / scale))


def _edge(x: float) -> str:
    """An edge as a bin's name writes it: ``100`` for 100.0, ``0.5`` as it is."""
    x = float(x)
    return repr(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def bin_names(edges: list[float] | tuple[float, ...]) -> tuple[str, ...]:
    """The segment names of the bins between ``edges``: ``<100``, ``[100,1000)``, ``>=1000``."""
    inner = [f"[{_edge(a)},{_edge(b)})" for a, b in itertools.pairwise(edges)]
    return (f"<{_edge(edges[0])}", *inner, f">={_edge(edges[-1])}")


def bin_values(edges: list[float] | tuple[float, ...]) -> tuple[float, ...]:
    """A number in each bin (its lower edge; below the first edge for the first bin)."""
    return (edges[0] - max(1.0, abs(edges[0])), *edges)


class FeatureReader:
    """A context feature of a policy, ready to read values: :meth:`segment` for a feature learned
    as segments, :meth:`transformed` and :meth:`number` for a numeric one (module docstring)."""

    __slots__ = ("center", "edges", "log", "name", "names", "scale", "segmented")

    def __init__(self, feature: ContextFeature) -> None:
        self.name = feature.name
        self.segmented = feature.segmented
        self.edges = tuple(feature.bins or ())
        self.names = bin_names(self.edges) if self.edges else ()
        self.log = feature.transform == "log"
        self.center, self.scale = feature.center, feature.scale

    def segment(self, value: Any) -> str | None:
        """The segment ``value`` is in: a category's name, a binned number's bin (None for a value
        that is not a number)."""
        if not self.edges:
            return segment_name(value)
        return self.names[bisect_right(self.edges, value)] if is_number(value) else None

    def transformed(self, value: Any) -> float | None:
        """t(x) of a numeric feature's value (None when it gives nothing)."""
        if not is_number(value):
            return None
        if self.log:
            return math.log1p(value) if value >= 0 else None
        return float(value)

    def number(self, value: Any) -> float | None:
        """x̃ of a numeric feature's value with its centre and scale (None when it gives nothing).
        On every ``choose()`` with the feature: the plain types first, no call but log1p."""
        kind = value.__class__
        if kind is not float and kind is not int:
            if not is_number(value):
                return None
            value = float(value)
        if self.log:
            if value < 0:
                return None
            value = math.log1p(value)
        x = (value - self.center) / self.scale
        return -NUMBER_CLIP if x < -NUMBER_CLIP else NUMBER_CLIP if x > NUMBER_CLIP else x

    def refusal(self, value: Any) -> str | None:
        """Why ``choose()`` refuses ``value`` for this numeric feature (None when it takes it)."""
        if isinstance(value, bool | str):
            return f"must be a number (got {value!r:.80})"
        if self.log and is_number(value) and value < 0:
            return f"must be 0 or more for a log feature (got {value!r:.80})"
        return None
