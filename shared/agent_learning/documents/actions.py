"""Actions described by features: an action's categorical features (``{"genre": "comedy"}``), their
limits and check (:func:`check_action_features`), and :class:`Candidate`, an action offered to one
request with the features it was offered with (what an episode logs of the set it was chosen from)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_learning.documents.context import MAX_CONTEXT_VALUE_CHARS, check_context
from agent_learning.documents.fields import ActionId, _unset

MAX_CANDIDATES = 50
"""Actions one request may offer (``choose(actions=...)``), as Azure AI Personalizer's rank allowed."""
MAX_ACTION_FEATURES = 16
"""Features one action may carry (each a category) and action features one policy may declare."""
MAX_FEATURE_VALUES = 64
"""Values of one action feature a policy learns weights for; further values add nothing until a
policy is created with room for them."""


def check_action_features(features: Any) -> dict[str, str | bool | int]:
    """An action's features, checked: at most :data:`MAX_ACTION_FEATURES`, each named as a context
    feature is and each a category: a string of at most :data:`MAX_CONTEXT_VALUE_CHARS` characters, a
    boolean or an integer (a category named by its decimal form). Raises ``ValueError`` naming the
    feature; a fractional number is refused (numeric action features are not supported)."""
    checked = check_context(features)
    if len(checked) > MAX_ACTION_FEATURES:
        raise ValueError(f"has {len(checked)} features; the limit is {MAX_ACTION_FEATURES}")
    for name, value in checked.items():
        if isinstance(value, float):
            raise ValueError(
                f"{name}: must be a category (a string of at most {MAX_CONTEXT_VALUE_CHARS} characters, a boolean "
                f"or an integer), got the number {value!r:.40}: numeric action features are not supported"
            )
    return checked  # type: ignore[return-value]


class Candidate(BaseModel):
    """An action one request offered: its id and the features it was offered with (None: the
    policy's own for an action it has, none for another)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: ActionId
    features: dict[str, Any] | None = Field(None, exclude_if=_unset)

    @field_validator("features")
    @classmethod
    def _features(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else check_action_features(value)
