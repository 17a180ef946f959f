""":class:`PolicyDocument`: an agent's softmax policy, a version or the current document, with its
actions, dimensions, exclusion rules and context features."""

# ruff: noqa: RUF012 - pydantic copies field defaults; ruff sees Document is a BaseModel only in its own file

from __future__ import annotations

import math
from itertools import product
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from agent_learning.core.errors import InvalidDocument, StoredDocumentInvalid
from agent_learning.documents.actions import MAX_ACTION_FEATURES, MAX_FEATURE_VALUES, check_action_features
from agent_learning.documents.base import Document
from agent_learning.documents.context import CONTEXT_NAME, MAX_CONTEXT_FEATURES, MAX_CONTEXT_VALUE_CHARS
from agent_learning.documents.cursor import ScoreCursor
from agent_learning.documents.fields import (
    MAX_ACTIONS,
    MAX_JSON_CHARS,
    MAX_LOGIT,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    STRUCTURED_SCHEMA,
    ActionId,
    AgentId,
    DimensionName,
    DocId,
    Incarnation,
    ShortText,
    Version,
    _json_size,
    _unset,
)
from agent_learning.documents.run import TrainingRun


class Action(BaseModel):
    """One configuration an agent can choose: an id, a description and its settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: ActionId
    description: ShortText = ""
    config: dict[str, Any] = {}
    features: dict[str, Any] | None = Field(None, exclude_if=_unset)
    """The action's categorical features (:func:`check_action_features`), which a policy with
    ``action_features`` scores it by."""

    @field_validator("config")
    @classmethod
    def _config_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _json_size(value, "config")

    @field_validator("features")
    @classmethod
    def _features(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else check_action_features(value)


MAX_DIMENSIONS = 8
"""Named dimensions one structured policy may have."""
MAX_SEGMENTS = 32
"""Segments (values) of one categorical context feature a policy learns offsets for; further
values seen in training share the global logits."""
MAX_LEARNED_VALUES = 2_048
"""Context parameters one policy may hold, counted per action: (learned segments of all its
categorical features + its numeric features) × actions. It keeps a policy document and its
learner state small (about 50 KB at the limit for 40 actions); segments seen once the budget is
spent share the global logits."""
MAX_EXCLUDED = 4_096
"""Configurations the exclusion rules of one policy may exclude in all (each draw checks them)."""


SegmentName = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_CONTEXT_VALUE_CHARS)]
ExclusionRule = Annotated[
    dict[DimensionName, Annotated[str, StringConstraints(strict=True, max_length=128)]],
    Field(json_schema_extra={"additionalProperties": False}),  # keys are dimension names only, as validated
]
Offsets = list[Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-MAX_LOGIT, le=MAX_LOGIT)]]


class Dimension(BaseModel):
    """A named dimension of a structured policy: the next ``size`` entries of ``actions``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: DimensionName
    size: Annotated[int, Field(strict=True, ge=1, le=MAX_ACTIONS)]


NumberTransform = Literal["standardise", "log", "bins"]
"""How a numeric context feature's value x enters the policy (:mod:`agent_learning.policy.features`):
``standardise`` (the default) one weight per action on clip((x − center) / scale, ±4); ``log`` the
same on ln(1 + x) (x ≥ 0) instead of x; ``bins`` a category by the bin of x between the declared
edges ``bins``, learned as segments, as a categorical feature's."""
MAX_BIN_EDGES = MAX_SEGMENTS - 1
"""Edges a binned feature may declare: its bins (edges + 1) are at most :data:`MAX_SEGMENTS`."""

BinEdge = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class ContextFeature(BaseModel):
    """A context feature a policy learns from (:mod:`agent_learning.policy`).

    ``category``: ``segments`` maps each learned segment to one logit offset per action.
    ``number``: one ``weights`` entry per action, applied to ``(x − center) / scale``; the
    trainer sets ``center`` and ``scale`` once 30 episodes have carried the feature, from every
    episode that did up to that training run (pooled over runs; until then it has no ``weights``).
    A number may declare a ``transform`` (:data:`NumberTransform`): ``log`` fits center, scale and
    weights on ln(1 + x); ``bins`` (with its edges in ``bins``) learns ``segments``, one per bin."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, StringConstraints(strict=True, pattern=f"^{CONTEXT_NAME.pattern}$")]
    kind: Literal["category", "number"]
    transform: NumberTransform = Field("standardise", exclude_if=lambda v: v == "standardise")
    bins: Annotated[list[BinEdge], Field(min_length=1, max_length=MAX_BIN_EDGES)] | None = Field(
        None, exclude_if=_unset
    )
    """A binned feature's edges, increasing: bins (−∞, e₁), [e₁, e₂), …, [e_n, ∞)."""
    segments: dict[SegmentName, Offsets] | None = Field(None, exclude_if=_unset)
    weights: Offsets | None = Field(None, exclude_if=_unset)
    center: Annotated[float, Field(strict=True, allow_inf_nan=False)] = 0.0
    scale: Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0)] = 1.0

    @model_validator(mode="after")
    def _kind_fields(self) -> ContextFeature:
        if self.kind == "category" and self.transform != "standardise":
            raise ValueError("transform: only a number feature has a transform")
        if (self.transform == "bins") != (self.bins is not None):
            raise ValueError('bins: a feature has bin edges exactly when its transform is "bins"')
        if self.bins is not None and any(a >= b for a, b in zip(self.bins, self.bins[1:], strict=False)):
            raise ValueError(f"bins: edges must increase, got {self.bins}")
        if not self.segmented and self.segments is not None:
            raise ValueError("segments: only a category feature or a binned number has segments")
        if self.segmented and self.weights is not None:
            raise ValueError("weights: only a number feature (not binned) has weights")
        if self.segments is not None and len(self.segments) > MAX_SEGMENTS:
            raise ValueError(f"segments: {len(self.segments)} segments; the limit is {MAX_SEGMENTS}")
        return self

    @property
    def segmented(self) -> bool:
        """Whether it is learned as segments: a category, or a number declared with bins."""
        return self.kind == "category" or self.transform == "bins"

    @property
    def learned(self) -> int:
        """Its learned values per action: its segments, or one weight."""
        return len(self.segments or {}) if self.segmented else 1


FeatureWeights = dict[SegmentName, Annotated[float, Field(strict=True, allow_inf_nan=False,
                                                           ge=-MAX_LOGIT, le=MAX_LOGIT)]]


class ActionFeature(BaseModel):
    """A categorical action feature a policy scores actions by (:mod:`agent_learning.policy`):
    ``weights`` maps each learned value v of the feature to w_v, added to the logit of every action
    with that value; ``by_context`` maps a categorical context feature and one of its segments to
    the weights u_v added when the request's context is in that segment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, StringConstraints(strict=True, pattern=f"^{CONTEXT_NAME.pattern}$")]
    weights: FeatureWeights = {}
    by_context: dict[str, dict[SegmentName, FeatureWeights]] | None = Field(None, exclude_if=_unset)

    @model_validator(mode="after")
    def _sizes(self) -> ActionFeature:
        if len(self.weights) > MAX_FEATURE_VALUES:
            raise ValueError(f"weights: {len(self.weights)} values; the limit is {MAX_FEATURE_VALUES}")
        for name, segments in (self.by_context or {}).items():
            if len(segments) > MAX_SEGMENTS:
                raise ValueError(f"by_context.{name}: {len(segments)} segments; the limit is {MAX_SEGMENTS}")
            for segment, weights in segments.items():
                unknown = sorted(set(weights) - set(self.weights))
                if unknown:
                    raise ValueError(f"by_context.{name}.{segment}: {unknown} are not values in weights")
        return self

    @property
    def parameters(self) -> int:
        """Its learned weights: values plus context interactions."""
        return len(self.weights) + sum(len(w) for s in (self.by_context or {}).values() for w in s.values())


class Interaction(BaseModel):
    """Two dimensions of a structured policy learned jointly (:mod:`agent_learning.policy.interactions`):
    ``logits`` J holds one logit per pair of their values (the first dimension's value slowest),
    added to the two values' own logits; ``segments`` maps a categorical feature (or a binned
    number) and one of its segments to J's offsets there, ``weights`` a numeric feature to J's
    weights. Declared as the bare pair ``["depth", "tool"]``; the learner fills the tables in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dimensions: Annotated[list[DimensionName], Field(min_length=2, max_length=2)]
    logits: Offsets | None = Field(None, exclude_if=_unset)
    segments: dict[str, dict[SegmentName, Offsets]] | None = Field(None, exclude_if=_unset)
    weights: dict[str, Offsets] | None = Field(None, exclude_if=_unset)

    @model_validator(mode="before")
    @classmethod
    def _pair(cls, data: Any) -> Any:
        return {"dimensions": list(data)} if isinstance(data, list | tuple) else data

    @property
    def parameters(self) -> int:
        """Its learned tables: the logits, and one per segment and numeric feature."""
        return (self.logits is not None) + sum(len(s) for s in (self.segments or {}).values()) + len(self.weights or {})


class PolicyDocument(Document):
    """A softmax policy over discrete actions.

    ``kind="version"`` documents are immutable history. The ``kind="current"`` document is
    a full copy of the latest version that agents point-read and trainers replace with an
    ETag check; it also carries ``cursor``, the last score folded into the logits, so the
    logits and the training cursor always change together in one atomic write. ``run`` is
    the training run that produced the version (``None`` for ``init`` and ``rollback``); it
    is also written to the ``runs`` container, and can be rebuilt from here after a crash.
    """

    id: DocId
    type: Literal["policy"] = "policy"
    kind: Literal["version", "current"]
    agent_id: AgentId
    version: Version
    actions: Annotated[list[Action], Field(min_length=1, max_length=MAX_ACTIONS)]
    logits: list[Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-MAX_LOGIT, le=MAX_LOGIT)]]
    temperature: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)] = 1.0
    exploration_floor: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, lt=1)] = 0.0
    pinned: bool = False
    pin_reason: ShortText = ""
    source: Literal["init", "train", "rollback", "import", "revise"]
    parent_version: Version | None = None
    cursor: ScoreCursor | None = None
    run: TrainingRun | None = None
    created_at: AwareDatetime
    note: ShortText = ""
    learner_state: dict[str, Any] = {}
    dimensions: Annotated[list[Dimension], Field(min_length=1, max_length=MAX_DIMENSIONS)] | None = Field(
        None, exclude_if=_unset
    )
    """Named dimensions (schema 2): ``actions`` are their values, dimension after dimension."""
    excluded: list[ExclusionRule] | None = Field(None, exclude_if=_unset)
    """Rules of configurations never chosen: the values (ids after ``=``) of some dimensions."""
    features: Annotated[list[ContextFeature], Field(max_length=MAX_CONTEXT_FEATURES)] | None = Field(
        None, exclude_if=_unset
    )
    """Context features the policy's choice depends on (schema 2)."""
    action_features: Annotated[list[ActionFeature], Field(max_length=MAX_ACTION_FEATURES)] | None = Field(
        None, exclude_if=_unset
    )
    """Categorical features of the actions the policy scores them by (schema 2; a flat policy's):
    an action a request offers that the policy has never seen is scored by its features alone."""
    interactions: Annotated[list[Interaction], Field(max_length=MAX_DIMENSIONS // 2)] | None = Field(
        None, exclude_if=_unset
    )
    """Pairs of dimensions learned jointly (schema 2; :class:`Interaction`), each dimension in one pair at most."""
    unpinned_version: Version | None = Field(None, exclude_if=_unset)
    """The version the current document was at when an operator last unpinned it: a drift warning
    pins the agent again (``AGENT_LEARNING_AUTO_PIN``) only on the evidence of the runs after it."""
    incarnation: Incarnation | None = Field(None, exclude_if=_unset)
    """Which creation of the agent this is (:data:`Incarnation`): drawn by ``create_policy`` and
    kept by every later version, so the episodes and scores of a deleted agent re-created under
    the same id are told from the new one's."""

    @model_validator(mode="before")
    @classmethod
    def _structured_schema(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and "schema_version" not in data
            and any(
                data.get(k) is not None
                for k in ("dimensions", "excluded", "features", "action_features", "interactions")
            )
        ):
            return {**data, "schema_version": STRUCTURED_SCHEMA}
        return data

    @field_validator("learner_state")
    @classmethod
    def _state_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _json_size(value, "learner_state", 16 * MAX_JSON_CHARS)

    @model_validator(mode="after")
    def _consistent(self) -> PolicyDocument:
        if len(self.logits) != len(self.actions):
            raise ValueError(f"logits: has {len(self.logits)} entries but there are {len(self.actions)} actions")
        ids = [a.id for a in self.actions]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"actions: duplicate action ids {dupes}")
        largest = max(d.size for d in self.dimensions) if self.dimensions else len(self.actions)
        if self.exploration_floor * largest >= 1:
            raise ValueError(f"exploration_floor: {self.exploration_floor} x {largest} actions must be below 1")
        self._check_structure()
        self._check_action_features()
        if self.kind == "version" and (self.pinned or self.pin_reason):
            raise ValueError("pinned: only the current document can be pinned")
        expected = policy_doc_id(self.agent_id, self.version if self.kind == "version" else None)
        if self.id != expected:
            raise ValueError(f"id: expected {expected!r} for a {self.kind} document")
        return self

    def _check_structure(self) -> None:
        if self.structured and self.schema_version < STRUCTURED_SCHEMA:
            raise ValueError(
                f"schema_version: a policy with dimensions, exclusions or features is schema {STRUCTURED_SCHEMA}"
            )
        names = [d.name for d in self.dimensions or []]
        if len(set(names)) != len(names):
            raise ValueError(f"dimensions: duplicate names {sorted({n for n in names if names.count(n) > 1})}")
        if self.dimensions is not None:
            if sum(d.size for d in self.dimensions) != len(self.actions):
                raise ValueError(
                    f"dimensions: sizes add up to {sum(d.size for d in self.dimensions)}, "
                    f"but there are {len(self.actions)} actions"
                )
            start = 0
            longest = 0
            for d in self.dimensions:
                ids = [a.id for a in self.actions[start : start + d.size]]
                for action_id in ids:
                    if not action_id.startswith(f"{d.name}=") or ":" in action_id:
                        raise ValueError(f"actions: {action_id!r} must be {d.name}=<value> (no ':')")
                longest += max(len(i) for i in ids) + 1
                start += d.size
            if longest - 1 > 128:
                raise ValueError(f"dimensions: a configuration id may be {longest - 1} characters; the limit is 128")
        for i, rule in enumerate(self.excluded or []):
            if not rule:
                raise ValueError(f"excluded[{i}]: an empty rule would exclude everything")
            for name, value in rule.items():
                if name not in names:
                    raise ValueError(f"excluded[{i}]: {name!r} is not a dimension (dimensions: {names})")
                if f"{name}={value}" not in self.action_ids:
                    raise ValueError(f"excluded[{i}].{name}: {value!r} is not one of its values")
        if self.excluded:
            sizes = {d.name: d.size for d in self.dimensions or []}
            joint = math.prod(sizes.values())
            bound = sum(joint // math.prod(sizes[n] for n in rule) for rule in self.excluded)
            if bound > MAX_EXCLUDED:
                raise ValueError(
                    f"excluded: the rules exclude up to {bound} configurations; the limit is {MAX_EXCLUDED}"
                )
            if bound >= joint and len(excluded_configurations(self)) >= joint:
                raise ValueError("excluded: the rules exclude every configuration")
        seen = set()
        for feature in self.features or []:
            if feature.name in seen:
                raise ValueError(f"features: {feature.name!r} appears twice")
            seen.add(feature.name)
            for segment, offsets in (feature.segments or {}).items():
                if len(offsets) != len(self.actions):
                    raise ValueError(f"features.{feature.name}.segments.{segment}: needs one offset per action")
            if feature.weights is not None and len(feature.weights) != len(self.actions):
                raise ValueError(f"features.{feature.name}.weights: needs one weight per action")
        learned = sum(f.learned for f in self.features or [])
        if learned * len(self.actions) > MAX_LEARNED_VALUES:
            raise ValueError(
                f"features: {learned} segments and numeric features × {len(self.actions)} actions is "
                f"{learned * len(self.actions)} parameters; the limit is {MAX_LEARNED_VALUES}"
            )
        self._check_interactions(learned)

    def _check_interactions(self, learned: int) -> None:
        """Each declared pair: two dimensions, in no other pair, with tables of one entry per pair of
        their values, for segments and numeric features the policy has."""
        if self.interactions is None:
            return
        if self.dimensions is None:
            raise ValueError("interactions: only a policy with dimensions declares interactions")
        sizes = {d.name: d.size for d in self.dimensions}
        features = {f.name: f for f in self.features or []}
        paired: set[str] = set()
        values = len(self.actions)  # the values the policy draws from, each pair merged into one dimension
        for i, interaction in enumerate(self.interactions):
            where = f"interactions[{i}]"
            first, second = interaction.dimensions
            for name in (first, second):
                if name not in sizes:
                    raise ValueError(f"{where}: {name!r} is not a dimension (dimensions: {list(sizes)})")
                if name in paired:
                    raise ValueError(f"{where}: {name!r} is in two pairs; a dimension interacts with one other at most")
                paired.add(name)
            if first == second:
                raise ValueError(f"{where}: a dimension does not interact with itself ({first!r} twice)")
            pairs = sizes[first] * sizes[second]
            if pairs > MAX_ACTIONS:
                raise ValueError(f"{where}: {first} × {second} has {pairs} pairs of values; the limit is {MAX_ACTIONS}")
            if self.exploration_floor * pairs >= 1:
                raise ValueError(f"{where}: exploration_floor {self.exploration_floor} x {pairs} pairs of values "
                                 f"({first} × {second}, drawn as one dimension) must be below 1")
            values += pairs - sizes[first] - sizes[second]
            if interaction.logits is not None and len(interaction.logits) != pairs:
                raise ValueError(f"{where}.logits: needs one logit per pair of values ({pairs}), got "
                                 f"{len(interaction.logits)}")
            for name, segments in (interaction.segments or {}).items():
                feature = features.get(name)
                if feature is None or not feature.segmented:
                    raise ValueError(f"{where}.segments: {name!r} is not a category feature (nor a binned number) "
                                     "of the policy")
                for segment, offsets in segments.items():
                    if segment not in (feature.segments or {}):
                        raise ValueError(f"{where}.segments.{name}: {segment!r} is not a segment of the feature")
                    if len(offsets) != pairs:
                        raise ValueError(f"{where}.segments.{name}.{segment}: needs one offset per pair of values "
                                         f"({pairs}), got {len(offsets)}")
            for name, weights in (interaction.weights or {}).items():
                feature = features.get(name)
                if feature is None or feature.segmented or feature.weights is None:
                    raise ValueError(f"{where}.weights: {name!r} is not a numeric feature of the policy with weights")
                if len(weights) != pairs:
                    raise ValueError(f"{where}.weights.{name}: needs one weight per pair of values ({pairs}), "
                                     f"got {len(weights)}")
        if learned * values > MAX_LEARNED_VALUES:
            raise ValueError(
                f"interactions: {learned} segments and numeric features × {values} values (each pair of "
                f"dimensions drawn as one) is {learned * values} parameters; the limit is {MAX_LEARNED_VALUES}"
            )

    def _check_action_features(self) -> None:
        if self.action_features is None:
            return
        if self.dimensions is not None:
            raise ValueError("action_features: only a flat list of actions (no dimensions) is scored by features")
        names = [f.name for f in self.action_features]
        if len(set(names)) != len(names):
            raise ValueError(f"action_features: duplicate names {sorted({n for n in names if names.count(n) > 1})}")
        categorical = {f.name for f in self.features or [] if f.segmented}
        for feature in self.action_features:
            for name in feature.by_context or {}:
                if name not in categorical:
                    raise ValueError(f"action_features.{feature.name}.by_context: {name!r} is not a category feature "
                                     f"(nor a binned number) of the policy (features: {sorted(categorical)})")
        learned = sum(f.parameters for f in self.action_features)
        if learned > MAX_LEARNED_VALUES:
            raise ValueError(f"action_features: {learned} weights; the limit is {MAX_LEARNED_VALUES}")

    @property
    def action_ids(self) -> list[str]:
        return [a.id for a in self.actions]

    @property
    def structured(self) -> bool:
        """Whether the document uses the fields of schema 2 (dimensions, exclusions, features)."""
        return any(
            x is not None
            for x in (self.dimensions, self.excluded, self.features, self.action_features, self.interactions)
        )

    def as_kind(self, kind: Literal["version", "current"]) -> PolicyDocument:
        """The same policy as a version document or as the current document.

        ``pinned``, ``pin_reason`` and ``unpinned_version`` are state of the current document only
        (pausing learning does not make a new policy), so version documents are never pinned.
        """
        doc_id = policy_doc_id(self.agent_id, self.version if kind == "version" else None)
        update: dict[str, Any] = {"kind": kind, "id": doc_id}
        if kind == "version":
            update["pinned"] = False
            update["pin_reason"] = ""
            update["unpinned_version"] = None
        return self.model_copy(update=update)


def excluded_configurations(doc: PolicyDocument) -> list[tuple[int, ...]]:
    """Every configuration ``doc.excluded`` excludes, as per-dimension value indices, each once,
    sorted. A rule names values of some dimensions (``{"prompt": "concise", "retrieval_k": "10"}``:
    value ids without the ``name=`` prefix); every configuration that has them is excluded."""
    if not doc.excluded or not doc.dimensions:
        return []
    found: set[tuple[int, ...]] = set()
    start = 0
    index: list[dict[str, int]] = []
    for d in doc.dimensions:
        index.append({a.id.partition("=")[2]: i for i, a in enumerate(doc.actions[start : start + d.size])})
        start += d.size
    for rule in doc.excluded:
        choices = [[index[k][rule[d.name]]] if d.name in rule else range(d.size) for k, d in enumerate(doc.dimensions)]
        found.update(product(*choices))
    return sorted(found)


def policy_doc_id(agent_id: str, version: int | None) -> str:
    """``{agent}:v{n}`` for a version, ``{agent}:current`` for the current document."""
    return f"{agent_id}:current" if version is None else f"{agent_id}:v{version}"


def stored_policy(raw: dict[str, Any]) -> PolicyDocument:
    """A policy document read from a store; an invalid one raises :class:`StoredDocumentInvalid`
    naming the document (``invalid policy 'support:v3': logits: ...``), since the reader did not write it."""
    try:
        return PolicyDocument.from_dict(raw)
    except InvalidDocument as exc:
        name = f"policy {raw.get('id')!r}" if isinstance(raw, dict) else "policy document"  # a list has no id
        raise StoredDocumentInvalid(name, exc.problems) from None
