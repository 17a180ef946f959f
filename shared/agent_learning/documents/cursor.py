""":class:`ScoreCursor`: a position in an agent's score stream, how far training has read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent_learning.documents.fields import Count, ScoreId


class ScoreCursor(BaseModel):
    """Position in an agent's score stream: scores are ordered by ``(seq, id)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: Count
    id: ScoreId

    def __lt__(self, other: ScoreCursor) -> bool:
        return (self.seq, self.id) < (other.seq, other.id)

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> ScoreCursor:
        """The position of a score row as a store's ``read_scores`` returns it."""
        return cls(seq=int(row["seq"]), id=str(row["id"]))
