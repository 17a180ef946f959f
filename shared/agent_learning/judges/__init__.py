"""Judges behind one port: the offline rules judge (local default) and azure-ai-evaluation."""

from agent_learning.judges.base import InvalidJudgeOutput, Judge, Judgement, metric_from_output
from agent_learning.judges.offline import OfflineJudge

__all__ = ["InvalidJudgeOutput", "Judge", "Judgement", "OfflineJudge", "metric_from_output"]
