"""Charts of how policies evolve: action probabilities, mean reward and entropy per version.

matplotlib is an optional dependency (``pip install 'agent-learning[plot]'``); it is
imported only here, with the non-interactive Agg backend.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    try:
        import matplotlib  # lazy: an optional extra, and slow to import
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("plots need matplotlib: pip install 'agent-learning[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def history_figure(histories: Sequence[Any], title: str = "agent-learning") -> Any:
    """One row per agent: action probabilities, mean reward and entropy per version.

    ``histories`` are :class:`agent_learning.history.AgentHistory` objects. The probability
    panel has one line per action; the reward panel one line (plus a dashed line at the best
    action's true mean when the history knows it, as the demo's do); the entropy panel one
    line. Returns the matplotlib figure (close it with :func:`close`).
    """
    plt = _pyplot()
    rows = max(1, len(histories))
    fig, axes = plt.subplots(rows, 3, figsize=(16, 3.6 * rows), squeeze=False)
    for row, h in zip(axes, histories, strict=False):
        ax_p, ax_r, ax_h = row
        best = h.best_action if getattr(h, "expected_rewards", None) else None
        for j, action in enumerate(h.action_ids):
            series = [math.nan if p[j] is None else p[j] for p in h.probabilities]  # a gap where it was absent
            label = f"{action} (best)" if action == best else action
            ax_p.plot(h.versions, series, label=label, linewidth=2.4 if action == best else 1.4)
        ax_p.set_ylim(0, 1)
        _decorate(ax_p, "probability", f"{h.agent_id}: action probabilities")
        ax_p.legend(loc="center right", fontsize=8)

        points = [(v, m) for v, m in zip(h.versions, h.mean_reward, strict=True) if m is not None]
        ax_r.plot([v for v, _ in points], [m for _, m in points], color="tab:green", marker=".", label="mean reward")
        if best is not None:
            ax_r.axhline(
                h.expected_rewards[best],
                color="grey",
                linestyle="--",
                linewidth=1,
                label=f"best action's true mean ({best})",
            )
        _decorate(ax_r, "mean reward of the batch", f"{h.agent_id}: mean reward per training run")
        ax_r.legend(loc="lower right", fontsize=8)

        ax_h.plot(h.versions, h.entropy, color="tab:purple", marker=".", label="entropy")
        _decorate(ax_h, "entropy (nats)", f"{h.agent_id}: policy entropy")
        ax_h.set_ylim(bottom=0)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _decorate(ax: Any, ylabel: str, title: str) -> None:
    ax.set_xlabel("policy version")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)


def save_png(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as a PNG (folders created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def png_bytes(fig: Any) -> bytes:
    """``fig`` as PNG bytes, as :func:`save_png` writes it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def close(fig: Any) -> None:
    _pyplot().close(fig)


def plot_histories(histories: Sequence[Any], path: str | Path, title: str = "agent-learning") -> Path:
    """:func:`history_figure` written to ``path`` as a PNG. Returns the path."""
    fig = history_figure(histories, title)
    try:
        return save_png(fig, path)
    finally:
        close(fig)
