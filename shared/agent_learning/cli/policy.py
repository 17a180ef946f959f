"""``agent-learn policy``: show, roll back, revise, pin and unpin an agent's policy."""

from __future__ import annotations

import difflib
import math
from typing import Any

import click
from rich.table import Table

from agent_learning.cli.access import _current, _store
from agent_learning.cli.init_policy import _actions_problem, _read_actions
from agent_learning.cli.options import _AsciiDigits, _note_text, agent_option, db_option, json_option
from agent_learning.cli.output import _echo_json, _n, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import InvalidDocument


@main.group(invoke_without_command=True)
@click.option("--agent-id", hidden=True, default=None)
@click.option("--json", "as_json", is_flag=True, hidden=True)
@db_option
@click.pass_context
def policy(ctx: click.Context, agent_id: str | None, as_json: bool, db: str | None) -> None:
    """Show, list, roll back, pin and unpin policies."""
    if db is not None:  # `policy --db FILE show ...`: the group's --db is the subcommands' default
        ctx.default_map = {name: {"db": db} for name in policy.commands}
    if ctx.invoked_subcommand is not None:
        return
    if agent_id is None:  # `agent-learn policy --agent-id X` is kept as `policy show`
        click.echo(ctx.get_help())
        return
    ctx.invoke(policy_show, agent_id=agent_id, as_json=as_json, db=db)


@policy.command("show")
@agent_option
@json_option
@db_option
@_handle_errors
def policy_show(agent_id: str, as_json: bool, db: str | None) -> None:
    """An agent's current policy: probabilities, logits and the last training run."""
    from agent_learning.ops.history import source_label
    from agent_learning.policy.softmax import policy_entropy, policy_probabilities
    with _store(db) as (store, settings):
        doc = _current(store, settings, agent_id)
    if doc.structured:
        _show_structured(doc, as_json)
        return
    if as_json:
        _echo_json(_shown(doc, dict(zip(doc.action_ids, policy_probabilities(doc), strict=True))))
        return
    state = f"{source_label(doc.source, doc.parent_version)}{', pinned' if doc.pinned else ''}"
    table = Table(title=f"{agent_id} v{doc.version} ({state})", title_justify="left")
    evidence = _evidence_columns(doc)
    described = any(a.description for a in doc.actions)
    columns = (("action",) + (("description",) if described else ()) + ("probability", "logit")
               + (("episodes (faded)", "mean reward") if evidence else ()))
    for col in columns:
        table.add_column(col, justify="left" if col in ("action", "description") else "right")
    for i, (a, p, logit) in enumerate(zip(doc.actions, policy_probabilities(doc), doc.logits, strict=True)):
        table.add_row(a.id, *((a.description,) if described else ()), f"{p:.4f}", f"{logit:+.3f}",
                      *(evidence[i] if evidence else ()))
    out.print(table)
    _pinned_and_last_run(doc, f"entropy {policy_entropy(policy_probabilities(doc)):.3f} nats")


def _shown(doc: Any, probabilities: dict[str, Any]) -> dict[str, Any]:
    """``policy show --json``: the document as stored, and beside it what is computed from it."""
    return {"policy": doc.to_dict(), "probabilities": probabilities}


def _pinned_and_last_run(doc: Any, entropy_line: str | None = None) -> None:
    """The end of ``policy show``: the note of a version no run made (a rollback's, a revision's),
    whether learning is paused, the entropy, the last run."""
    if doc.note and doc.run is None:
        out.print(f"note: {doc.note}")
    if doc.pinned:
        out.print(f"learning is paused{': ' + doc.pin_reason if doc.pin_reason else ''} (agent-learn policy unpin)")
    if entropy_line:
        out.print(entropy_line)
    if doc.run:
        m = doc.run.metrics
        # a run of corrections alone had no batch of episodes: no mean reward (its metric says 0.0)
        batch = (f", mean reward {m.get('mean_reward', float('nan')):.3f}" if doc.run.episodes
                 else f" ({_n(doc.run.corrections, 'correction row')})")
        out.print(f"last run {doc.run.id}: {_n(doc.run.episodes, 'episode')}{batch}, "
                  f"KL {m.get('kl', float('nan')):.4f}")


def _show_structured(doc: Any, as_json: bool) -> None:
    """``policy show`` of a structured policy: per dimension, each value's probability with no
    context and in each segment of each categorical feature, its logit and its evidence."""
    from agent_learning.ops.history import source_label
    from agent_learning.policy.softmax import NO_CONTEXT, segment_views
    views = segment_views(doc)
    if as_json:
        _echo_json(_shown(doc, views))
        return
    state = f"{source_label(doc.source, doc.parent_version)}{', pinned' if doc.pinned else ''}"
    out.print(f"{doc.agent_id} v{doc.version} ({state})")
    evidence = _evidence_columns(doc)
    logits = dict(zip(doc.action_ids, doc.logits, strict=True))
    rows = dict(zip(doc.action_ids, evidence or [], strict=False))
    segments = [k for k in views if k != NO_CONTEXT]
    for name, values in views[NO_CONTEXT].items():
        table = Table(title=f"{name}", title_justify="left")
        columns = ["value", NO_CONTEXT, *segments, "logit", *(("episodes (faded)", "mean reward") if evidence else ())]
        for col in columns:
            table.add_column(col, justify="left" if col == "value" else "right")
        for value_id, p in values.items():
            table.add_row(
                value_id.partition("=")[2],
                f"{p:.4f}",
                *(f"{views[seg][name][value_id]:.4f}" for seg in segments),
                f"{logits[value_id]:+.3f}",
                *(rows.get(value_id, ()) if evidence else ()),
            )
        out.print(table)
    _show_interactions(doc)
    for feature in doc.features or []:
        if not feature.segmented:
            out.print(f"numeric feature {feature.name}: centre {feature.center:.4g}, scale {feature.scale:.4g}"
                      + (" (of ln(1 + x))" if feature.transform == "log" else "")
                      + ("" if feature.weights else " (not learned yet)"))
        elif not feature.segments:
            out.print(f"categorical feature {feature.name}: no segments learned yet")
    _pinned_and_last_run(doc)


def _show_interactions(doc: Any) -> None:
    """``policy show``: each declared pair's joint logits J (added to its values' own logits), one
    row per value of the first dimension, one column per value of the second."""
    for interaction in doc.interactions or []:
        first, second = interaction.dimensions
        rows, cols = ([a.id.partition("=")[2] for a in doc.actions if a.id.startswith(f"{name}=")]
                      for name in (first, second))
        table = Table(title=f"interaction {first} × {second}: joint logits, added to the values' own",
                      title_justify="left")
        table.add_column(f"{first} \\ {second}", justify="left")
        for col in cols:
            table.add_column(col, justify="right")
        joint = interaction.logits or [0.0] * (len(rows) * len(cols))
        for v, row in enumerate(rows):
            table.add_row(row, *(f"{x:+.3f}" for x in joint[v * len(cols) : (v + 1) * len(cols)]))
        out.print(table)


def _evidence_columns(doc: Any) -> list[tuple[str, str]] | None:
    """Per action, the learner state's faded episode count and mean reward (None: no usable state)."""
    from agent_learning.learning.reinforce import Evidence
    evidence, problem = Evidence.from_state(doc.learner_state, len(doc.action_ids))
    if problem or not doc.learner_state:
        return None
    return [
        (f"{n:,.1f}", f"{s / n:.3f}" if n > 0 else "—")
        for n, s in zip(evidence.count.tolist(), evidence.reward_sum.tolist(), strict=True)
    ]


def _positive_version(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """VERSION as a policy version number: ``-1`` and ``abc`` are refused in one sentence, and an
    unknown ``--option`` (which ``ignore_unknown_options`` lets through) as what it is."""
    if value.startswith("--"):
        name, known = value.partition("=")[0], [o for p in ctx.command.params for o in p.opts if o.startswith("--")]
        raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, known), ctx=ctx)
    if problem := _AsciiDigits.problem(value):  # isdecimal() and int() take other scripts' digits too
        raise click.BadParameter(problem)
    if not value.isdecimal() or int(value) < 1:
        raise click.BadParameter(f"must be a positive integer (a policy version, as policy history lists), "
                                 f"got {value!r}")
    return int(value)


# ignore_unknown_options: `-1` reaches VERSION (to be refused there) rather than read as an option
@policy.command("rollback", context_settings={"ignore_unknown_options": True})
@agent_option
@click.argument("version", callback=_positive_version)
@click.option("--note", default="", callback=_note_text, help="Why (stored with the new version).")
@json_option
@db_option
@_handle_errors
def policy_rollback(agent_id: str, version: int, note: str, as_json: bool, db: str | None) -> None:
    """Publish VERSION's logits as a new version (history is never rewritten)."""
    from agent_learning.pipeline import rollback
    with _store(db) as (store, settings):
        try:
            before = _current(store, settings, agent_id).action_ids
        except InvalidDocument:
            before = None  # an invalid current document: the rollback replaces it
        change = rollback(store, agent_id, version, note=note)
    after = change.policy.action_ids  # across a revision the actions change too: say so
    back, gone = [a for a in after if a not in (before or after)], [a for a in before or [] if a not in after]
    done = (f"{agent_id} is now v{change.policy.version}, a copy of v{version}"
            + (f"; actions restored: {back}" if back else "")
            + (f"; actions removed: {gone} (their scores not trained yet are skipped)" if gone else ""))
    if change.replaced_invalid:
        done += (f"; it replaced an invalid current document ({change.replaced_invalid}): training resumes "
                 f"from v{change.resumed_from}'s cursor, the newest valid version record")
    if change.policy.pinned:  # a pin is state of the current document: the rollback keeps it
        done += "; learning stays paused (agent-learn policy unpin resumes it)"
    _report_change(change, as_json, done,
                   f"{agent_id} v{change.policy.version} is already a rollback to v{version}; nothing changed")


@policy.command("revise")
@agent_option
@click.option(
    "--actions",
    "actions_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="JSON file: the complete new list of actions (ids or {id, description, config} objects).",
)
@click.option("--rename", "renames", multiple=True, nargs=2, metavar="OLD NEW",
              help="An action renamed: NEW keeps OLD's logit and evidence (repeatable).")
@click.option("--note", default="", callback=_note_text, help="Why (stored with the new version).")
@json_option
@db_option
@_handle_errors
def policy_revise(agent_id: str, actions_file: str, renames: tuple[tuple[str, str], ...], note: str, as_json: bool,
                  db: str | None) -> None:
    """Change an agent's actions (add, remove, rename) as a new version; history is kept."""
    from agent_learning.pipeline import revise
    from agent_learning.policy.softmax import SoftmaxPolicy
    pairs = dict(renames)
    if len(pairs) < len(renames):
        old = next(o for o in pairs if sum(o == r for r, _ in renames) > 1)
        raise ValueError(f"--rename: {old} is renamed more than once; give each OLD once")
    listed = _read_actions(actions_file)
    if isinstance(listed, dict):
        raise ValueError(
            f"--actions: {actions_file} holds an object with dimensions; policy revise takes the complete new list "
            "of actions, and revising a policy's dimensions is not supported: create a new agent with them"
        )
    try:
        actions = SoftmaxPolicy.from_actions(agent_id, listed, exploration_floor=0.0).actions  # the floor kept: below
    except InvalidDocument as exc:
        raise _actions_problem(exc) from None
    with _store(db) as (store, settings):
        current = _current(store, settings, agent_id)
        if not current.dimensions and current.exploration_floor * len(actions) >= 1:
            fit = math.ceil(1 / current.exploration_floor) - 1
            raise ValueError(
                f"--actions: {len(actions)} actions x the exploration floor {current.exploration_floor} of "
                f"v{current.version} reaches 1 (a revision keeps the floor, each action's minimum probability); "
                f"at most {fit} actions fit"
            )
        change = revise(store, agent_id, list(actions), renames=pairs, note=note)
    _report_change(change, as_json, f"{agent_id} is now v{change.policy.version}: {change.policy.note}",
                   f"{agent_id} v{change.policy.version} already has these actions; nothing changed")


@policy.command("pin")
@agent_option
@click.option("--reason", default="", callback=_note_text, help="Why learning is paused (shown by `policy show`).")
@json_option
@db_option
@_handle_errors
def policy_pin(agent_id: str, reason: str, as_json: bool, db: str | None) -> None:
    """Freeze learning for an agent: the trainer leaves its policy alone until unpinned."""
    from agent_learning.pipeline import set_pinned
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        change = set_pinned(store, agent_id, True, reason)
    kept = change.policy.pin_reason
    _report_change(change, as_json, f"{agent_id} v{change.policy.version} is pinned: learning is paused",
                   f"{agent_id} was already pinned" + (f": {kept}" if kept else "")
                   + ("; it keeps that reason, not --reason (unpin, then pin, to change it)"
                      if reason and reason != kept else ""))


@policy.command("unpin")
@agent_option
@json_option
@db_option
@_handle_errors
def policy_unpin(agent_id: str, as_json: bool, db: str | None) -> None:
    """Resume learning; scores that arrived while pinned are learned on the next run."""
    from agent_learning.pipeline import set_pinned
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        change = set_pinned(store, agent_id, False)
    _report_change(change, as_json, f"{agent_id} is unpinned: learning resumes", f"{agent_id} was not pinned")


def _report_change(change: Any, as_json: bool, done: str, unchanged: str) -> None:
    if as_json:
        repaired = ({"replaced_invalid": change.replaced_invalid, "resumed_from": change.resumed_from}
                    if change.replaced_invalid else {})  # a rollback over an invalid current document
        _echo_json({"changed": change.changed, "policy": change.policy.to_dict(), **repaired})
    else:
        out.print(done if change.changed else unchanged)
