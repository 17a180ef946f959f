"""What a policy's ``choose()`` returns, and the check of the context it is given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, NoReturn

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import Action, Candidate, check_context, policy_doc_id


def _read_only(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(
        "a decision's config is read-only: every decision of its action shares it; "
        "change a copy (copy.deepcopy(decision.config), or dict(decision.config) for its top level)"
    )


class ReadOnlyDict(dict[str, Any]):
    """A decision's config, or an object in it: a ``dict`` (``json.dumps`` takes it) that cannot
    be changed, since every decision of the same action shares it. Copies are plain dicts."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self) -> tuple[Any, ...]:  # copy, deepcopy and pickle give a plain dict
        return dict, (dict(self),)


class ReadOnlyList(list[Any]):
    """A list in a decision's config: a ``list`` that cannot be changed. Copies are plain lists."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
    append = extend = insert = pop = remove = clear = sort = reverse = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)


def read_only(value: Any) -> Any:
    """``value`` (JSON: a config or one of its values) with every dict and list in it made read-only."""
    if isinstance(value, dict):
        return ReadOnlyDict({k: read_only(v) for k, v in value.items()})
    if isinstance(value, list):
        return ReadOnlyList([read_only(v) for v in value])
    return value


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
    config: Mapping[str, Any] = ReadOnlyDict()
    """What to run: the action's settings, or one value per dimension of a structured policy.
    A read-only dict (:class:`ReadOnlyDict`), shared by every decision of the action: change a copy."""
    context: Mapping[str, Any] | None = None
    """The request's features it was chosen for (``choose(context=...)``), logged with the episode;
    ``None`` without features (an empty context included, as the episode stores it)."""
    incarnation: str | None = None
    """The policy's incarnation (``PolicyDocument.incarnation``), which the episode carries."""
    candidates: tuple[Candidate, ...] | None = None
    """The actions the request offered (``choose(actions=...)``) with their features, which the
    episode carries: ``probability`` is the action's among them; ``index`` its position there."""

    @property
    def action(self) -> Action:
        """The action drawn, as an :class:`~agent_learning.documents.Action` (``decision.action.id``)."""
        return Action.model_construct(id=self.action_id, description="", config=self.config)

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
