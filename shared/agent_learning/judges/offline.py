"""A deterministic judge that needs no model: the embedded default.

It scores the same three metrics as azure-ai-evaluation, on the same scales, from the
episode's own content, so the whole pipeline runs offline and the same episode always gets
the same score. The rules:

* **Arithmetic questions** ("What is 17 + 25?", "Compute 6 * 7"): the judge computes the
  answer. Task completion is 1 when the last number in the output (``1,234`` read whole) is that answer.
  Intent resolution is 5 for a correct answer with an explanation, 4 for a bare correct
  answer, 2 for a wrong number, 3 for no number at all.
* **Other questions**: the share of the query's content words that the output covers,
  ``c``: intent resolution ``1 + round(4·c)``; task completion 1 when ``c >= 0.6``.
* **Task adherence** (instructions): 0 when the output is empty, when the instructions ask
  for an explanation ("explain", "step by step", "show") and the output is under 8 words, or
  when they ask for brevity ("only", "concise", "brief") and it is over 60 words; else 1.
* An empty output scores 1 / 0 / 0.

It is a stand-in for a model judge in demos and tests, not a measure of answer quality.
"""

from __future__ import annotations

import re
from typing import Any

from agent_learning.documents import Episode, JudgeInfo
from agent_learning.judges.base import Judge, Judgement, metric_from_output
from agent_learning.judges.metrics import INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION

VERSION = "offline-rules/2"
"""The rules' version, stored with every score they give (2: thousands separators read)."""

_NUM = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
"""A number, with or without thousands separators (``1,234.5``; ``42, 43`` is two numbers)."""
_ARITH = re.compile(rf"({_NUM})\s*([-+*x×/])\s*({_NUM})")
_NUMBER = re.compile(_NUM)
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "could",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "please",
        "should",
        "that",
        "the",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)
_EXPLAIN = ("explain", "step by step", "show")
_BRIEF = ("only", "concise", "brief")


def expected_answer(query: str) -> float | None:
    """The answer of the first ``a op b`` in ``query``, or ``None``."""
    m = _ARITH.search(query)
    if not m:
        return None
    a, op, b = _number(m.group(1)), m.group(2), _number(m.group(3))
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op in "*x×":
        return a * b
    return a / b if b != 0 else None


def _number(text: str) -> float:
    """The value of a number :data:`_NUM` matched."""
    return float(text.replace(",", ""))


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1}


class OfflineJudge(Judge):
    """Rules-based scoring of intent resolution, task adherence and task completion."""

    info = JudgeInfo(name="offline", model=VERSION)

    def judge(self, episode: Episode) -> Judgement:
        outputs = self.evaluate(episode.input, episode.output, episode.instructions or "")
        metrics = {
            name: metric_from_output(name, outputs[name], f"offline:{name}", VERSION)
            for name in (INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION)
        }
        return Judgement(metrics, self.info)

    @staticmethod
    def evaluate(query: str, response: str, instructions: str = "") -> dict[str, dict[str, Any]]:
        """Evaluator-shaped outputs for the three metrics (keys as in azure-ai-evaluation)."""
        text = response.strip()
        words = len(text.split())
        expected = expected_answer(query)
        if not text:
            intent, completion, why = 1.0, 0.0, "the response is empty"
        elif expected is not None:
            numbers = _NUMBER.findall(text)
            if not numbers:
                intent, completion, why = 3.0, 0.0, "no numeric answer given"
            elif abs(_number(numbers[-1]) - expected) < 1e-9:
                explained = words >= 8
                intent, completion = (5.0 if explained else 4.0), 1.0
                why = f"correct answer {numbers[-1]}" + (" with an explanation" if explained else "")
            else:
                intent, completion, why = 2.0, 0.0, f"answered {numbers[-1]}, expected {expected:g}"
        else:
            wanted = _content_words(query)
            covered = len(wanted & _content_words(text)) / len(wanted) if wanted else 1.0
            intent = float(1 + round(4 * covered))
            completion = 1.0 if covered >= 0.6 else 0.0
            why = f"covers {covered:.0%} of the question's key terms"

        lowered = instructions.lower()
        if not text:
            adherence, adherence_why = 0.0, "no response"
        elif any(k in lowered for k in _EXPLAIN) and words < 8:
            adherence, adherence_why = 0.0, f"instructions ask for an explanation; the response has {words} words"
        elif any(k in lowered for k in _BRIEF) and words > 60:
            adherence, adherence_why = 0.0, f"instructions ask for brevity; the response has {words} words"
        else:
            adherence, adherence_why = 1.0, "follows the instructions"

        def shaped(name: str, score: float, reason: str, threshold: float) -> dict[str, Any]:
            return {
                name: score,
                f"{name}_result": "pass" if score >= threshold else "fail",
                f"{name}_reason": reason,
                f"{name}_threshold": threshold,
            }

        return {
            INTENT_RESOLUTION: shaped(INTENT_RESOLUTION, intent, why, 3.0),
            TASK_ADHERENCE: shaped(TASK_ADHERENCE, adherence, adherence_why, 1.0),
            TASK_COMPLETION: shaped(TASK_COMPLETION, completion, why, 1.0),
        }
