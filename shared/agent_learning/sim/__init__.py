"""Simulated agents and worlds with a known truth."""
