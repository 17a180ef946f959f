"""The judges' metrics: their names and raw scales, and how a raw score maps onto [0, 1]."""

from __future__ import annotations

import math

INTENT_RESOLUTION = "intent_resolution"
TASK_ADHERENCE = "task_adherence"
TASK_COMPLETION = "task_completion"
METRICS = (INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION)

# (low, high) of each evaluator's raw scale, whole numbers from low to high.
SCALES: dict[str, tuple[float, float]] = {
    INTENT_RESOLUTION: (1.0, 5.0),
    TASK_ADHERENCE: (0.0, 1.0),
    TASK_COMPLETION: (0.0, 1.0),
}


def normalise(metric: str, raw: float) -> float:
    """Map a judge's raw score onto [0, 1]; raises ``ValueError`` when it is not one of its
    scale's whole numbers."""
    if metric not in SCALES:
        raise ValueError(f"{metric}: unknown metric (known: {', '.join(SCALES)})")
    low, high = SCALES[metric]
    if not isinstance(raw, (int, float)) or isinstance(raw, bool) or not math.isfinite(raw):
        raise ValueError(f"{metric}: raw score must be a finite number, got {raw!r}")
    if not low <= raw <= high:
        raise ValueError(f"{metric}: raw score {raw} is outside its scale [{low:g}, {high:g}]")
    if not float(raw).is_integer():
        raise ValueError(f"{metric}: raw score {raw} is not a whole number of its scale {low:g} to {high:g}")
    return (float(raw) - low) / (high - low)
