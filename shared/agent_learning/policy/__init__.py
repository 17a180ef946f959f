"""The one policy model: a softmax over configurations with named dimensions (a list of actions is
one), an optional context and action features; choose, probabilities, the document round trip.
Pure Python: an agent imports it without numpy."""

from agent_learning.policy.decision import Decision
from agent_learning.policy.softmax import PolicySnapshot, SoftmaxPolicy, StructuredPolicy, load_policy

__all__ = ["Decision", "PolicySnapshot", "SoftmaxPolicy", "StructuredPolicy", "load_policy"]
