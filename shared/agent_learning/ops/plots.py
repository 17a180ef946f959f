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


MARKS = {
    "rollback": {"color": "tab:red", "linestyle": "--", "label": "rollback"},
    "revise": {"color": "tab:orange", "linestyle": ":", "label": "actions revised"},
}
"""How versions made by an operator are marked on every panel (by the version's ``source``)."""

MARK = "mark"
"""The ``gid`` of a mark's line, so that counts of data series leave marks out."""


def auto_smooth(versions: int) -> int:
    """The smoothing window for this many versions: none up to 100, then about 50 points' worth."""
    return 1 if versions <= 100 else max(2, versions // 50)


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """The trailing mean of the last ``window`` values at each point (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def history_figure(histories: Sequence[Any], title: str = "agent-learning", smooth: int | None = None) -> Any:
    """One row per agent: action probabilities, mean reward and entropy per version.

    ``histories`` are :class:`agent_learning.ops.history.AgentHistory` objects. The probability
    panel has one line per action; the reward panel one line (plus a dashed line at the best
    action's true mean when the history knows it, as the demo's do); the entropy panel one
    line. With ``smooth`` > 1 (default: :func:`auto_smooth`) the reward and entropy lines are
    trailing means over that many versions, drawn over the raw values (faint, unlabelled), and
    the guardrail's estimates a trailing mean in the band of their intervals' mean bounds.
    Rollbacks and revisions are vertical lines on every panel (:data:`MARKS`), and a pinned
    policy a dash-dot line at its latest version. The three panels of a row share their axis
    of version numbers; a version with no neighbour on its line (an agent's only version) is
    drawn as a point, and a reward panel without a training run says so. Returns the
    matplotlib figure (close it with :func:`close`).
    """
    plt = _pyplot()
    rows = max(1, len(histories))
    fig, axes = plt.subplots(rows, 3, figsize=(16, 3.6 * rows), squeeze=False, sharex="row")
    for row, h in zip(axes, histories, strict=False):
        ax_p, ax_r, ax_h = row
        window = smooth or auto_smooth(len(h.versions))
        best = h.best_action if getattr(h, "expected_rewards", None) else None
        if getattr(h, "segments", None):
            _segment_lines(ax_p, h)
        else:
            for j, action in enumerate(h.action_ids):
                series = [math.nan if p[j] is None else p[j] for p in h.probabilities]  # a gap where it was absent
                label = f"{action} (best)" if action == best else action
                ax_p.plot(h.versions, series, label=label, linewidth=2.4 if action == best else 1.4,
                          **_lone_points(series))
            _decorate(ax_p, "probability", f"{h.agent_id}: action probabilities")
        ax_p.set_ylim(0, 1)

        points = [(v, m) for v, m in zip(h.versions, h.mean_reward, strict=True) if m is not None]
        _series(ax_r, [v for v, _ in points], [m for _, m in points], window, "tab:green", "mean reward")
        if best is not None:
            ax_r.axhline(
                h.expected_rewards[best],
                color="grey",
                linestyle="--",
                linewidth=1,
                label=f"best action's true mean ({best})",
            )
        if not points:
            ax_r.text(0.5, 0.5, "no training run yet", transform=ax_r.transAxes, ha="center", va="center",
                      color="grey")
        _estimates(ax_r, h, window)
        _decorate(ax_r, "mean reward of the batch", f"{h.agent_id}: mean reward per training run")

        entropy = [(v, e) for v, e in zip(h.versions, h.entropy, strict=True) if e is not None]
        _series(ax_h, [v for v, _ in entropy], [e for _, e in entropy], window, "tab:purple", "entropy")
        no_context = " with no context" if getattr(h, "segments", None) else ""  # as history() computes it
        _decorate(ax_h, "entropy (nats)", f"{h.agent_id}: policy entropy{no_context}")
        ax_h.set_ylim(bottom=0)
        for ax in row:
            _marks(ax, h)
        for ax, where in zip(row, ("center right", "lower right", "upper right"), strict=True):
            if ax.get_legend_handles_labels()[0]:  # a reward panel without a run may have nothing to name
                ax.legend(loc=where, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _estimates(ax: Any, h: Any, window: int) -> None:
    """Each version's off-policy estimate before it was published, with its interval; with
    ``window`` > 1, the trailing mean of the estimates and of their bounds, as a line in a band
    (hundreds of error bars hide the reward)."""
    known = [(v, e) for v, e in zip(h.versions, getattr(h, "estimates", []) or [], strict=False) if e is not None]
    if not known:
        return
    x = [v for v, _ in known]
    y, low, high = ([e[i] for _, e in known] for i in range(3))
    if window <= 1:
        below = [v - lo for v, lo in zip(y, low, strict=True)]
        above = [hi - v for v, hi in zip(y, high, strict=True)]
        ax.errorbar(x, y, yerr=[below, above], fmt=".", color="tab:orange", alpha=0.6, elinewidth=0.8, markersize=3,
                    label="estimate before publishing (SNIPS, interval)")
        return
    ax.fill_between(x, rolling_mean(low, window), rolling_mean(high, window), color="tab:orange", alpha=0.15,
                    linewidth=0)
    ax.plot(x, rolling_mean(y, window), color="tab:orange", linewidth=1.2,
            label=f"estimate before publishing (SNIPS), mean of {window} versions, in its interval")


SEGMENT_STYLES = ("-", "--", ":", "-.")
"""Line styles that tell a structured agent's segments apart (colours tell the values apart)."""


def _segment_lines(ax: Any, h: Any) -> None:
    """A structured agent's first dimension: each value's probability in each segment (colour per
    value, line style per segment), the segment's best value (when known) drawn thicker."""
    first = h.documents[-1].dimensions[0].name if h.documents[-1].dimensions else None
    values = [a for a in h.action_ids if first is None or a.startswith(f"{first}=")]
    best = {segment: config for segment, (config, _, _) in h.best_by_segment().items()}
    colours = {value: f"C{j}" for j, value in enumerate(values)}
    for k, (segment, series) in enumerate(h.segments.items()):
        for value in values:
            ys = [math.nan if view is None else view.get(value, math.nan) for view in series]
            is_best = value in best.get(segment, "").split(":")
            ax.plot(h.versions, ys, color=colours[value], linestyle=SEGMENT_STYLES[k % len(SEGMENT_STYLES)],
                    linewidth=2.4 if is_best else 1.2, label=f"{value.partition('=')[2]} | {segment}",
                    **_lone_points(ys))
    _decorate(ax, "probability", f"{h.agent_id}: {first or 'action'} probability per segment")


def _lone_points(ys: Sequence[float]) -> dict[str, Any]:
    """Plot arguments that mark the values with no value next to them, which a line alone leaves
    invisible (an agent's only version, a value present in one version between gaps)."""
    known = [not math.isnan(y) for y in ys]
    lone = [i for i, k in enumerate(known)
            if k and not (i > 0 and known[i - 1]) and not (i + 1 < len(known) and known[i + 1])]
    return {"marker": "o", "markersize": 4, "markevery": lone} if lone else {}


def _series(ax: Any, x: list[Any], y: list[float], window: int, color: str, label: str) -> None:
    if not x:
        return
    if window <= 1:
        ax.plot(x, y, color=color, marker=".", label=label)
        return
    ax.plot(x, y, color=color, alpha=0.25, linewidth=0.8)
    ax.plot(x, rolling_mean(y, window), color=color, linewidth=2, label=f"{label}, mean of {window} versions")


def _marks(ax: Any, h: Any) -> None:
    """Vertical lines at the versions operators made, and at a pinned policy; one legend entry each."""
    labelled: set[str] = set()
    for version, doc in zip(h.versions, h.documents, strict=False):
        style = MARKS.get(doc.source)
        if style is None:
            continue
        label = style["label"] if style["label"] not in labelled else None
        labelled.add(style["label"])
        ax.axvline(version, color=style["color"], linestyle=style["linestyle"], linewidth=1, label=label, gid=MARK)
    if getattr(h, "pinned", False) and h.versions:
        ax.axvline(h.versions[-1], color="black", linestyle="-.", linewidth=1, label="pinned: learning paused",
                   gid=MARK)


def _decorate(ax: Any, ylabel: str, title: str) -> None:
    from matplotlib.ticker import MaxNLocator  # lazy, as matplotlib itself (see _pyplot)

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # versions are whole numbers
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


def data_lines(ax: Any) -> list[Any]:
    """The lines of a panel that are data, not marks."""
    return [line for line in ax.get_lines() if line.get_gid() != MARK]


def plot_histories(histories: Sequence[Any], path: str | Path, title: str = "agent-learning") -> Path:
    """:func:`history_figure` written to ``path`` as a PNG. Returns the path."""
    fig = history_figure(histories, title)
    try:
        return save_png(fig, path)
    finally:
        close(fig)
