"""``agent-learn report``: the policy charts as a PNG and as a self-contained HTML page.

Both show the same figure (:func:`agent_learning.ops.plots.history_figure`): action probabilities
over versions, mean reward and entropy per version, one row per agent. The page embeds the
PNG as a data URI and adds a table of every version, so it needs no network and no other
file. A contextual policy's table, like ``policy history``, gives the probabilities and the
entropy with no context, and says so; the chart draws them per segment.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from agent_learning.ops.history import AgentHistory, source_label
from agent_learning.ops.plots import close, data_lines, history_figure, png_bytes

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0 2em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; }
"""


@dataclass(frozen=True)
class ReportFiles:
    png: Path
    html: Path
    series: dict[str, list[int]]
    """Lines per panel and agent (probabilities, mean reward, entropy)."""


def write_report(
    histories: Sequence[AgentHistory],
    png_path: str | Path,
    html_path: str | Path,
    title: str = "agent-learning",
    smooth: int | None = None,
    headings: Mapping[str, str] | None = None,
) -> ReportFiles:
    """Write the PNG and the HTML page; returns where, and how many data series each panel holds.
    ``headings`` says, per agent, what its versions are (``14 policy versions, the newest 4 charted``)."""
    fig = history_figure(histories, title, smooth)
    try:
        png = png_bytes(fig)
        series = {h.agent_id: [len(data_lines(ax)) for ax in fig.axes[3 * i : 3 * i + 3]]
                  for i, h in enumerate(histories)}
    finally:
        close(fig)
    png_out, html_out = Path(png_path), Path(html_path)
    for out in (png_out, html_out):
        out.parent.mkdir(parents=True, exist_ok=True)
    png_out.write_bytes(png)
    html_out.write_text(render_html(histories, png, title, headings), encoding="utf-8")
    return ReportFiles(png_out, html_out, series)


def render_html(histories: Sequence[AgentHistory], png: bytes, title: str,
                headings: Mapping[str, str] | None = None) -> str:
    """The page: the chart as a data URI and one table of versions per agent, headed by its id and
    its ``headings`` entry, if any."""
    esc = html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p>Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.</p>",
        f'<img alt="action probabilities, mean reward and entropy per policy version" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">',
    ]
    for h in histories:
        heading = (headings or {}).get(h.agent_id)
        parts.append(f"<h2>{esc(h.agent_id)}{': ' + esc(heading) if heading else ''}</h2>")
        if h.segments:  # agents draw from their segment's probabilities, which the chart shows
            parts.append("<p>Each value's probability in its dimension, and the entropy, with no context (what a "
                         "request without features gets); the chart gives the probabilities per segment.</p>")
        parts.append("<table><tr><th>version</th><th>source</th>")
        parts.extend(f"<th>{esc(a)}</th>" for a in h.action_ids)
        parts.append("<th>mean reward</th><th>entropy</th></tr>")
        for i, version in enumerate(h.versions):
            doc = h.documents[i] if i < len(h.documents) else None
            source = source_label(doc.source, doc.parent_version) if doc else ""
            reward = h.mean_reward[i]
            entropy = h.entropy[i]
            cells = [f"<td>{version}</td><td>{esc(source)}</td>"]
            cells.extend(f"<td>{'—' if p is None else f'{p:.3f}'}</td>" for p in h.probabilities[i])
            cells.append(f"<td>{'' if reward is None else f'{reward:.3f}'}</td>")
            cells.append(f"<td>{'' if entropy is None else f'{entropy:.3f}'}</td>")
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)
