"""What operators run: audit, recovery, rollback and pins, history, reports and plots, candidates."""
