"""agent_learning: agents learn which configuration to use from judged experience.

The agent side needs only :mod:`agent_learning.policy`, :mod:`agent_learning.capture` and a
store; the learner (numpy) and the judges (azure-ai-evaluation) are imported only where
training and scoring run.
"""

__version__ = "0.1.0"
