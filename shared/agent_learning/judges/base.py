"""The judge port: an episode in, validated per-metric scores out.

Judges report failures by class: :class:`~agent_learning.core.errors.TransientError` (try the
message again later) or :class:`~agent_learning.core.errors.PermanentError` (dead-letter it). A
judge never returns a partial judgement and never stands in a default for a failed metric.

Evaluator outputs follow azure-ai-evaluation's shape: ``<metric>`` (the raw score),
``<metric>_result`` ("pass"/"fail"/"not_applicable"), ``<metric>_reason`` and
``<metric>_threshold``. :func:`metric_from_output` validates one such output and normalises it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_learning.core.errors import PermanentError
from agent_learning.documents import MAX_STEP_TEXT_CHARS, Episode, JudgeInfo, MetricScore
from agent_learning.judges.metrics import normalise


@dataclass(frozen=True)
class Judgement:
    """All metrics of one episode and which judge produced them."""

    metrics: dict[str, MetricScore]
    judge: JudgeInfo


class Judge(ABC):
    """Scores episodes. Implementations must be safe to call from several threads."""

    @abstractmethod
    def judge(self, episode: Episode) -> Judgement:
        """Score every metric of ``episode`` or raise Transient/PermanentError."""

    def close(self) -> None:
        """Release clients and threads."""
        return None


class InvalidJudgeOutput(PermanentError):
    """An evaluator returned something that is not a valid score."""


def _count(output: Mapping[str, Any], metric: str, part: str) -> int | None:
    """The token count an evaluator reports for its judge call: ``prompt_tokens`` in the output's
    ``<metric>_properties`` (azure-ai-evaluation 1.18), else a ``<key>_prompt_tokens`` field;
    None without one."""
    properties = output.get(f"{metric}_properties")
    found = [properties.get(part)] if isinstance(properties, Mapping) else []
    found += [value for key, value in output.items() if key.endswith(f"_{part}")]
    for value in found:
        if isinstance(value, bool):
            continue
        try:
            count = int(value)
        except (TypeError, ValueError):
            continue
        if count >= 0:
            return count
    return None


def metric_from_output(metric: str, output: Mapping[str, Any], evaluator: str, evaluator_version: str) -> MetricScore:
    """Validate an evaluator's output dict for ``metric`` and build a :class:`MetricScore`.

    Rejects a missing, null, non-numeric, non-finite or out-of-scale score, a "not_applicable"
    verdict (the judge declined to score) and an unknown result status; evaluators accept some
    of these as a pass, this does not.
    """
    if output.get(f"{metric}_result") == "not_applicable":
        why = str(output.get(f"{metric}_reason") or "no reason given")[:300]
        raise InvalidJudgeOutput(f"{evaluator}: the judge model gave no {metric} score, only 'not applicable' ({why})")
    if metric not in output:
        raise InvalidJudgeOutput(f"{evaluator}: output has no {metric!r} field (keys: {sorted(output)})")
    raw = output[metric]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidJudgeOutput(f"{evaluator}: {metric} must be a number, got {raw!r}")
    if not math.isfinite(raw):
        raise InvalidJudgeOutput(f"{evaluator}: {metric} must be finite, got {raw!r}")
    try:
        normalised = normalise(metric, float(raw))
    except ValueError as exc:
        raise InvalidJudgeOutput(f"{evaluator}: {exc}") from None
    result = output.get(f"{metric}_result")
    if result is not None and result not in ("pass", "fail", "not_applicable"):
        raise InvalidJudgeOutput(f"{evaluator}: {metric}_result must be pass/fail/not_applicable, got {result!r}")
    threshold = output.get(f"{metric}_threshold")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold)
    ):
        threshold = None
    reason = output.get(f"{metric}_reason") or ""
    tokens = {part: _count(output, metric, part) for part in ("prompt_tokens", "completion_tokens")}
    return MetricScore(**tokens,
        raw=float(raw),
        normalised=normalised,
        result=result,
        threshold=float(threshold) if threshold is not None else None,
        reason=str(reason)[:MAX_STEP_TEXT_CHARS],
        evaluator=evaluator,
        evaluator_version=evaluator_version,
    )
