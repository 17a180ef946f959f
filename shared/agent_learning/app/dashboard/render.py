"""The dashboard's pages as HTML: tables and inline SVG charts, every stored string escaped.

Long lists are cut to pages (``?page=``) of :data:`PAGE_ROWS` rows, newest first, and each chart
draws at most :data:`MAX_LINES` lines: a page stays readable at 1,000 versions and 50 agents.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from agent_learning.app.dashboard.data import (
    AgentPage,
    AgentRow,
    Agreement,
    Overview,
    QueueState,
)
from agent_learning.app.dashboard.svg import COLOURS, MAX_POINTS, Chart

PAGE_ROWS = 50
"""Rows per page of a table (versions, agents)."""
MAX_LINES = 10
"""Most lines of a probability chart: the actions (or values) most likely at the newest version."""
MAX_SEGMENTS = 8
"""Most segments of a contextual policy charted (the others are named)."""
VERDICT_COLOURS = {"published": "#2ca02c", "shrunk": "#bcbd22", "held": "#d62728", "warned": "#ff7f0e",
                   "too_few_samples": "#7f7f7f"}
"""The colour of each guardrail verdict on the estimate chart."""

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; vertical-align: top; }
th, td:first-child, td.text { text-align: left; }
td.nowrap { white-space: nowrap; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; }
figure.chart { margin: 0; } figcaption { font-weight: 600; font-size: 0.9em; }
svg text { font-size: 10px; fill: #555; }
.legend { font-size: 0.78em; max-width: 640px; }
.key { margin-right: 0.8em; white-space: nowrap; }
.key i { display: inline-block; width: 10px; height: 10px; margin-right: 3px; }
.bad { color: #b00; font-weight: 600; } .ok { color: #080; } .muted { color: #777; }
.hold { background: #fde2e1; } .pin { background: #fff4cc; }
.warning { border-left: 4px solid #d62728; padding: 0.3em 0.8em; background: #fff5f5; }
.note { color: #666; font-size: 0.85em; }
nav a { margin-right: 1em; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: Iterable[str]) -> str:
    return "\n".join([
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        *body,
        "</body></html>",
    ])


class Links:
    """Links between the pages, relative to ``/api/`` wherever the dashboard is served, keeping the
    caller's function key (``code=``) so that following a link is allowed too."""

    def __init__(self, prefix: str, key: str | None) -> None:
        self.prefix, self.key = prefix, key

    def to(self, path: str, **query: Any) -> str:
        params = {k: v for k, v in query.items() if v is not None}
        if self.key:
            params["code"] = self.key
        return esc(self.prefix + path + (f"?{urlencode(params)}" if params else ""))

    def overview(self, **query: Any) -> str:
        return self.to("dashboard", **query)

    def agent(self, agent_id: str, **query: Any) -> str:
        return self.to(f"dashboard/agents/{quote(agent_id, safe='')}", **query)


def paged(rows: Sequence[Any], number: int) -> tuple[Sequence[Any], int, int]:
    """Page ``number`` (from 1, clamped) of ``rows``: its rows, the page number and how many pages."""
    pages = max(1, math.ceil(len(rows) / PAGE_ROWS))
    number = min(max(number, 1), pages)
    return rows[(number - 1) * PAGE_ROWS : number * PAGE_ROWS], number, pages


def pager(number: int, pages: int, total: int, what: str, link: Any) -> str:
    if pages == 1:
        return ""
    steps = []
    if number > 1:
        steps.append(f'<a href="{link(page=number - 1)}">newer</a>')
    if number < pages:
        steps.append(f'<a href="{link(page=number + 1)}">older</a>')
    return (f'<p class="note pager">page {number} of {pages} ({total:,} {esc(what)}, {PAGE_ROWS} a page) '
            + " ".join(steps) + "</p>")


def fmt(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def age(seconds: float | None) -> str:
    if seconds is None:
        return "empty"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def count_cell(n: int) -> str:
    """A count that should be 0: marked when it is not."""
    return f'<td class="bad">{n:,}</td>' if n else "<td>0</td>"


def verdict_cell(row: AgentRow) -> str:
    if not row.last_verdict:
        return '<td class="text muted">no run yet</td>'
    css = "hold" if row.last_verdict == "held" else ""
    return f'<td class="text {css}" title="{esc(row.last_verdict_reason)}">{esc(row.last_verdict)}</td>'


def agreement_text(a: Agreement) -> str:
    if a.rate is None:
        return '<span class="muted">no feedback</span>'
    css = "bad" if a.warning else ""
    return f'<span class="{css}">{a.rate:.0%} of {a.episodes:,}</span>'


def queues_section(queues: Sequence[QueueState], notes: Sequence[str] = ()) -> list[str]:
    out = ["<h2>Queues</h2>"]
    if queues:
        out.append("<table><tr><th>queue</th><th>depth</th><th>locked</th><th>dead letters</th>"
                   "<th>dead letters by reason</th><th>oldest message</th></tr>")
        for q in queues:
            if q.error:
                out.append(f'<tr><td>{esc(q.name)}</td><td class="text bad" colspan="5">cannot be read: '
                           f"{esc(q.error)}</td></tr>")
                continue
            reasons = ", ".join(f"{esc(r)}: {n:,}" for r, n in q.by_reason.items())
            out.append(f"<tr><td>{esc(q.name)}</td><td>{q.active:,}</td><td>{q.locked:,}</td>{count_cell(q.dead_letter)}"
                       f'<td class="text">{reasons}</td><td>{age(q.oldest_seconds)}</td></tr>')
        out.append("</table>")
    out.extend(f'<p class="note">{esc(n)}</p>' for n in notes)
    return out


def overview_html(o: Overview, links: Links, number: int, now: datetime) -> str:
    """The page of every agent at a glance, and the queues."""
    rows, number, pages = paged(o.agents, number)
    body = [
        "<h1>agent-learning: every agent</h1>",
        f'<p class="note">Read {now.strftime("%Y-%m-%d %H:%M:%S UTC")}; {len(o.agents):,} agents.</p>',
        '<table id="agents"><tr><th>agent</th><th>version</th><th>published</th><th>guardrail (last candidate)</th>'
        "<th>pinned</th><th>judging</th><th>judged / unjudged</th><th>lost</th><th>learned twice</th>"
        "<th>pending</th><th>dead letters</th><th>judge agrees with users</th></tr>",
    ]
    for r in rows:
        pinned = (f'<td class="text pin" title="{esc(r.pin_reason)}">pinned</td>' if r.pinned
                  else '<td class="text muted">no</td>')
        book = r.audit
        if book is None:  # not audited within the page's time (a note says so): no count, not 0
            books = '<td class="muted" title="not audited for this page: see the notes">—</td>' * 5
        else:
            lost, twice, dead = (count_cell(n) for n in (book.lost, book.learned_twice, book.dead_lettered))
            books = f"<td>{book.scored:,} / {book.unjudged:,}</td>{lost}{twice}<td>{book.pending:,}</td>{dead}"
        problem = f'<br><span class="bad">{esc(r.problem)}</span>' if r.problem else ""
        body.append(
            f'<tr class="agent"><td><a class="agent-link" href="{links.agent(r.agent_id)}">{esc(r.agent_id)}</a>'
            f"{problem}</td><td>v{r.version}</td><td>{esc(r.published_at)}</td>{verdict_cell(r)}{pinned}"
            f'<td class="text">{esc(r.judging)}</td>{books}<td>{agreement_text(r.agreement)}</td></tr>'
        )
    body.append("</table>")
    body.append(pager(number, pages, len(o.agents), "agents", links.overview))
    warnings = [r for r in o.agents if r.agreement.warning]
    if warnings:
        body.append("<h2>The judge against the users</h2>")
        body.extend(f'<p class="warning">{esc(r.agent_id)}: {esc(r.agreement.warning)}</p>' for r in warnings)
    body.extend(queues_section(o.queues, o.notes))
    return page("agent-learning dashboard", body)


def probability_chart(title: str, versions: Sequence[int], series: Mapping[str, Sequence[float | None]],
                      marks: Sequence[tuple[int, str, str, str]]) -> tuple[str, str]:
    """A chart of probabilities per version, one line per key of ``series`` (the :data:`MAX_LINES`
    likeliest at the newest version); returns it and a note naming what was left out."""
    def last(values: Sequence[float | None]) -> float:
        return next((v for v in reversed(values) if v is not None), 0.0)

    ranked = sorted(series, key=lambda k: -last(series[k]))
    chart = Chart(title, versions[0] if versions else 0, versions[-1] if versions else 1, 0.0, 1.0)
    for i, key in enumerate(ranked[:MAX_LINES]):
        points = [(v, p) for v, p in zip(versions, series[key], strict=True) if p is not None]
        chart.line(points, COLOURS[i % len(COLOURS)], key)
    for x, colour, label, css in marks:
        chart.mark(x, colour, label, css)
    left = len(ranked) - MAX_LINES
    return chart.svg(), f"{left} less likely lines not drawn" if left > 0 else ""


def agent_html(p: AgentPage, links: Links, number: int, now: datetime) -> str:
    """The page of one agent."""
    h, r = p.history, p.row
    marks = [(v, "#d62728", f"rollback to v{parent}", "rollback") for v, parent in p.rollbacks]
    if r.pinned and h.versions:
        marks.append((h.versions[-1], "#e6a800", f"pinned: {r.pin_reason}", "pin"))
    body = [
        f'<nav><a href="{links.overview()}">all agents</a></nav>',
        f'<h1>Agent <span id="agent-id">{esc(r.agent_id)}</span></h1>',
        f'<p class="note">Read {now.strftime("%Y-%m-%d %H:%M:%S UTC")}. Current version v{r.version}, published '
        f"{esc(r.published_at)}; judging {esc(r.judging)}.</p>",
    ]
    if r.pinned:
        body.append(f'<p class="warning pin">Learning is paused (pinned): {esc(r.pin_reason) or "no reason given"}</p>')
    if r.problem:
        body.append(f'<p class="warning">The current policy document does not validate: {esc(r.problem)}</p>')
    body.extend(f'<p class="warning drift">Drift at v{w.version} ({esc(w.kind)}): {esc(w.message)}</p>'
                for w in p.drift[-5:])
    if len(p.drift) > 5:
        body.append(f'<p class="note">{len(p.drift) - 5} earlier drift warnings not shown.</p>')
    body.extend(f'<p class="note">{esc(why)}</p>' for why in h.invalid[:5])

    charts, notes = [], []
    if h.versions:
        series = {a: [row[j] for row in h.probabilities] for j, a in enumerate(h.action_ids)}
        title = "probability per version (no context)" if h.segments else "action probability per version"
        chart, note = probability_chart(title, h.versions, series, marks)
        charts.append(chart)
        notes.append(note)
        for segment in list(h.segments)[:MAX_SEGMENTS]:
            values = h.segments[segment]
            keys = list(dict.fromkeys(k for v in values if v for k in v))
            seg_series = {k: [v.get(k) if v else None for v in values] for k in keys}
            chart, note = probability_chart(f"probability per version in {segment}", h.versions, seg_series, marks)
            charts.append(chart)
            notes.append(note)
        if len(h.segments) > MAX_SEGMENTS:
            notes.append(f"{len(h.segments) - MAX_SEGMENTS} more segments not charted: "
                         + ", ".join(list(h.segments)[MAX_SEGMENTS:MAX_SEGMENTS + 20]))
    charts.append(reward_chart(p, marks))
    charts.append(estimate_chart(p, marks))
    if r.agreement.windows:
        charts.append(agreement_chart(r.agreement))
    body.append('<h2>Learning</h2><div class="charts">' + "".join(charts) + "</div>")
    body.extend(f'<p class="note">{esc(n)}</p>' for n in notes if n)

    body.append("<h2>The judge against the users</h2>")
    if r.agreement.rate is None:
        body.append('<p class="muted">No feedback from users on judged episodes yet.</p>')
    else:
        body.append(f"<p>The judge agrees with users on {r.agreement.rate:.0%} of {r.agreement.episodes:,} "
                    "episodes with feedback.</p>")
    if r.agreement.warning:
        body.append(f'<p class="warning agreement">{esc(r.agreement.warning)}</p>')
    if r.agreement.note:
        body.append(f'<p class="note">{esc(r.agreement.note)}</p>')

    body.extend(actions_table(p))
    body.extend(versions_table(p, links, number))
    body.extend(held_table(p))
    return page(f"agent-learning: {r.agent_id}", body)


def reward_chart(p: AgentPage, marks: Sequence[tuple[int, str, str, str]]) -> str:
    """Mean reward per published run with its 95 % interval."""
    runs = [run for run in p.runs if run.status == "published" and run.mean is not None]
    lows = [run.low for run in runs if run.low is not None]
    highs = [run.high for run in runs if run.high is not None]
    y_low = min(lows, default=0.0)
    y_high = max(highs, default=1.0)
    xs = [run.version for run in runs] or [0, 1]
    chart = Chart("mean reward per run (95 % interval)", min(xs), max(xs), y_low, y_high)
    chart.band([(run.version, run.low) for run in runs if run.low is not None],
               [(run.version, run.high) for run in runs if run.high is not None], COLOURS[0])
    chart.line([(run.version, run.mean) for run in runs if run.mean is not None], COLOURS[0], "mean reward")
    for x, colour, label, css in marks:
        chart.mark(x, colour, label, css)
    return chart.svg()


def estimate_chart(p: AgentPage, marks: Sequence[tuple[int, str, str, str]]) -> str:
    """The guardrail's off-policy estimate of every candidate with its interval, coloured by its decision;
    a held candidate is a larger red dot. Beyond :data:`~agent_learning.app.dashboard.svg.MAX_POINTS`
    candidates, the published ones are a (thinned) line in the band of their intervals, and only the
    others are drawn one by one."""
    judged = [run for run in p.runs if run.estimate is not None]
    estimates = [(run.version, run.estimate) for run in judged if run.estimate is not None]
    xs = [x for x, _ in estimates] or [0, 1]
    chart = Chart("off-policy estimate of each candidate (guardrail)", min(xs), max(xs),
                  min((e[1] for _, e in estimates), default=0.0), max((e[2] for _, e in estimates), default=1.0))
    crowded = len(judged) > MAX_POINTS
    if crowded:
        published = [(run.version, run.estimate) for run in judged if run.verdict == "published" and run.estimate]
        colour = VERDICT_COLOURS["published"]
        chart.band([(x, e[1]) for x, e in published], [(x, e[2]) for x, e in published], colour)
        chart.line([(x, e[0]) for x, e in published], colour, "published", "estimate")
    shown: set[str] = {"published"} if crowded else set()
    for run in judged:
        if run.estimate is None or (crowded and run.verdict == "published"):
            continue
        value, low, high = run.estimate
        colour = VERDICT_COLOURS.get(run.verdict, "#555")
        tip = f"v{run.version}: {run.verdict} — {run.reason}"
        css = "hold" if run.verdict == "held" else "estimate"
        chart.interval(run.version, low, high, colour, css, tip)
        chart.dot((run.version, value), colour, css, tip, radius=4.5 if css == "hold" else 2.5)
        if run.verdict not in shown:
            shown.add(run.verdict)
            chart.legend.append((colour, run.verdict, css))
    for x, colour, label, css in marks:
        chart.mark(x, colour, label, css)
    return chart.svg()


def agreement_chart(a: Agreement) -> str:
    xs = list(range(1, len(a.windows) + 1))
    chart = Chart("judge agrees with users (share, over time)", xs[0], xs[-1], 0.0, 1.0)
    chart.line([(x, w[2]) for x, w in zip(xs, a.windows, strict=True)], COLOURS[2], "agreement")
    return chart.svg(x_label=f"stretch of feedback, oldest first (to {a.windows[-1][0]})")


def actions_table(p: AgentPage) -> list[str]:
    """The newest version's actions: id, description and probability (with no context)."""
    h = p.history
    if not h.documents:
        return []
    final = h.final
    actions = h.documents[-1].actions
    out = [f"<h2>Actions of v{h.versions[-1]} ({len(actions):,})</h2>",
           '<table id="actions"><tr><th>action</th><th>description</th><th>probability</th></tr>']
    out.extend(f'<tr><td>{esc(a.id)}</td><td class="text">{esc(a.description)}</td><td>{fmt(final.get(a.id))}</td>'
               "</tr>" for a in actions[:PAGE_ROWS])
    out.append("</table>")
    if len(actions) > PAGE_ROWS:
        out.append(f'<p class="note">The first {PAGE_ROWS} of {len(actions):,} actions.</p>')
    return out


def versions_table(p: AgentPage, links: Links, number: int) -> list[str]:
    h = p.history
    runs = {run.version: run for run in p.runs if run.status == "published"}
    order = list(range(len(h.versions)))[::-1]  # newest first
    rows, number, pages = paged(order, number)
    out = [f"<h2>Versions ({len(h.versions):,})</h2>",
           '<table id="versions"><tr><th>version</th><th>created</th><th>source</th><th>episodes</th>'
           "<th>mean reward</th><th>95 % interval</th><th>guardrail</th><th>estimate</th><th>entropy</th><th>note</th>"
           "</tr>"]
    for i in rows:
        version = h.versions[i]
        run = runs.get(version)
        css = ' class="pin"' if p.row.pinned and i == len(h.versions) - 1 else ""
        interval = f"{fmt(run.low)} – {fmt(run.high)}" if run and run.low is not None else ""
        estimate = (f"{fmt(run.estimate[0])} ({fmt(run.estimate[1])} – {fmt(run.estimate[2])})"
                    if run and run.estimate else "")
        verdict = f'<td class="text" title="{esc(run.reason)}">{esc(run.verdict)}</td>' if run else "<td></td>"
        out.append(f'<tr{css}><td>v{version}</td><td class="nowrap">{esc(p.created[i])}</td>'
                   f'<td class="text">{esc(p.sources[i])}</td>'
                   f"<td>{run.episodes if run else ''}</td><td>{fmt(h.mean_reward[i])}</td>"
                   f'<td class="nowrap">{interval}</td>'
                   f'{verdict}<td class="nowrap">{estimate}</td><td>{fmt(h.entropy[i])}</td>'
                   f'<td class="text">{esc(h.documents[i].note)}</td></tr>')
    out.append("</table>")
    out.append(pager(number, pages, len(h.versions), "versions", lambda **q: links.agent(p.row.agent_id, **q)))
    return out


def held_table(p: AgentPage) -> list[str]:
    held = [run for run in p.runs if run.status == "held"][::-1]
    if not held:
        return ['<h2>Candidates the guardrail held</h2><p class="muted">None.</p>']
    out = [f"<h2>Candidates the guardrail held ({len(held):,})</h2>",
           '<table id="held"><tr><th>candidate</th><th>finished</th><th>episodes</th><th>estimate</th><th>reason</th>'
           "</tr>"]
    for run in held[:PAGE_ROWS]:
        estimate = f"{fmt(run.estimate[0])} ({fmt(run.estimate[1])} – {fmt(run.estimate[2])})" if run.estimate else ""
        out.append(f'<tr class="hold"><td>v{run.version}</td><td class="nowrap">{esc(run.finished_at)}</td>'
                   f'<td>{run.episodes}</td><td>{estimate}</td><td class="text">{esc(run.reason)}</td></tr>')
    out.append("</table>")
    if len(held) > PAGE_ROWS:
        out.append(f'<p class="note">The newest {PAGE_ROWS} of {len(held):,} held candidates.</p>')
    return out


def not_found_html(agent_id: str, links: Links) -> str:
    return page("agent-learning: no such agent", [
        f'<nav><a href="{links.overview()}">all agents</a></nav>',
        f"<h1>No agent {esc(agent_id)!s}</h1><p>It has no current policy in this store.</p>",
    ])
