"""Declared interactions: two dimensions of a structured policy learned jointly.

A policy document may declare pairs of its dimensions (``interactions: [["depth", "tool"]]``, each
dimension in one pair at most). For the pair (d, e), values v of d and w of e, and the
interaction's table J (:class:`~agent_learning.documents.Interaction`: its ``logits``, per segment
c of a categorical feature f its offsets, per numeric feature j its weights) ::

    ℓ_{d,e}(v, w | x) = ℓ_d(v | x) + ℓ_e(w | x) + J_{vw} + Σ_f J_{f, x_f, vw} + Σ_j J_{j, vw} · x̃_j

and the pair is drawn as one dimension of K_d·K_e values, p_{d,e}(v, w | x) = f + (1 − K_d·K_e·f)
· softmax(ℓ_{d,e}(· | x) / T)_{vw}, the other dimensions each from its own p as before. Inside the
policy and the learner the pair *is* one dimension: the document's merged view
(:func:`merged_document`) has one value per pair (the first declared dimension's value slowest),
placed where the pair's earlier dimension is; :class:`Merge` maps its value indices to the
document's, so configuration ids and logged probabilities are the document's own. The learner
learns the merged logits as it learns any dimension's and writes them back
(:func:`declared_fields`): each pair's row and column means on the two dimensions' values, the
double-centred rest in J.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from agent_learning.documents import MAX_LOGIT, Action, Dimension, PolicyDocument, excluded_configurations
from agent_learning.documents.fields import JOINT_SEPARATOR

PAIR_NAME = "{}×{}"
"""The merged dimension's name (inside the policy and the learner only; no document's dimension
has a ``×`` in its name)."""


def is_pair(name: str) -> bool:
    """Whether a dimension of a merged view is a declared pair."""
    return "×" in name
DECIMALS = 6
"""Decimals the learned values are written with (as the learner writes logits and offsets)."""


@dataclass(frozen=True, slots=True)
class Merge:
    """How a policy's merged dimensions sit in the document's: per merged dimension, the document's
    dimensions in it (one, or a declared pair, first declared first)."""

    sizes: tuple[int, ...]
    """The document's dimensions' sizes."""
    parts: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, doc: PolicyDocument) -> Merge:
        dims = doc.dimensions or []
        index = {d.name: k for k, d in enumerate(dims)}
        pair_of: dict[int, tuple[int, int]] = {}
        for interaction in doc.interactions or []:
            first, second = (index[name] for name in interaction.dimensions)
            pair_of[first] = pair_of[second] = (first, second)
        parts: list[tuple[int, ...]] = []
        for k in range(len(dims)):
            pair = pair_of.get(k)
            if pair is None:
                parts.append((k,))
            elif k == min(pair):
                parts.append(pair)
        return cls(tuple(d.size for d in dims), tuple(parts))

    def split(self, local: Sequence[int]) -> tuple[int, ...]:
        """The document's value indices of a configuration given by the merged ones."""
        out = [0] * len(self.sizes)
        for part, i in zip(self.parts, local, strict=True):
            if len(part) == 1:
                out[part[0]] = i
            else:
                out[part[0]], out[part[1]] = divmod(i, self.sizes[part[1]])
        return tuple(out)

    def join(self, local: Sequence[int]) -> tuple[int, ...]:
        """The merged value indices of a configuration given by the document's."""
        return tuple(local[p[0]] if len(p) == 1 else local[p[0]] * self.sizes[p[1]] + local[p[1]] for p in self.parts)


def _blocks(values: Sequence[Any], dimensions: Sequence[Dimension] | None) -> list[Sequence[Any]]:
    """``values`` (one per action) cut into ``dimensions``."""
    out, at = [], 0
    for d in dimensions or []:
        out.append(values[at : at + d.size])
        at += d.size
    return out


def _merged(doc: PolicyDocument, merge: Merge, values: Sequence[float], table: Callable[[int], Any]) -> list[float]:
    """A per-action vector in the merged view: a pair's entry is its two values' plus J's
    (``table(i)``: the i-th interaction's table, None for zeros)."""
    blocks = _blocks(values, doc.dimensions)
    pairs = _pairs(doc)
    out: list[float] = []
    for part in merge.parts:
        if len(part) == 1:
            out.extend(blocks[part[0]])
            continue
        joint = table(pairs[part])
        first, second = blocks[part[0]], blocks[part[1]]
        out.extend(a + b + (joint[j] if joint else 0.0) for j, (a, b) in enumerate(product(first, second)))
    return out


def _pairs(doc: PolicyDocument) -> dict[tuple[int, ...], int]:
    """Each declared pair of dimension indices → its interaction's position."""
    index = {d.name: k for k, d in enumerate(doc.dimensions or [])}
    return {tuple(index[n] for n in it.dimensions): i for i, it in enumerate(doc.interactions or [])}


def merged_document(doc: PolicyDocument) -> PolicyDocument:
    """``doc`` with each declared pair of dimensions as one dimension of its pairs of values (module
    docstring), its logits, features and exclusions with them, and no interactions (not validated:
    the view only the policy and the learner use). ``doc`` itself without interactions."""
    if not doc.interactions:
        return doc
    merge = Merge.of(doc)
    interactions = doc.interactions
    actions = _blocks(doc.actions, doc.dimensions)
    names = [d.name for d in doc.dimensions or []]
    merged_actions: list[Action] = []
    dimensions = []
    for part in merge.parts:
        if len(part) == 1:
            merged_actions.extend(actions[part[0]])
            dimensions.append(Dimension.model_construct(name=names[part[0]], size=merge.sizes[part[0]]))
            continue
        for a, b in product(actions[part[0]], actions[part[1]]):
            merged_actions.append(Action.model_construct(
                id=f"{a.id}{JOINT_SEPARATOR}{b.id}", description="", config={**a.config, **b.config}, features=None))
        size = merge.sizes[part[0]] * merge.sizes[part[1]]
        dimensions.append(Dimension.model_construct(name=PAIR_NAME.format(names[part[0]], names[part[1]]), size=size))
    features = []
    for feature in doc.features or []:
        name = feature.name
        if feature.segments is not None:
            segments = {
                segment: _merged(doc, merge, offsets,
                                 lambda i, s=segment, n=name: ((interactions[i].segments or {}).get(n) or {}).get(s))
                for segment, offsets in feature.segments.items()
            }
            feature = feature.model_copy(update={"segments": segments})
        elif feature.weights is not None:
            weights = _merged(doc, merge, feature.weights, lambda i, n=name: (interactions[i].weights or {}).get(n))
            feature = feature.model_copy(update={"weights": weights})
        features.append(feature)
    value_ids = [[a.id.partition("=")[2] for a in block] for block in _blocks(merged_actions, dimensions)]
    rules = [{d.name: value_ids[k][i] for k, (d, i) in enumerate(zip(dimensions, merge.join(e), strict=True))}
             for e in excluded_configurations(doc)]
    return doc.model_copy(update={
        "actions": merged_actions,
        "logits": _merged(doc, merge, doc.logits, lambda i: interactions[i].logits),
        "dimensions": dimensions,
        "features": features if doc.features is not None else None,
        "excluded": rules or None,
        "interactions": None,
    })


def _declared(doc: PolicyDocument, merge: Merge, values: Sequence[float]) -> tuple[list[float], dict[int, list[float]]]:
    """A merged vector written back: one entry per action of ``doc`` and, per interaction, its J
    (each pair's row means on the first dimension's values, column means less the grand mean on
    the second's, the rest in J)."""
    out = [0.0] * len(doc.actions)
    starts = [0]
    for size in merge.sizes:
        starts.append(starts[-1] + size)
    pairs = _pairs(doc)
    tables: dict[int, list[float]] = {}
    at = 0
    for part in merge.parts:
        if len(part) == 1:
            k = merge.sizes[part[0]]
            out[starts[part[0]] : starts[part[0]] + k] = values[at : at + k]
            at += k
            continue
        kd, ke = merge.sizes[part[0]], merge.sizes[part[1]]
        joint = [float(x) for x in values[at : at + kd * ke]]
        at += kd * ke
        rows = [sum(joint[v * ke : (v + 1) * ke]) / ke for v in range(kd)]
        grand = sum(rows) / kd
        cols = [sum(joint[v * ke + w] for v in range(kd)) / kd - grand for w in range(ke)]
        out[starts[part[0]] : starts[part[0]] + kd] = rows
        out[starts[part[1]] : starts[part[1]] + ke] = cols
        tables[pairs[part]] = [joint[v * ke + w] - rows[v] - cols[w] for v in range(kd) for w in range(ke)]
    return [_rounded(x) for x in out], {i: [_rounded(x) for x in t] for i, t in tables.items()}


def _rounded(x: float) -> float:
    """A learned value as the document holds it (J may reach past a logit's bound only by
    decomposing one that was near it: held at the bound)."""
    return max(-MAX_LOGIT, min(MAX_LOGIT, round(float(x), DECIMALS)))


def declared_fields(
    doc: PolicyDocument, logits: Sequence[float], features: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any]:
    """The document fields ``logits``, ``features`` and ``interactions`` of ``doc`` from what the
    learner learned on its merged view (``features`` as the learner writes them, each with
    ``segments`` or ``weights`` over the merged values). Tables that are all 0 are left out."""
    merge = Merge.of(doc)
    theta, tables = _declared(doc, merge, logits)
    out_interactions: list[dict[str, Any]] = [{"dimensions": list(it.dimensions)} for it in doc.interactions or []]
    for i, table in tables.items():
        if any(table):
            out_interactions[i]["logits"] = table
    out_features = None
    if features is not None:
        out_features = []
        for feature in features:
            feature = dict(feature)
            name = feature["name"]
            if "segments" in feature:
                segments = {}
                for segment, offsets in feature["segments"].items():
                    segments[segment], by_pair = _declared(doc, merge, offsets)
                    for i, table in by_pair.items():
                        if any(table):
                            out_interactions[i].setdefault("segments", {}).setdefault(name, {})[segment] = table
                feature["segments"] = segments
            elif "weights" in feature:
                feature["weights"], by_pair = _declared(doc, merge, feature["weights"])
                for i, table in by_pair.items():
                    if any(table):
                        out_interactions[i].setdefault("weights", {})[name] = table
            out_features.append(feature)
    return {"logits": theta, "features": out_features, "interactions": out_interactions}
