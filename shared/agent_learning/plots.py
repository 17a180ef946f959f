"""Charts of how policies evolve: action probabilities and mean reward per version.

matplotlib is an optional dependency (``pip install 'agent-learning[plot]'``); it is
imported only here, with the non-interactive Agg backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot_histories(histories: Sequence[Any], path: str | Path, title: str = "agent-learning") -> Path:
    """One row per agent: action probabilities (left) and mean reward (right) per version.

    ``histories`` are :class:`agent_learning.demo.AgentHistory` objects. Returns the path.
    """
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("plots need matplotlib: pip install 'agent-learning[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(1, len(histories))
    fig, axes = plt.subplots(rows, 2, figsize=(12, 3.6 * rows), squeeze=False)
    for row, h in zip(axes, histories, strict=False):
        ax_p, ax_r = row
        best = h.best_action if getattr(h, "expected_rewards", None) else None
        for j, action in enumerate(h.action_ids):
            series = [p[j] for p in h.probabilities]
            label = f"{action} (best)" if action == best else action
            ax_p.plot(h.versions, series, label=label, linewidth=2.4 if action == best else 1.4)
        ax_p.set_ylim(0, 1)
        ax_p.set_xlabel("policy version")
        ax_p.set_ylabel("probability")
        ax_p.set_title(f"{h.agent_id}: action probabilities")
        ax_p.legend(loc="center right", fontsize=8)
        ax_p.grid(alpha=0.3)

        points = [(v, m) for v, m in zip(h.versions, h.mean_reward, strict=True) if m is not None]
        if points:
            ax_r.plot(
                [v for v, _ in points], [m for _, m in points], color="tab:green", marker=".", label="mean reward"
            )
        if getattr(h, "expected_rewards", None):
            ax_r.axhline(
                h.expected_rewards[best],
                color="grey",
                linestyle="--",
                linewidth=1,
                label=f"best action's true mean ({best})",
            )
        ax_r.set_xlabel("policy version")
        ax_r.set_ylabel("mean reward of the batch")
        ax_r.set_title(f"{h.agent_id}: mean reward per training run")
        ax_r.legend(loc="lower right", fontsize=8)
        ax_r.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
