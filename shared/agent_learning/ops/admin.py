"""Operators' interventions on a policy: roll back, pin and unpin.

They live with every other write of the current policy in :mod:`agent_learning.pipeline.publish`;
this module keeps their names where they have always been importable.
"""

from agent_learning.pipeline.publish import ATTEMPTS, Change, rollback, set_pinned

__all__ = ["ATTEMPTS", "Change", "rollback", "set_pinned"]
