"""What a policy's ``choose()`` returns, and the check of the context it is given."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from .documents import check_context, policy_doc_id
from .errors import InvalidDocument


class Decision(NamedTuple):
    """The outcome of a policy's ``choose()``: what to run and how likely it was.

    Immutable; a named tuple because agents make one per request and it is the cheapest
    immutable record Python builds (``choose`` stays within a few microseconds)."""

    agent_id: str
    action_id: str
    index: int
    probability: float
    logprob: float
    version: int
    config: Mapping[str, Any] = MappingProxyType({})
    """What to run: the action's settings, or one value per dimension of a structured policy."""
    context: Mapping[str, Any] | None = None
    """The request's features it was chosen for (``choose(context=...)``), logged with the episode."""

    @property
    def policy_id(self) -> str:
        """The id of the policy version document the action was drawn from."""
        return policy_doc_id(self.agent_id, self.version)


def validated_context(context: Any) -> dict[str, Any]:
    """``context`` checked, or :class:`InvalidDocument` naming the feature and the problem."""
    try:
        return check_context(context)
    except ValueError as exc:
        name, sep, problem = str(exc).partition(": ")
        field = f"context.{name}" if sep and isinstance(context, Mapping) and name in context else "context"
        raise InvalidDocument("context", [(field, problem if field != "context" else str(exc))]) from None
