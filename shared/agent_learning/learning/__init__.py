"""REINFORCE with a baseline: the one learner of the one policy model (numpy)."""
