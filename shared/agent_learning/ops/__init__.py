"""What operators run: audit, recovery, history, reports and plots, counterfactual replay."""
