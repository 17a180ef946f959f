"""Leaves every layer may use: errors, clock, notices, telemetry, limits."""
