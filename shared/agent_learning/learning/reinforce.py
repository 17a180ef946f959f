"""REINFORCE with a baseline for a softmax bandit policy, off-policy corrected. One file.

Notation (one batch of N scored episodes, K actions)::

    θ ∈ R^K          logits;  s = softmax(θ / T)  the policy being learned
    a_i, r_i, μ_i    action, reward and logged probability of episode i (μ_i is what the
                     agent's policy gave a_i when it drew it, possibly an older version,
                     exploration floor included)
    w_i = min(s(a_i) / μ_i, c)                       clipped importance weight
    b   = Σ w_i r_i / Σ w_i                          baseline: self-normalised estimate of
                                                     the value of s (action-independent, so
                                                     subtracting it adds no bias beyond the
                                                     clipping and the self-normalisation)
    A_i = (r_i − b) / max(σ, σ_min)                  advantage, optionally normalised by the
                                                     weighted reward std σ (scale-free steps)

The policy gradient with entropy regularisation (Williams 1992; Sutton & Barto §13.4)::

    g = 1/N Σ_i w_i A_i ∇ log s(a_i)  +  β ∇H(s)
    ∇_θ log s(a) = (e_a − s) / T
    ∇_θ H(s)     = −s ⊙ (log s + H(s)) / T           with H(s) = −Σ_k s_k log s_k

``g`` is exactly the gradient, at the current θ, of the surrogate objective ::

    L(θ) = 1/N Σ_i w_i A_i log s_θ(a_i) + β H(s_θ)      (w, A held fixed)

which :func:`surrogate` computes so that a test can check ``g`` by finite differences.

Direction ``d`` (``direction``):

* ``"plain"``: the gradient ``g`` itself.
* ``"evidence"`` (default): the natural gradient's component (F⁺g = T²·g / s, centred, F the
  Fisher information of the softmax; Kakade 2001) with its importance-sampled advantage estimate
  T·(1/N) Σ_{i: a_i = a} w_i A_i / s(a) replaced by the per-action sum scaled by the evidence
  behind it::

      d_a = T · Σ_{i: a_i = a} A_i / √(n_a + c)        n_a = #{i: a_i = a},  c = evidence_prior

  Σ A_i / √n_a = √n_a · Ā_a is the z-statistic of the action's mean advantage (A is in units
  of the reward std). The natural gradient moves every logit by the same amount whether its
  advantage rests on 1 episode or on 100; this moves it by how sure the batch is. It is the
  softmax analogue of Thompson sampling: the log-odds that arm a beats arm b under Gaussian
  posteriors are ≈ 1.7·(μ̂_a − μ̂_b)/√(σ²/n_a + σ²/n_b) (the logistic approximation of the
  probit), a z-statistic too. Unlike the importance-sampled estimate it does not divide by a
  small s(a), so one lucky episode of a rarely drawn action cannot swing the policy; c > 0
  damps actions seen once or twice further. The mean reward of an action does not depend on
  the policy that logged its episodes, so importance weights enter here only through the
  baseline b and the std σ, which estimate properties of the policy s being learned. A
  z-statistic grows like √N, so the step is scaled by √(N/N_ref) (see below), not N/N_ref.

The entropy bonus enters every direction as its own (natural) gradient.

Scale. Step size and trust region are stated per ``reference_batch`` episodes N_ref and grow
with the batch size N: the step by N/N_ref (``"plain"``) or √(N/N_ref)
(``"evidence"``), the trust region by N/N_ref. A batch with ten times the evidence moves the
policy further, as it should, and the same episodes split into smaller, more frequent batches
move it about as far in all. N is the number of rows of the batch: its episodes plus its
corrected episodes (the caller passes one correction row per episode, its net reward change,
and none for an episode whose corrections net to zero; see Feedback corrections below).

The step ``η·d`` is then shrunk (halved up to 20 times) until KL(s_old ‖ s_new) ≤ the trust
region, in the spirit of TRPO (Schulman et al. 2015). No logit may fall more than
``max_logit_gap`` below the largest: below the exploration floor a lower logit changes nothing
the agents do, but it would take that much more evidence to raise the action again when the
world changes (non-stationarity).

Evidence bound (an adaptive exploration floor). A batch's step forgets what earlier batches
saw, so a noisy early batch can push the best action so far down that it is hardly tried
again, and the policy locks onto the second best. The learner therefore keeps, across
updates, a small *state* (stored with each policy version): per action the discounted count,
reward sum and sum of squares of the episodes it has learned from,

    n_a ← 2^(−n/H)·n_a + #{i: a_i = a}      (likewise S_a, Q_a)     H = evidence_half_life

(n and the count over the batch's episodes only: corrections are no episodes, see Feedback
corrections below)

and after the step bounds how far any action may trail the leader L = argmax θ::

    θ_a ≥ θ_L − (g₀ + κ·max(z_a, 0)),   z_a = (m_L − m_a) / √(v_L/(n_L + c) + v_a/(n_a + c))

with m_a, v_a the action's mean and variance shrunk towards the pooled ones by c =
``evidence_prior`` pseudo-episodes, κ = ``gap_per_evidence`` and g₀ = ``gap_slack``. z_a is
the z-statistic of the evidence that a is worse than L; under Gaussian posteriors a beats L
with probability ≈ Φ(−z_a). So the policy may be confident that an action is worse only as far
as the evidence says: an action with an unlucky start keeps being tried until the evidence
against it is real, while an action that is clearly worse (z of 3 or more) is bounded only
loosely (π(a)/π(L) ≥ e^(−g₀−3κ)) and the learner drives it down as before. The gap is also
capped by a calibration, c = ``calibration``::

    θ_L − θ_a ≤ c − ln Φ(−z_a⁺) + ln(1 + Σ_{b≠L} Φ(−z_b⁺))

i.e. π(a)/π(L) ≥ e^(−c)·Φ(−z_a)/(1 + Σ_{b≠L} Φ(−z_b)): never much less than the chance that a
beats L, normalised over the actions that share that chance (with many weakly-evidenced
actions their pairwise chances sum past 1, while the chance that any one of them is the best
shrinks). The half-life lets
old evidence fade, so an action not tried for a while is tried again when the world may have
changed.

Change test. Fading alone notices a changed world only as fast as the evidence fades. The state
therefore also keeps the same sums over a shorter half-life H_r = ``recent_half_life`` (the
*recent* evidence n^r_a, S^r_a, Q^r_a) and, after adding each batch, compares every action's
recent mean with its older one (the state minus the recent evidence: both weigh the newest
episode 1 and the recent fades faster, so the difference weighs each episode by 2^(−t/H) −
2^(−t/H_r) ≥ 0)::

    z_a = |m^r_a − m^o_a| / √(v_a/n^r_a + v_a/n^o_a)      (n^r_a, n^o_a ≥ 5; v_a the action's variance)

The test compares judged rewards only. A feedback correction is a late verdict on an episode
learned before, of any age, not news that the world changed now: it shifts the state's S_a but
not the recent S^r_a, and the state also keeps (under ``recent``, as ``corrections``) the part
C_a of S_a that corrections make, fading with it, which the older mean leaves out:
m^o_a = (S_a − C_a − S^r_a)/n^o_a. A burst of corrections therefore never trips the test, and
steady feedback shifts neither side.

When max_a z_a > z* = ``change_threshold``, the world has changed (for a stationary action each
z_a is about standard normal: 4 is a false alarm in ~1 of 16,000 comparisons) and the state
becomes the recent evidence alone (the corrections go with the older evidence), so the bounds
widen at once to what the recent episodes say, not after the old evidence has faded. In the
spirit of ADWIN (Bifet and Gavaldà 2007), with two exponential windows instead of a cut point.

The pairwise chances are a cheap stand-in for the chance P_a that a is the best of all, which is
what Thompson sampling draws a with; with many actions near the leader they undercount it for
an action whose few episodes were unlucky. So the floor also keeps, with c_T = ``thompson_floor``::

    θ_L − θ_a ≤ max(c_T − ln P_a + ln P_L, 0)      P_a = ∫ φ_a(x) Π_{b≠a} Φ_b(x) dx

(Gaussian posteriors N(m_a, v_a/(n_a + c)) as above; computed by quadrature, see
:func:`log_p_best`): π(a)/π(L) ≥ e^(−c_T)·P_a/P_L, never drawn much less often than Thompson
sampling would draw it, and never raised above the leader.

The bound has an upper side, the odds cap, d = ``odds_cap``. With E the action whose shrunk
mean reward is highest (among equals the highest logit) and z_a the evidence that a is worse
than E ::

    θ_a ≤ θ_E + d + ln Φ(−z_a⁺) − ln Φ(z_a⁺)        (a ≠ E; never below θ_E − max_logit_gap)

i.e. π(a)/π(E) ≤ e^d·Φ(−z_a)/Φ(z_a), the posterior odds that a beats E: never much less sure
than the evidence. The step moves a logit by about the same amount per episode whatever the
evidence so far, so its log-odds grow like the number of episodes n where the evidence's grow
like √n: early on, when a few batches already say a lot, the step lags behind what they say
(Thompson sampling does not), and later it runs ahead, which the floor then bounds. The cap is
applied first and the floor second, so the floor stays the guarantee. Together: the floor only
raises logits, never above the leader; the cap only lowers them, and puts E in the lead
(z ≥ 0 for every other action, so with d = 0 nothing stays above θ_E). Neither uses information
the batches did not hold; they constrain the REINFORCE step, they do not replace it (with
κ → ∞ and no cap the learner is the memoryless one above). The trust region bounds the step;
the bounds then move the policy as far as the evidence says.

The bounds above are written for T = 1. They bound the policy the agents draw from, whose
log-odds are ln π(a)/π(L) = (θ_a − θ_L)/T, so at temperature T every gap and every cap term is
multiplied by T (``max_logit_gap`` and ``logit_bound`` are in logits and are not).

The logits are finally centred and clipped to ±``logit_bound`` so that they stay finite and
the policy document stays readable.

Feedback corrections. A batch may hold corrections (``Batch.corrections``): rows whose
"reward" is the change δ that late user feedback made to an episode already counted (see
:mod:`agent_learning.rewards.feedback`). The episode's missing contribution to the gradient is
``w (r_new − b) − w (r_old − b) = w δ``, so a correction's advantage is δ itself (divided by
σ when advantages are normalised): no baseline is subtracted. Corrections take no part in the
baseline, the reward std, the mean reward or the evidence counts; in the learner state they
shift the action's reward sum S_a by δ (not n_a or Q_a). A batch of corrections alone (their
episodes were learned in earlier batches) has no episodes to estimate σ from: σ is then the
pooled reward std of the learner state's evidence, or 1 (the largest std a reward in [−1, 1]
can have) without any, so such a batch moves the policy too and no feedback is lost. Episodes
whose importance weights all underflow to 0 (at T = 0.01, actions 8 logits below the leader)
have no baseline to be measured against: they add nothing, and corrections beside them count
as if alone.

The gradient is linear in the corrections' δ, so the corrections of one episode (same action,
same logged probability) summed into one row move the policy as the separate rows would; only
N differs. The trainer (:func:`agent_learning.pipeline.train_agent`) therefore passes one row
per corrected episode and drops those whose corrections net to zero: a thumb toggled up and
down two thousand times is one episode's worth of information, or none, not two thousand
episodes' worth, and feedback that nets to zero changes nothing at all.

Action features. A flat policy may score its actions by categorical features (see
:mod:`agent_learning.policy`): per learned value p of each action feature a weight w_p, and per
segment c of each categorical context feature f interactions u_{f,c,p}, so that with φ(a) the
one-hot vector of a's values ::

    ℓ(a | x) = θ_a + Σ_f δ_{f,x_f,a} + Σ_j β_{j,a} x̃_j + φ(a)·(w + Σ_f u_{f,x_f})

A row may carry the candidates its request offered, C_i (ids with features, new ones included);
its softmax is over C_i alone (the others have probability 0), so log s(a_i | x_i, C_i), the
importance weight s/μ_i with μ_i the logged probability among C_i, and the exact gradient
∇_w log s(a_i) = (φ(a_i) − Σ_{b ∈ C_i} s(b) φ(b)) / T (u likewise over a segment's rows) follow
the formulas above. The evidence direction of w_p is the score statistic

    d_p = T · Σ_i A_i c_ip / √(Σ_i c_ip² + c),   c_ip = φ_p(a_i) − Σ_{b ∈ C_i} s(b | x_i) φ_p(b)

(a z-statistic of how much better the rows with the value did than the policy's mix of it), and
of u_{f,c,p} the same over the rows of segment c (with ``segment_prior``). Each feature's weights
are centred over its values (an action without the feature counts as its mean value) and no
value falls more than ``max_logit_gap`` below the feature's best, alone or in a segment. The
evidence bound holds each action's own logits (θ, θ + δ) to the action's own evidence; the
feature terms, learned from the evidence pooled over every action with a value, are bounded
only as above. Actions a batch offered that the policy lacks are added (θ = 0, the most chosen
first, within ``MAX_ACTIONS`` and ``MAX_LEARNED_VALUES``), with their features; the learner
state's per-action entries grow with them.

Rewards must be finite; :class:`Batch` rejects anything else before it reaches the math.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import accumulate
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agent_learning.documents import (
    MAX_ACTIONS,
    MAX_FEATURE_VALUES,
    MAX_LEARNED_VALUES,
    MAX_SEGMENTS,
    Action,
    Candidate,
    PolicyDocument,
    excluded_configurations,
)
from agent_learning.learning.columns import (
    NumberColumn,
    byte_column,
    number_column,
    segment_columns,
    shared_rows,
)
from agent_learning.policy.features import FeatureReader, segment_name
from agent_learning.policy.interactions import declared_fields, is_pair, merged_document
from agent_learning.policy.softmax import Layout

Array = NDArray[np.float64]


@dataclass(frozen=True)
class LearnerConfig:
    """Settings of :class:`Reinforce`. Every default is explained in the module docstring;
    defaults were chosen on ``benchmarks/learning.py`` (docs/benchmarks.md: Learning benchmark)."""

    learning_rate: float = 1.2
    """η: scale of one step before the trust region shrinks it."""
    direction: Literal["evidence", "plain"] = "evidence"
    """``"evidence"`` (recommended) or ``"plain"`` gradient (the natural gradient, once offered for flat
    policies, learned worse on every context-free row of ``benchmarks/learning.py``: docs/learner.md)."""
    normalize_advantages: bool = True
    """Divide advantages by the batch's weighted reward std (a step independent of the reward scale)."""
    min_reward_std: float = 0.05
    """σ_min: floor of that std, so a batch of near-identical rewards does not make a huge step."""
    entropy_coef: float = 0.001
    """β: entropy bonus; keeps the policy from collapsing on noise."""
    importance_clip: float = 5.0
    """c: cap on s(a)/μ(a) for episodes logged under older versions."""
    max_kl: float | None = 1.0
    """Trust region: the largest KL(old ‖ new) one update may move the policy (None: off)."""
    evidence_prior: float = 3.0
    """Pseudo-count that damps the steps of actions seen once or twice."""
    reference_batch: int | None = 50
    """Batch size ``learning_rate`` and ``max_kl`` are stated for (None: the same step whatever the batch size)."""
    max_logit_gap: float | None = 8.0
    """No logit falls further below the largest (None: no limit); the policy can recover when the best changes."""
    gap_per_evidence: float | None = 4.0
    """κ: log-odds an action may trail the leader per unit of z against it (None: no evidence bound, no state)."""
    gap_slack: float = 1.0
    """g₀: log-odds an action may trail the leader with no evidence against it."""
    calibration: float | None = 2.0
    """c: no action trails the leader by more than c − ln Φ(−z_a) + ln(1 + Σ_b Φ(−z_b)), so that
    π(a)/π(L) ≥ e^(−c)·Φ(−z_a)/(1 + Σ_b Φ(−z_b)):
    never much surer than the evidence (None: the linear bound alone)."""
    thompson_floor: float | None = 2.5
    """c_T: no action's probability relative to the leader falls below e^(−c_T) times its
    probability of being the best relative to the leader's, under Gaussian posteriors: never drawn
    much less often than Thompson sampling would draw it (None: off)."""
    dimension_thompson_floor: float | None = 1.5
    """c_T in each dimension of a policy with several dimensions (``thompson_floor`` holds for every
    other policy, and for a declared pair of dimensions), smaller so a value the policy dropped keeps
    more draws: its episodes were mostly drawn early, beside the other dimensions' worse values, and
    look worse than the value is. On ``benchmarks/learning.py``'s four factorized rows, 1.5 against
    2.5 took the seeds that end with the best configuration below 0.5 from 6 / 47 / 15 / 39 to
    3 / 44 / 9 / 33 of 200, at the same regret within noise (None: off)."""
    odds_cap: float | None = 0.0
    """d: no action's probability relative to the action with the best evidence E exceeds e^d times
    the posterior odds that it beats E, Φ(−z)/Φ(z): never much less sure than the evidence
    (None: no cap)."""
    evidence_half_life: float | None = 3000.0
    """H: episodes after which the learner state's evidence counts half (None: it never fades)."""
    change_threshold: float | None = 4.0
    """z*: when some action's recent mean reward differs from its older one by more than z* standard
    errors, the world has changed and the state keeps only the recent evidence (None: no change test)."""
    recent_half_life: float = 300.0
    """H_r: episodes after which the recent evidence the change test compares counts half (less than H)."""
    logit_bound: float = 20.0
    """Logits are kept in [−bound, bound] after centring."""
    baseline_prior: float = 3.0
    """m: pseudo-episodes that shrink a context's baseline towards the batch's (structured policies)."""
    segment_gap_slack: float = 0.25
    """g₀ in a segment of a structured policy: log-odds a value may trail the segment's leader with no
    evidence against it (smaller than ``gap_slack``: a segment's lead is mostly the global logits and
    the noise of a few episodes; 0.25 was best on the benchmark's segment rows)."""
    segment_prior: float = 0.0
    """m_s: extra pseudo-episodes that shrink a segment's offsets towards the global logits, on top of
    ``evidence_prior`` (structured policies; 0 was best on ``benchmarks/learning.py``'s contextual rows)."""

    def __post_init__(self) -> None:
        checks = {
            "learning_rate": self.learning_rate > 0,
            "min_reward_std": self.min_reward_std > 0,
            "entropy_coef": self.entropy_coef >= 0,
            "importance_clip": self.importance_clip >= 1,
            "max_kl": self.max_kl is None or self.max_kl > 0,
            "direction": self.direction in ("evidence", "plain"),
            "evidence_prior": self.evidence_prior >= 0,
            "reference_batch": self.reference_batch is None or self.reference_batch >= 1,
            "max_logit_gap": self.max_logit_gap is None or self.max_logit_gap > 0,
            "gap_per_evidence": self.gap_per_evidence is None or self.gap_per_evidence > 0,
            "gap_slack": self.gap_slack >= 0,
            "calibration": self.calibration is None or self.calibration >= 0,
            "thompson_floor": self.thompson_floor is None or self.thompson_floor >= 0,
            "dimension_thompson_floor": self.dimension_thompson_floor is None or self.dimension_thompson_floor >= 0,
            "odds_cap": self.odds_cap is None or self.odds_cap >= 0,
            "evidence_half_life": self.evidence_half_life is None or self.evidence_half_life > 0,
            "change_threshold": self.change_threshold is None or self.change_threshold > 0,
            "recent_half_life": self.recent_half_life > 0,
            "logit_bound": self.logit_bound > 0,
            "baseline_prior": self.baseline_prior >= 0,
            "segment_prior": self.segment_prior >= 0,
            "segment_gap_slack": self.segment_gap_slack >= 0,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not ok or (isinstance(value, float) and not np.isfinite(value)):
                raise ValueError(f"learner setting {name}={value!r} is out of range")
        if self.recent_half_life >= (self.evidence_half_life or math.inf):
            raise ValueError(
                f"learner setting recent_half_life={self.recent_half_life!r} must be less than"
                f" evidence_half_life={self.evidence_half_life!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Batch:
    """Scored episodes as arrays: action indices, rewards and logged probabilities."""

    actions: NDArray[np.int64]
    rewards: Array
    logged_probs: Array
    corrections: NDArray[np.bool_] | None = None
    """True for feedback corrections, whose ``rewards`` entry is a reward change δ."""

    @classmethod
    def from_arrays(
        cls,
        actions: ArrayLike,
        rewards: ArrayLike,
        logged_probs: ArrayLike,
        n_actions: int,
        corrections: ArrayLike | None = None,
    ) -> Batch:
        """Validate and convert; raises ``ValueError`` naming the field and first bad index."""
        a, r, p = np.asarray(actions), np.asarray(rewards), np.asarray(logged_probs)
        c = np.zeros(len(a), dtype=bool) if corrections is None else np.asarray(corrections)
        if not (a.ndim == r.ndim == p.ndim == c.ndim == 1 and len(a) == len(r) == len(p) == len(c)):
            raise ValueError("actions, rewards, logged_probs and corrections must be 1-D arrays of equal length")
        check_kinds(a, r, p, c)
        a, r, p, c = a.astype(np.int64), r.astype(np.float64), p.astype(np.float64), c.astype(bool)
        _first_bad("rewards", ~np.isfinite(r), r, "must be finite")
        _first_bad("logged_probs", ~((p > 0) & (p <= 1)), p, "must be in (0, 1]")
        _first_bad("actions", (a < 0) | (a >= n_actions), a, f"must be an action index in [0, {n_actions})")
        return cls(a, r, p, c if c.any() else None)

    @property
    def regular(self) -> NDArray[np.bool_]:
        """True for scored episodes (not corrections)."""
        return np.ones(len(self.actions), dtype=bool) if self.corrections is None else ~self.corrections

    def __len__(self) -> int:
        return len(self.actions)


@dataclass(frozen=True)
class Update:
    """The result of one learner step: new logits and what happened."""

    logits: Array
    metrics: dict[str, float] = field(default_factory=dict)
    """Among them ``softmax_entropy_before``/``_after``: the entropy of softmax(θ/T), the part the
    learner moves, without the exploration floor (the entropy of the policy agents draw from,
    floor included, is :func:`agent_learning.policy.policy_entropy`)."""
    state: dict[str, Any] = field(default_factory=dict)
    """The learner state to store with the new policy version and pass to the next update."""
    features: list[dict[str, Any]] | None = None
    """The document's ``features`` with the learned segments, offsets and weights (None without any)."""
    actions: list[dict[str, Any]] | None = None
    """The document's ``actions`` with the new ones the batch offered and their features, one per
    logit (None: unchanged)."""
    action_features: list[dict[str, Any]] | None = None
    """The document's ``action_features`` with the learned weights (None without any)."""
    interactions: list[dict[str, Any]] | None = None
    """The document's ``interactions`` with the learned tables (None without any)."""

    def fields(self) -> dict[str, Any]:
        """The policy document fields this update sets (besides the learner state)."""
        out: dict[str, Any] = {"logits": [float(x) for x in self.logits]}
        if self.features is not None:
            out["features"] = self.features
        if self.actions is not None:
            out["actions"] = self.actions
        if self.action_features is not None:
            out["action_features"] = self.action_features
        if self.interactions is not None:
            out["interactions"] = self.interactions
        return out

    def applied_to(self, doc: PolicyDocument) -> PolicyDocument:
        """``doc`` with this update's logits, features and learner state (validated; the same
        version: the trainer's :func:`~agent_learning.pipeline.train.next_version` makes the next)."""
        return PolicyDocument.from_dict({**doc.to_dict(), **self.fields(), "learner_state": self.state})


RECENT = "recent"
"""The learner state's key for the recent evidence the change test compares (when it is on)."""
CORRECTIONS = "corrections"
"""The key, among the recent sums, of C_a: per action the part of the state's reward sum that
feedback corrections make (faded with the state), which the change test leaves out. Written
only when some entry is not 0, so that a state without corrections is stored as before."""


@dataclass(frozen=True)
class Evidence:
    """The learner state: per action the discounted count, reward sum and sum of squares of
    the episodes learned from (module docstring: Evidence bound)."""

    count: Array
    reward_sum: Array
    reward_sq_sum: Array

    KEYS = ("count", "reward_sum", "reward_sq_sum")

    @classmethod
    def empty(cls, k: int) -> Evidence:
        return cls(np.zeros(k), np.zeros(k), np.zeros(k))

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None, k: int) -> tuple[Evidence, str | None]:
        """The evidence in ``state``, or none and the reason it could not be used."""
        if not state:
            return cls.empty(k), None
        try:
            arrays = [np.asarray(state[key], dtype=np.float64) for key in cls.KEYS]
        except (KeyError, TypeError, ValueError) as exc:
            return cls.empty(k), f"learner state unreadable ({type(exc).__name__}: {exc}); evidence restarts"
        for key, values in zip(cls.KEYS, arrays, strict=True):
            if values.shape != (k,):
                return cls.empty(k), f"learner state {key}: {values.size} entries for {k} actions; evidence restarts"
            if not np.isfinite(values).all() or (key != "reward_sum" and (values < 0).any()):
                return cls.empty(k), f"learner state {key}: non-finite or negative entries; evidence restarts"
        return cls(*arrays), None

    def to_state(self) -> dict[str, Any]:
        return {key: [round(float(x), 9) for x in getattr(self, key)] for key in self.KEYS}

    @classmethod
    def corrected(cls, batch: Batch, k: int) -> Array | None:
        """Per action the sum of the batch's feedback corrections (None without any)."""
        if batch.regular.all():
            return None
        return np.bincount(batch.actions, weights=np.where(batch.regular, 0.0, batch.rewards), minlength=k)

    @classmethod
    def of_batch(cls, batch: Batch, k: int) -> Evidence:
        """The batch's own evidence (corrections shift sums only)."""
        regular = batch.regular.astype(np.float64)
        return cls(
            np.bincount(batch.actions, weights=regular, minlength=k),
            np.bincount(batch.actions, weights=batch.rewards, minlength=k),
            np.bincount(batch.actions, weights=regular * batch.rewards**2, minlength=k),
        )

    def faded_plus(self, fade: float, new: Evidence) -> Evidence:
        """This evidence weighted by ``fade``, plus ``new``."""
        return Evidence(
            fade * self.count + new.count,
            fade * self.reward_sum + new.reward_sum,
            fade * self.reward_sq_sum + new.reward_sq_sum,
        )

    def pooled(self) -> tuple[float, float] | None:
        """Mean and variance of every reward in the evidence, actions pooled (None if empty)."""
        total = self.count.sum()
        if total <= 0:
            return None
        mean = float(self.reward_sum.sum() / total)
        return mean, max(float(self.reward_sq_sum.sum() / total) - mean**2, 0.0)

    def pooled_std(self) -> float:
        """The pooled reward std of the evidence, or 1 (the largest a reward in [−1, 1] has) if empty."""
        pooled = self.pooled()
        return 1.0 if pooled is None else float(np.sqrt(pooled[1]))

    def shrunk(self, prior: float) -> tuple[Array, Array, Array] | None:
        """Per action the mean and variance shrunk towards the pooled ones by ``prior``
        pseudo-episodes, and the count plus that prior (None if empty)."""
        n = self.count
        pooled = self.pooled()
        if pooled is None:
            return None
        pooled_mean, pooled_var = pooled
        safe = np.maximum(n, 1e-12)
        own_var = np.where(n > 0, np.maximum(self.reward_sq_sum / safe - (self.reward_sum / safe) ** 2, 0.0), 0.0)
        c = max(prior, 1e-6)  # at least a trace of the prior: an action never tried has finite z
        return (self.reward_sum + c * pooled_mean) / (n + c), (n * own_var + c * pooled_var) / (n + c), n + c

    def z_against(self, leader: int, prior: float) -> Array:
        """z_a: the evidence that each action's mean reward is below the leader's."""
        shrunk = self.shrunk(prior)
        return np.zeros_like(self.count) if shrunk is None else z_statistics(shrunk, leader)


def fade(episodes: int, half_life: float | None) -> float:
    """2^(−N/H): the weight evidence keeps after N more episodes (1 if it never fades)."""
    return 0.5 ** (episodes / half_life) if half_life else 1.0


MIN_CHANGE_EPISODES = 5.0
"""The change test compares an action's recent and older means only when each rests on at least
this many episodes' weight (below that the Gaussian approximation of a mean is too rough)."""


def change_z(evidence: Evidence, recent: Evidence, corrections: Array | None = None) -> float:
    """The change test's statistic: the largest |m_a^recent − m_a^older| / √(v_a/n_a^recent +
    v_a/n_a^older) over the actions, where the older evidence is the state's minus the recent
    (both fade from the newest episode, the recent faster, so the difference weighs every episode
    by a non-negative weight) and minus ``corrections`` (C_a: the part of the state's reward sums
    that feedback corrections make; the recent sums hold none), and v_a the action's reward
    variance in the state, at least 1e-6 (0 when no action can be compared)."""
    older_n = evidence.count - recent.count
    ok = (recent.count >= MIN_CHANGE_EPISODES) & (older_n >= MIN_CHANGE_EPISODES)
    shrunk = evidence.shrunk(0.0)
    if not ok.any() or shrunk is None:
        return 0.0
    var = np.maximum(shrunk[1][ok], 1e-6)
    n_r, n_o = recent.count[ok], older_n[ok]
    older_sum = evidence.reward_sum[ok] - recent.reward_sum[ok]
    if corrections is not None:
        older_sum = older_sum - corrections[ok]
    diff = recent.reward_sum[ok] / n_r - older_sum / n_o
    return float(np.max(np.abs(diff) / np.sqrt(var / n_r + var / n_o)))


class Remembered(NamedTuple):
    state: Evidence
    """The evidence the bounds use from now on."""
    recent: Evidence | None
    """The recent evidence to store (None: the change test is off)."""
    z: float
    """The change test's statistic (0 when it is off)."""
    kept: float
    """The share of the episodes behind the state that it kept (below 1 when the test fired)."""
    corrections: Array | None = None
    """C_a to store with the recent sums (None: none)."""


def remember(
    cfg: LearnerConfig,
    evidence: Evidence,
    recent: Evidence,
    new: Evidence,
    episodes: int,
    corrected: Array | None = None,
    corrections: Array | None = None,
) -> Remembered:
    """The learner state after a batch of ``episodes`` whose evidence is ``new``: the faded state
    plus the batch; with the change test on, the recent evidence too, and the state is replaced by
    the recent evidence when the test's z exceeds the threshold. ``corrected`` is per action the
    sum of the batch's feedback corrections (part of ``new.reward_sum``), ``corrections`` the
    state's C_a before the batch; the recent sums and the test leave both out (module docstring:
    Change test)."""
    decay = fade(episodes, cfg.evidence_half_life)
    state = evidence.faded_plus(decay, new)
    if cfg.change_threshold is None:
        return Remembered(state, None, 0.0, 1.0)
    if corrections is not None:
        corrections = decay * corrections
    if corrected is not None:
        new = Evidence(new.count, new.reward_sum - corrected, new.reward_sq_sum)
        corrections = corrected if corrections is None else corrections + corrected
    recent = recent.faded_plus(fade(episodes, cfg.recent_half_life), new)
    z = change_z(state, recent, corrections)
    if z > cfg.change_threshold:
        return Remembered(recent, recent, z, float(recent.count.sum() / state.count.sum()))
    return Remembered(state, recent, z, 1.0, corrections)


def recent_from_state(state: Mapping[str, Any] | None, k: int) -> tuple[Evidence, Array | None, str | None]:
    """The change test's recent evidence and C_a in a learner state's ``recent`` entry (both
    empty, and the reason, when it cannot be used)."""
    recent, problem = Evidence.from_state(state, k)
    stored = (state or {}).get(CORRECTIONS) if not problem else None
    if stored is None:
        return recent, None, problem
    try:
        corrections = np.asarray(stored, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        corrections = None
        problem = f"learner state {RECENT}.{CORRECTIONS} unreadable ({type(exc).__name__}: {exc})"
    else:
        if corrections.shape != (k,) or not np.isfinite(corrections).all():
            problem = f"learner state {RECENT}.{CORRECTIONS}: not {k} finite entries"
    if problem:
        return Evidence.empty(k), None, f"{problem}; the change test's sums restart"
    return recent, corrections, None


def recent_to_state(recent: Evidence, corrections: Array | None) -> dict[str, Any]:
    """The ``recent`` entry of the learner state: the recent sums, and C_a when not all 0."""
    out = recent.to_state()
    rounded = [] if corrections is None else [round(float(x), 9) for x in corrections]
    if any(rounded):
        out[CORRECTIONS] = rounded
    return out


def advantages(
    cfg: LearnerConfig,
    rewards: Array,
    regular: NDArray[np.bool_],
    wr: Array,
    baseline: Array | float,
    fallback_std: float,
) -> tuple[Array, dict[str, float]]:
    """A_i = (r_i − b_i) / max(σ, σ_min) (a correction's A is δ/σ), with σ² the weighted mean of
    (r − b)² over the regular rows (weights ``wr``, zero for corrections); ``fallback_std`` when
    no row carries weight, and then the regular rows, with no baseline to be measured against,
    have no advantage."""
    wsum = wr.sum()
    centred = np.where(regular, rewards - baseline if wsum > 0 else 0.0, rewards)
    std = float(np.sqrt((wr * centred**2).sum() / wsum)) if wsum > 0 else fallback_std
    adv = centred / max(std, cfg.min_reward_std) if cfg.normalize_advantages else centred
    return adv, {"reward_std": std}


def weight_stats(cfg: LearnerConfig, ratio: Array) -> dict[str, float]:
    """The largest unclipped importance ratio and the share of rows the clip cut."""
    return {
        "max_importance_weight": float(ratio.max()),
        "clipped_fraction": float((ratio > cfg.importance_clip).mean()),
    }


def evidence_floor(
    cfg: LearnerConfig,
    logits: Array,
    evidence: Evidence,
    slack: float | None = None,
    *,
    normalise: bool = True,
    temperature: float = 1.0,
) -> Array:
    """θ_L − T·gap_a: the lowest logit each action may have (module docstring: Evidence bound), with
    gap_a = min(g₀ + κ·z_a⁺, c − ln Φ(−z_a⁺) + ln(1 + Σ_{b≠L} Φ(−z_b⁺)), max(c_T − ln P_a + ln P_L, 0))
    in log-probability (so ln π(a)/π(L) ≥ −gap_a at the policy's temperature T);
    ``slack`` replaces g₀, and ``normalise=False`` drops the last two terms' sharing over actions
    (the normalisation and the Thompson floor).

    The second term's last part normalises the pairwise probabilities Φ(−z) that an action beats
    the leader: with many actions they sum to more than 1, while the probability that any one of
    them is the best (what Thompson sampling draws it with, P_a in the third term) shrinks as they
    share it."""
    assert cfg.gap_per_evidence is not None
    leader = int(np.argmax(logits))
    shrunk = evidence.shrunk(cfg.evidence_prior)
    z = np.zeros_like(evidence.count) if shrunk is None else z_statistics(shrunk, leader)
    gap = (cfg.gap_slack if slack is None else slack) + cfg.gap_per_evidence * np.maximum(z, 0.0)
    if cfg.calibration is not None:
        log_beats = log_thompson(z)
        others = float(np.exp(np.delete(log_beats, leader)).sum()) if normalise else 0.0
        gap = np.minimum(gap, cfg.calibration - log_beats + math.log1p(others))
    if cfg.thompson_floor is not None and normalise and shrunk is not None:
        log_best = log_p_best(*shrunk)
        gap = np.minimum(gap, np.maximum(cfg.thompson_floor - log_best + log_best[leader], 0.0))
    return logits[leader] - temperature * gap


def bound_logits(
    cfg: LearnerConfig,
    logits: Array,
    evidence: Evidence,
    slack: float | None = None,
    *,
    normalise: bool = True,
    cap: bool = True,
    temperature: float = 1.0,
) -> tuple[Array, int, int]:
    """``logits`` lowered to the odds cap (unless ``cap`` is False), then raised to the evidence
    floor (``slack``, ``normalise`` and ``temperature`` as in :func:`evidence_floor`); and how many
    were raised and how many lowered (an action lowered by the cap and raised back by the floor
    counts once, as raised)."""
    new = logits.copy()
    ceiling = evidence_cap(cfg, new, evidence, temperature) if cap else None
    lowered = np.zeros(len(new), dtype=bool)
    if ceiling is not None:
        lowered = new > ceiling
        np.minimum(new, ceiling, out=new)
    floor = evidence_floor(cfg, new, evidence, slack, normalise=normalise, temperature=temperature)
    below = new < floor
    np.maximum(new, floor, out=new)
    return new, int(below.sum()), int((lowered & ~below).sum())


def evidence_cap(cfg: LearnerConfig, logits: Array, evidence: Evidence, temperature: float = 1.0) -> Array | None:
    """θ_E + T·(d + ln Φ(−z_a⁺) − ln Φ(z_a⁺)): the highest logit each action may have at the
    policy's temperature T (module docstring: Evidence bound), E the action whose mean reward the
    evidence puts highest (the leader when it is as good), z_a the evidence that a is worse than E;
    None without a cap or evidence. E's own logit is not capped."""
    if cfg.odds_cap is None or (shrunk := evidence.shrunk(cfg.evidence_prior)) is None:
        return None
    best = best_evidenced(shrunk[0], logits)
    cap = logits[best] + temperature * (cfg.odds_cap + log_posterior_odds(z_statistics(shrunk, best)))
    # Never below max_logit_gap under E (so the policy can still recover), nor beyond the logit range.
    gap = cfg.max_logit_gap if cfg.max_logit_gap is not None else 2 * cfg.logit_bound
    cap = np.maximum(cap, logits[best] - gap)
    cap[best] = np.inf
    return cap


def z_statistics(shrunk: tuple[Array, Array, Array], leader: int) -> Array:
    """(m_L − m_a) / √(v_L/n_L + v_a/n_a) from :meth:`Evidence.shrunk`'s means, variances, counts."""
    mean, var, n = shrunk
    se = np.sqrt(var[leader] / n[leader] + var / n)
    return np.where(se > 0, (mean[leader] - mean) / np.maximum(se, 1e-12), 0.0)


def log_posterior_odds(z: Array) -> Array:
    """ln Φ(−z⁺) − ln Φ(z⁺): the log-odds that an action whose evidence against it is z beats
    the other action (z ≤ 0 counts as 0, even odds); floored at ln 1e−300."""
    out = np.empty(len(z))
    for i, x in enumerate(z):
        x = max(float(x), 0.0) / math.sqrt(2.0)
        out[i] = math.log(max(0.5 * math.erfc(x), 1e-300)) - math.log(0.5 * math.erfc(-x))
    return out


def best_evidenced(means: Array, logits: Array) -> int:
    """E: the action with the highest (shrunk) mean reward; among equals, the highest logit."""
    top = np.flatnonzero(means >= means.max())
    return int(top[np.argmax(logits[top])])


LOCAL_GRIDS = 64
"""How many posteriors, the narrowest (the leader, with the most episodes, among them), get
quadrature points of their own in :func:`log_p_best`."""
LOCAL_POINTS = 65
"""Those points per posterior, over ±8 std: a quarter of a std apart."""
GRID_POINTS = 2_048
"""With more than ``LOCAL_GRIDS`` actions, points evenly spaced over every posterior's ±8 std, for the others."""


def log_p_best(mean: Array, var: Array, n: Array) -> Array:
    """ln P_a: the log-probability that each action's mean reward is the highest, under independent
    Gaussian posteriors N(m_a, v_a/n_a) (:meth:`Evidence.shrunk`'s means, variances, counts); what
    Thompson sampling with those posteriors draws each action with. By the trapezoid rule on one
    grid shared by every action::

        P_a = ∫ φ_a(x) Π_{b≠a} Φ_b(x) dx,   ln Π_{b≠a} Φ_b = Σ_b ln Φ_b − ln Φ_a

    The grid holds 65 points over ±8 std of each posterior (a's own density, and the steps of the
    Φ_b where they are steep, are all resolved at a quarter of a std), so it costs O(K²) for K actions;
    beyond :data:`LOCAL_GRIDS` actions the wider rest share an even grid. In logs throughout,
    so a tiny P_a stays finite (floored at ln 1e−300)."""
    std = np.sqrt(np.maximum(var, 1e-24) / n)
    narrowest = np.argsort(std)[:LOCAL_GRIDS]
    points = [(mean[narrowest, None] + std[narrowest, None] * np.linspace(-8.0, 8.0, LOCAL_POINTS)[None, :]).ravel()]
    if len(mean) > LOCAL_GRIDS:
        points.append(np.linspace(float((mean - 8 * std).min()), float((mean + 8 * std).max()), GRID_POINTS))
    x = np.unique(np.concatenate(points))
    u = (x[None, :] - mean[:, None]) / std[:, None]
    log_cdf = log_ndtr(u)
    log_pdf = -0.5 * u**2 - np.log(std * math.sqrt(2 * math.pi))[:, None]
    terms = log_pdf + log_cdf.sum(axis=0)[None, :] - log_cdf
    top = terms.max(axis=1, keepdims=True)
    gaps = np.diff(x)
    weights = np.concatenate([gaps, [0.0]]) / 2 + np.concatenate([[0.0], gaps]) / 2
    out = top[:, 0] + np.log(np.maximum(np.exp(terms - top) @ weights, 1e-300))
    return np.maximum(out, math.log(1e-300))


ERFC_FIT = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
            0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)
"""Chebyshev fit of ln(erfc(y)·e^(y²)·(1 + y/2)) for y ≥ 0, fractional error of erfc below 1.2e−7
(Press et al., Numerical Recipes, §6.2): numpy has no erfc, and its logarithm is what the tails need."""


def log_ndtr(u: Array) -> Array:
    """ln Φ(u), the standard normal log-CDF, elementwise and accurate far into the lower tail."""
    y = np.abs(u) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * y)
    poly = np.zeros_like(y)
    for c in reversed(ERFC_FIT[1:]):
        poly = (poly + c) * t
    log_erfc = np.log(t) - y * y + ERFC_FIT[0] + poly  # ln erfc(|u|/√2)
    lower = log_erfc - math.log(2.0)  # ln Φ(−|u|)
    return np.where(u < 0, lower, np.log1p(-np.exp(lower)))


def log_thompson(z: Array) -> Array:
    """ln Φ(−z⁺): the log of the Gaussian-posterior probability that an action whose evidence
    against it is z (z ≤ 0 counts as 0) beats the leader; floored at ln 1e−300."""
    return np.array([math.log(max(0.5 * math.erfc(max(float(x), 0.0) / math.sqrt(2.0)), 1e-300)) for x in z])


def softmax(logits: Array, temperature: float = 1.0) -> Array:
    z = logits / temperature
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def entropy(probs: Array) -> float:
    p = probs[probs > 0]
    return max(0.0, float(-(p * np.log(p)).sum()))  # 0.0, not −0.0, for a sure policy


def kl_divergence(p: Array, q: Array) -> float:
    """KL(p ‖ q) in nats (never below 0: rounding makes equal distributions' sum about −1e-17)."""
    mask = p > 0
    return max(0.0, float((p[mask] * (np.log(p[mask]) - np.log(q[mask]))).sum()))


def check_inputs(theta: Array, batch: Batch, temperature: float) -> None:
    """Raise ``ValueError`` naming the argument when the logits, the temperature or the batch's
    actions do not fit together (a NaN or zero temperature would otherwise come back as NaN logits)."""
    if theta.ndim != 1 or len(theta) == 0:
        raise ValueError(f"logits: must be a non-empty 1-D array, got shape {theta.shape}")
    _first_bad("logits", ~np.isfinite(theta), theta, "must be finite")
    if not 0 < float(temperature) < math.inf:
        raise ValueError(f"temperature: must be a positive finite number, got {temperature!r}")
    _first_bad("actions", batch.actions >= len(theta), batch.actions, f"must be an action index in [0, {len(theta)})")


def check_kinds(
    actions: NDArray[Any], rewards: NDArray[Any], logged_probs: NDArray[Any], corrections: NDArray[Any]
) -> None:
    """``ValueError`` naming the field unless every value is of the kind it stands for. No coercion:
    "0.5" is not a reward, 0.5 is not an action index, 2 is not a correction flag."""
    _first_bad_kind("actions", actions, "iu", "an integer action index")
    _first_bad_kind("rewards", rewards, "iuf", "a number")
    _first_bad_kind("logged_probs", logged_probs, "iuf", "a number")
    _first_bad_kind("corrections", corrections, "biu", "a boolean")
    _first_bad("corrections", (corrections != 0) & (corrections != 1), corrections, "must be a boolean")


def _first_bad_kind(name: str, values: NDArray[Any], kinds: str, what: str) -> None:
    """``ValueError`` naming the first of ``values`` unless their numpy kind is one of ``kinds``."""
    if values.size and values.dtype.kind not in kinds:
        _first_bad(name, np.ones(len(values), dtype=bool), values, f"must be {what}")


def _first_bad(name: str, mask: NDArray[np.bool_], values: NDArray[Any], problem: str) -> None:
    if mask.any():
        i = int(np.argmax(mask))
        raise ValueError(f"{name}[{i}]: {problem} (got {values[i]!r}; {int(mask.sum())} bad in all)")


NUMBER_FIT_EPISODES = 30
"""Episodes carrying a numeric feature, pooled over batches, from which its centre and scale are
set; until then the feature is not used (a first batch of one or two episodes would fix its scale
for good, and a wrong scale makes the feature a step at its centre)."""
PENDING_NUMBERS = "numbers_pending"
"""Learner-state key: per numeric feature not fitted yet, the count, mean and standard deviation
of the episodes that carried it so far."""
NUMBER_PROBE = 1.0
"""Where a numeric feature's evidence bound applies: at x̃ = ±1 (one scale from its centre), by the
evidence of the episodes on that side of the centre (±1 was best on the benchmark's numeric problem:
0.86× per-bin Thompson with 1/20 seeds ending below 0.5, against 0.68× with 4/20 unbounded and 1.31×
with 2/20 at ±2)."""


@dataclass(frozen=True)
class ContextBatch:
    """Scored episodes of a structured policy as arrays."""

    actions: NDArray[np.int64]
    """(N, D) value index per dimension."""
    rewards: Array
    logged_probs: Array
    corrections: NDArray[np.bool_]
    categories: NDArray[np.int64]
    """(N, F_c) segment index per categorical feature; −1 where the episode has none learned."""
    numbers: Array
    """(N, F_n) standardised numeric features x̃ (0 where missing)."""
    offered: NDArray[np.bool_] | None = None
    """(N, V) the actions each row's request offered (None: every row chose among the policy's own)."""

    @property
    def regular(self) -> NDArray[np.bool_]:
        return ~self.corrections

    def __len__(self) -> int:
        return len(self.rewards)


@dataclass
class Params:
    """The learnable arrays of a structured policy (module docstring: θ, δ, β)."""

    theta: Array
    offsets: list[Array]
    """Per categorical feature, (S_f, V): one row per segment."""
    weights: Array
    """(F_n, V)."""
    action: Array = field(default_factory=lambda: np.zeros(0))
    """(P,) w: one weight per learned value of every action feature (module docstring: Action features)."""
    action_offsets: list[Array] = field(default_factory=list)
    """Per categorical context feature, (S_f, P): u, one row per segment (empty without action features)."""

    def blocks(self) -> list[Array]:
        return [self.theta, *self.offsets, self.weights, self.action, *self.action_offsets]

    def copy(self) -> Params:
        return self.of_blocks([b.copy() for b in self.blocks()])

    def of_blocks(self, blocks: Sequence[Array]) -> Params:
        """Parameters of this shape from ``blocks`` in :meth:`blocks` order."""
        f = len(self.offsets)
        g = len(self.action_offsets)
        return Params(blocks[0], list(blocks[1 : 1 + f]), blocks[1 + f], blocks[2 + f], list(blocks[3 + f : 3 + f + g]))

    def add(self, other: Params, scale: float) -> Params:
        return self.of_blocks([a + scale * b for a, b in zip(self.blocks(), other.blocks(), strict=True)])

    def flat(self) -> Array:
        return np.concatenate([b.ravel() for b in self.blocks()])

    def with_flat(self, values: Array) -> Params:
        out, at = [], 0
        for b in self.blocks():
            out.append(values[at : at + b.size].reshape(b.shape).copy())
            at += b.size
        return self.of_blocks(out)


@dataclass
class Model:
    """A structured policy document's shape: layout, exclusions, features and segments."""

    layout: Layout
    excluded: NDArray[np.int64]
    """(|E|, D) excluded configurations."""
    categorical: list[str]
    segments: list[list[str]]
    """Per categorical feature, its segments' names, in ``offsets`` row order."""
    numeric: list[str]
    centers: list[float]
    scales: list[float]
    fitted: list[bool]
    """Per numeric feature, whether its centre and scale are set (from :data:`NUMBER_FIT_EPISODES`)."""
    temperature: float
    pending: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per numeric feature still short of :data:`NUMBER_FIT_EPISODES`, its moments so far (the
    learner state's :data:`PENDING_NUMBERS`)."""
    actions: ActionSpace | None = None
    """The actions described by features, and those the batch's requests offered (None: neither)."""

    @property
    def slices(self) -> list[slice]:
        return [slice(s, s + k) for s, k in zip(self.layout.starts, self.layout.sizes, strict=True)]


# --------------------------------------------------------------------------- batch from documents


class Rows(NamedTuple):
    """Scored rows of a structured policy as the trainer collects them: per row the value index
    of each dimension, the reward (a correction's: its reward change), the logged joint
    probability, whether it is a feedback correction, and the context it was chosen for; and
    per row the candidates its request offered, or None (a row with candidates gives as its
    action the chosen one's position among them)."""

    actions: Sequence[Sequence[int]] | NDArray[np.int64]
    rewards: Sequence[float] | Array
    logged_probs: Sequence[float] | Array
    corrections: Sequence[bool] | NDArray[np.bool_]
    contexts: Sequence[Mapping[str, Any] | None]
    candidates: Sequence[Sequence[Candidate] | None] | None = None


@dataclass
class ActionSpace:
    """A flat policy's actions with their features, as the learner sees a batch: the policy's own,
    then the new ones the batch's requests offered (the most chosen first), the feature values Φ
    and which of the new ones the next version keeps (module docstring: Action features)."""

    actions: list[Action]
    """The policy's actions, then the new ones (each with the features its latest row gave)."""
    kept: int
    """How many of ``actions`` the next version keeps (the rest are scored by features alone)."""
    names: list[str]
    """The action features, in the policy's order."""
    values: list[list[str]]
    """Per action feature, its learned values, in ``Params.action`` order."""
    phi: Array
    """(V, P) 1 where the action has the value."""


def action_space(doc: PolicyDocument, rows: Rows) -> tuple[ActionSpace | None, NDArray[np.bool_] | None, list[int]]:
    """The action space of ``doc`` and ``rows`` (None for a policy without action features whose
    rows offer no candidates), each row's offered actions (None when no row has candidates), and
    each row's action index in the space (the rows' own where they have no candidates). Values and
    actions first seen here are added, the most frequent first, within :data:`MAX_FEATURE_VALUES`,
    :data:`MAX_ACTIONS` and :data:`MAX_LEARNED_VALUES`."""
    given = rows.candidates
    if given is not None and len(given) != len(rows.contexts):
        raise ValueError(f"candidates: must have one entry per row ({len(given)} for {len(rows.contexts)} rows)")
    if doc.action_features is None and not (given and any(c for c in given)):
        return None, None, []
    if doc.dimensions is not None or doc.excluded:
        raise ValueError("candidates: only a flat policy (no dimensions nor exclusions) chooses among offered actions")
    actions = {a.id: a for a in doc.actions}
    chosen: dict[str, int] = {}
    new: dict[str, Action] = {}
    for i, offered in enumerate(given or ()):
        if not offered:
            continue
        j = int(np.asarray(rows.actions[i]).reshape(-1)[0])
        if not 0 <= j < len(offered):
            raise ValueError(f"actions[{i}]: {j} is not the position of a candidate (0 to {len(offered) - 1})")
        chosen[offered[j].id] = chosen.get(offered[j].id, 0) + 1
        for c in offered:
            own = actions.get(c.id)
            if own is None:
                new[c.id] = Action.model_construct(id=c.id, description="", config={}, features=c.features)
            elif c.features is not None and c.features != own.features:
                actions[c.id] = own.model_copy(update={"features": c.features})  # the latest given
    ordered = [new[a] for a in sorted(new, key=lambda a: -chosen.get(a, 0))]  # stable: first seen among equals
    learned = sum(f.learned for f in doc.features or [])
    room = min(MAX_ACTIONS, MAX_LEARNED_VALUES // max(learned, 1)) - len(doc.actions)
    space_actions = list(actions.values()) + ordered
    index = {a.id: k for k, a in enumerate(space_actions)}
    names = [f.name for f in doc.action_features or []]
    values = [list(f.weights) for f in doc.action_features or []]
    budget = MAX_LEARNED_VALUES - sum(f.parameters for f in doc.action_features or [])
    for k, name in enumerate(names):
        counts: dict[str, int] = {}
        for a in space_actions:
            if a.features and name in a.features:
                v = segment_name(a.features[name])
                counts[v] = counts.get(v, 0) + 1
        for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if v not in values[k] and len(values[k]) < MAX_FEATURE_VALUES and budget > 0:
                values[k].append(v)
                budget -= 1
    column = {(k, v): p for p, (k, v) in enumerate((k, v) for k, vs in enumerate(values) for v in vs)}
    phi = np.zeros((len(space_actions), len(column)))
    for r, a in enumerate(space_actions):
        for k, name in enumerate(names):
            if a.features and name in a.features:
                p = column.get((k, segment_name(a.features[name])))
                if p is not None:
                    phi[r, p] = 1.0
    space = ActionSpace(space_actions, len(doc.actions) + max(0, min(room, len(ordered))), names, values, phi)
    n = len(rows.contexts)
    if not given or not any(c for c in given):
        return space, None, []
    offered_mask = np.zeros((n, len(space_actions)), dtype=bool)
    local = []
    for i in range(n):
        row = given[i] if i < len(given) else None
        if row:
            offered_mask[i, [index[c.id] for c in row]] = True
            local.append(index[row[int(np.asarray(rows.actions[i]).reshape(-1)[0])].id])
        else:
            offered_mask[i, : len(doc.actions)] = True
            local.append(int(np.asarray(rows.actions[i]).reshape(-1)[0]))
    return space, offered_mask, local


def prepare(doc: PolicyDocument, rows: Rows) -> tuple[Model, Params, ContextBatch]:
    """The model, parameters and batch of ``doc`` and these rows. Segments first seen here are
    added (the most frequent first, up to :data:`MAX_SEGMENTS` per feature and
    :data:`MAX_LEARNED_VALUES` in all) with zero offsets;
    a numeric feature's centre and scale are set once :data:`NUMBER_FIT_EPISODES` episodes
    (not corrections) have carried it, pooled over batches in the learner state. Rows of the wrong
    shape or kind raise ``ValueError`` naming the field (:func:`row_arrays`)."""
    layout = Layout.of(doc)
    actions, rewards, logged_probs, corrections = row_arrays(rows, len(layout.sizes))
    space, offered, local = action_space(doc, rows)
    if space is not None:
        layout = Layout.build(space.actions, None)
        if local:
            actions = np.asarray(local, dtype=np.int64).reshape(-1, 1)
    contexts = rows.contexts
    v = len(layout.value_ids[0]) if space is not None else len(doc.actions)
    own = len(doc.actions)
    budget = MAX_LEARNED_VALUES // v - sum(f.learned for f in doc.features or [])  # segments that may still be added
    categorical, segments, offsets = [], [], []
    numeric, centers, scales, weights, fitted = [], [], [], [], []
    pending_in = (doc.learner_state or {}).get(PENDING_NUMBERS) or {}
    pending: dict[str, dict[str, float]] = {}
    readers = [FeatureReader(feature) for feature in doc.features or []]
    shared = shared_rows(contexts)  # rows sharing context objects: each object read once
    read, spread = (contexts, None) if shared is None else shared
    per_read = None if spread is None else np.bincount(spread, minlength=len(read))  # the rows each stands for
    by_segment = segment_columns(read, [r for r in readers if r.segmented])
    read_segments = iter(by_segment)
    number_columns: list[NumberColumn] = []
    for feature, reader in zip(doc.features or [], readers, strict=True):
        if feature.segmented:
            known = dict(feature.segments or {})
            column = next(read_segments)
            for name, _ in sorted(column.counts(per_read).items(), key=lambda kv: (-kv[1], kv[0])):
                if name not in known and len(known) < MAX_SEGMENTS and budget > 0:
                    known[name] = [0.0] * own
                    budget -= 1
            categorical.append(feature.name)
            segments.append(list(known))
            offsets.append(_padded(np.array(list(known.values()), dtype=np.float64).reshape(len(known), own), v))
        else:
            center, scale, is_fitted = feature.center, feature.scale, feature.weights is not None
            numbers = number_column(read, reader)
            number_columns.append(numbers := numbers if spread is None else numbers.taken(spread))
            if not is_fitted:
                present = numbers.transformed[numbers.present & ~corrections]
                seen = pooled_moments(_moments_state(pending_in.get(feature.name)), moments(present))
                if seen[0] >= NUMBER_FIT_EPISODES:
                    center, scale, is_fitted = *centre_and_scale(seen[1], seen[2]), True
                elif seen[0]:
                    pending[feature.name] = {"count": seen[0], "mean": seen[1], "std": seen[2]}
            fitted.append(is_fitted)
            numeric.append(feature.name)
            centers.append(center)
            scales.append(scale)
            weights.append(_padded(np.asarray(feature.weights if feature.weights is not None else [0.0] * own,
                                              dtype=np.float64), v))
    model = Model(
        layout,
        np.array(excluded_configurations(doc), dtype=np.int64).reshape(-1, len(layout.sizes)),
        categorical,
        segments,
        numeric,
        centers,
        scales,
        fitted,
        doc.temperature,
        pending,
        space,
    )
    params = Params(
        _padded(np.asarray(doc.logits, dtype=np.float64), v),
        offsets,
        np.array(weights, dtype=np.float64).reshape(len(numeric), v),
        *action_params(doc, space, categorical, segments),
    )
    n = len(rewards)
    cats = np.full((len(read), len(categorical)), -1, dtype=np.int64)  # per row read: spread below
    nums = np.zeros((n, len(numeric)), dtype=np.float64)
    for f, (column, names) in enumerate(zip(by_segment, segments, strict=True)):
        cats[:, f] = column.indices(names)
    if spread is not None:
        cats = cats[spread]
    for j, numbers in enumerate(number_columns):
        if fitted[j]:
            nums[:, j] = numbers.standardised(centers[j], scales[j])
    batch = ContextBatch(actions, rewards, logged_probs, corrections, cats, nums, offered)
    return model, params, batch


def _padded(values: Array, v: int) -> Array:
    """``values`` (its last axis over the policy's actions) with 0 for the new actions up to ``v``."""
    pad = v - values.shape[-1]
    return values if pad <= 0 else np.concatenate([values, np.zeros((*values.shape[:-1], pad))], axis=-1)


def action_params(
    doc: PolicyDocument, space: ActionSpace | None, categorical: list[str], segments: list[list[str]]
) -> tuple[Array, list[Array]]:
    """w and, per categorical context feature, u of ``doc``'s action features laid out as ``space``
    orders their values (0 for values and segments first seen)."""
    if space is None:
        return np.zeros(0), []
    stored = {f.name: f for f in doc.action_features or []}
    w = np.array([stored[name].weights.get(v, 0.0) if name in stored else 0.0
                  for name, vs in zip(space.names, space.values, strict=True) for v in vs])
    u = []
    for f, names in zip(categorical, segments, strict=True):
        block = np.zeros((len(names), len(w)))
        for s, segment in enumerate(names):
            block[s] = [((stored[name].by_context or {}).get(f) or {}).get(segment, {}).get(v, 0.0)
                        for name, vs in zip(space.names, space.values, strict=True) for v in vs]
        u.append(block)
    return w, u


def row_arrays(rows: Rows, dimensions: int) -> tuple[NDArray[np.int64], Array, Array, NDArray[np.bool_]]:
    """The rows' actions (N, D), rewards, logged probabilities and correction flags as arrays, their
    kinds checked as :meth:`agent_learning.learning.reinforce.Batch.from_arrays` checks a flat batch's (0.7 is
    no value index, "0.5" no reward): ``ValueError`` naming the field, never a silent conversion."""
    n = len(rows.contexts)
    # Indices and flags read in one pass where they are small integers, else as numpy reads them
    # (0 and 1 alone may all be booleans, no action indices).
    a = byte_column(rows.actions, dimensions)
    if a is None or a.max(initial=0) <= 1:
        try:
            a = np.asarray(rows.actions)
        except ValueError:
            problem = f"must be {dimensions} value indices per row, got rows of other lengths"
            raise ValueError(f"actions: {problem}") from None
    if a.size == 0:
        a = a.reshape(0, dimensions)  # no rows (np.asarray([]) is 1-D)
    c = byte_column(rows.corrections)
    if c is None:
        c = np.asarray(rows.corrections)
    r, p = np.asarray(rows.rewards), np.asarray(rows.logged_probs)
    for name, values, shape in (("actions", a, (n, dimensions)), ("rewards", r, (n,)),
                                ("logged_probs", p, (n,)), ("corrections", c, (n,))):
        if values.shape != shape:
            raise ValueError(f"{name}: must have shape {shape} for {n} contexts and {dimensions} dimensions")
    check_kinds(a.ravel(), r, p, c)
    return a.astype(np.int64), r.astype(np.float64), p.astype(np.float64), c.astype(bool)


Moments = tuple[int, float, float]
"""(count, mean, standard deviation) of a numeric feature's values."""


def moments(values: Array) -> Moments:
    """The count, mean and (population) standard deviation of ``values``, computed on the values
    divided by the largest magnitude so that values near ±1e308 do not overflow."""
    if not values.size:
        return 0, 0.0, 0.0
    largest = float(np.abs(values).max())
    if largest == 0.0:
        return int(values.size), 0.0, 0.0
    unit = values / largest
    return int(values.size), float(unit.mean()) * largest, float(unit.std()) * largest


def pooled_moments(a: Moments, b: Moments) -> Moments:
    """The moments of two samples together (Chan et al.'s pairwise update), without overflow."""
    (na, ma, sa), (nb, mb, sb) = a, b
    if not na or not nb:
        return a if na else b
    n = na + nb
    largest = max(abs(ma), abs(mb), sa, sb)
    if largest == 0.0:
        return n, 0.0, 0.0
    ua, ub, va, vb = ma / largest, mb / largest, sa / largest, sb / largest
    mean = ua * (na / n) + ub * (nb / n)
    var = (na * va**2 + nb * vb**2) / n + (na / n) * (nb / n) * (ub - ua) ** 2
    return n, mean * largest, math.sqrt(var) * largest


def _moments_state(data: Any) -> Moments:
    """Moments kept in the learner state; anything else (a state from before) as none."""
    try:
        n, mean, std = int(data["count"]), float(data["mean"]), float(data["std"])
    except (TypeError, KeyError, ValueError):
        return 0, 0.0, 0.0
    return (n, mean, std) if n > 0 and math.isfinite(mean) and math.isfinite(std) and std >= 0 else (0, 0.0, 0.0)


def centre_and_scale(mean: float, std: float) -> tuple[float, float]:
    """A numeric feature's centre and scale from its episodes' mean and standard deviation (scale 1
    when they are all equal), rounded as the document keeps them: the scale to 9 significant
    digits, the centre to about a billionth of the scale (9 decimals when the scale is 1 or more)."""
    if not std > 0.0:  # all equal (or a spread below the smallest float)
        return round(mean, 9), 1.0
    decimals = max(9, 8 - math.floor(math.log10(std)))
    return round(mean, decimals), round(std, decimals)


def features_out(doc: PolicyDocument, model: Model, params: Params) -> list[dict[str, Any]] | None:
    """The document's ``features`` with the learned segments, offsets and weights."""
    if doc.features is None:
        return None
    out = []
    for feature in doc.features:
        declared = feature.model_dump(include={"name", "kind", "transform", "bins"})  # the transform kept
        if feature.segmented:
            f = model.categorical.index(feature.name)
            segments = {name: _rounded(params.offsets[f][k]) for k, name in enumerate(model.segments[f])}
            out.append({**declared, **({"segments": segments} if segments else {})})
        elif not model.fitted[model.numeric.index(feature.name)]:
            out.append(declared)  # not seen yet: its centre comes later
        else:
            j = model.numeric.index(feature.name)
            out.append(
                {
                    **declared,
                    "weights": _rounded(params.weights[j]),
                    "center": model.centers[j],  # rounded where they are set
                    "scale": model.scales[j],
                }
            )
    return out


def action_features_out(doc: PolicyDocument, model: Model, params: Params) -> list[dict[str, Any]] | None:
    """The document's ``action_features`` with the learned w and u (interactions that are 0 left out)."""
    space = model.actions
    if doc.action_features is None or space is None:
        return None
    out, at = [], 0
    for name, values in zip(space.names, space.values, strict=True):
        part = slice(at, at + len(values))
        at += len(values)
        weights = dict(zip(values, _rounded(params.action[part]), strict=True))
        feature: dict[str, Any] = {"name": name, "weights": weights}
        by_context: dict[str, Any] = {}
        for f, (context_feature, u) in enumerate(zip(model.categorical, params.action_offsets, strict=True)):
            for k, segment in enumerate(model.segments[f]):
                row = {v: x for v, x in zip(values, _rounded(u[k, part]), strict=True) if x != 0.0}
                if row:
                    by_context.setdefault(context_feature, {})[segment] = row
        if by_context:
            feature["by_context"] = by_context
        out.append(feature)
    return out


def _resized(state: Any, v: int, size: int) -> Any:
    """A learner state whose per-action lists (of ``v`` numbers) have ``size`` entries: cut, or with 0
    for the actions added."""
    if isinstance(state, Mapping):
        return {key: _resized(value, v, size) for key, value in state.items()}
    if isinstance(state, list):
        if len(state) == v and all(isinstance(x, int | float) and not isinstance(x, bool) for x in state):
            return state[:size] + [0.0] * (size - v)
        return [_resized(x, v, size) for x in state]
    return state


def _rounded(values: Array) -> list[float]:
    return [round(float(x), 6) for x in values]


# --------------------------------------------------------------------------- the math


class Contexts:
    """The distinct contexts of a batch: rows with the same features share their probabilities,
    so the math runs once per context (U of them) and rows only gather and scatter."""

    def __init__(self, batch: ContextBatch, model: Model | None = None) -> None:
        n = len(batch)
        self.phi = model.actions.phi if model is not None and model.actions is not None else None
        if batch.numbers.shape[1] and np.any(batch.numbers):  # numeric features: every row its own
            first, inverse, counts = np.arange(n), np.arange(n), np.ones(n)
        elif batch.offered is not None:  # a context is also the set of actions offered
            keys = np.hstack([segment_keys(batch.categories)[:, None], batch.offered.astype(np.int64)])
            _, first, inverse, counts = np.unique(keys, axis=0, return_index=True, return_inverse=True,
                                                  return_counts=True)
        elif batch.categories.shape[1]:
            _, first, inverse, counts = np.unique(
                segment_keys(batch.categories), return_index=True, return_inverse=True, return_counts=True
            )
        else:  # no features: one context
            first, inverse, counts = np.zeros(min(n, 1), dtype=np.int64), np.zeros(n, dtype=np.int64), np.array([n])
        self.categories = batch.categories[first]
        self.numbers = batch.numbers[first]
        self.offered = None if batch.offered is None else batch.offered[first]
        self.inverse = np.asarray(inverse, dtype=np.int64).reshape(-1)
        self.counts = np.asarray(counts, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.counts)

    def logits(self, params: Params) -> Array:
        """ℓ for each distinct context, (U, V)."""
        out = np.broadcast_to(params.theta, (len(self.categories), len(params.theta))).copy()
        for f, offsets in enumerate(params.offsets):
            rows = self.categories[:, f]
            has = rows >= 0
            out[has] += offsets[rows[has]]
        if params.weights.size:
            out += self.numbers @ params.weights
        if self.phi is not None and params.action.size:
            out += self.action_weights(params) @ self.phi.T
        if self.offered is not None:
            out[~self.offered] = -np.inf  # not offered: probability 0
        return out

    def action_weights(self, params: Params) -> Array:
        """w + Σ_f u_f[x_f] for each distinct context, (U, P)."""
        out = np.broadcast_to(params.action, (len(self.categories), len(params.action))).copy()
        for f, u in enumerate(params.action_offsets):
            rows = self.categories[:, f]
            has = rows >= 0
            out[has] += u[rows[has]]
        return out


def segment_keys(categories: NDArray[np.int64]) -> NDArray[np.int64]:
    """One integer per row naming its segments of every categorical feature (mixed radix)."""
    keys = np.zeros(len(categories), dtype=np.int64)
    for f in range(categories.shape[1]):
        column = categories[:, f] + 1  # −1 (no segment) → 0
        keys = keys * (int(column.max(initial=0)) + 1) + column
    return keys


class Tallies:
    """Per distinct context u and value v, sums over the rows of u that chose v (in its
    dimension): rows, regular episodes, advantages, rewards and squared rewards of regular
    episodes. Everything the direction and the evidence need is a sum of these."""

    def __init__(self, contexts: Contexts, model: Model, batch: ContextBatch, advantages: Array) -> None:
        u, v = len(contexts), sum(model.layout.sizes)
        d = len(model.layout.sizes)
        cols = batch.actions + np.array(model.layout.starts)
        keys = (contexts.inverse[:, None] * v + cols).ravel()
        regular = batch.regular.astype(np.float64)

        def tally(values: Array) -> Array:
            weights = values if d == 1 else np.repeat(values, d)  # one key per row and dimension
            return np.bincount(keys, weights=weights, minlength=u * v).reshape(u, v)

        self.rows = np.bincount(keys, minlength=u * v).reshape(u, v).astype(np.float64)
        self.regular = tally(regular)
        self.advantage = tally(advantages)
        self.reward = tally(batch.rewards)
        self.reward_sq = tally(regular * batch.rewards**2)
        self.corrected = None if batch.regular.all() else tally(np.where(batch.regular, 0.0, batch.rewards)).sum(axis=0)
        """Per value, the sum of the batch's feedback corrections (None without any)."""
        self.categories = contexts.categories
        self.numbers = contexts.numbers
        halves = np.where(contexts.numbers > 0, 1, np.where(contexts.numbers < 0, 0, -1))
        self.cells = np.hstack([contexts.categories, halves.astype(np.int64)])
        """Per context, its cell in each evidence group: the segment of each categorical feature,
        then the half (0 below, 1 above the centre, −1 at it or missing) of each numeric one."""

    def by_segment(self, table: Array, group: int, cells: int) -> Array:
        """``table`` summed over the contexts of each cell of an evidence group, (cells, V)."""
        rows = self.cells[:, group]
        has = rows >= 0
        out = np.zeros((cells, table.shape[1]))
        np.add.at(out, rows[has], table[has])
        return out


def dimension_softmax(logits: Array, model: Model) -> Array:
    """s_d(· | x) for every row of ``logits``, dimension by dimension, (rows, V)."""
    out = np.empty_like(logits)
    for sl in model.slices:
        z = logits[:, sl] / model.temperature
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        out[:, sl] = e / e.sum(axis=1, keepdims=True)
    return out


MIN_ALLOWED_MASS = 1e-300
"""Floor of Z_s = 1 − Σ_E Π_d s_d: when the excluded configurations hold all the mass float64 can
resolve (a temperature of 0.1 and a best value in each dimension that together are excluded),
1 − Σ rounds to 0; q and the marginals of q are then held at most 1, not divided by 0."""


def excluded_mass(s: Array, model: Model) -> Array:
    """Σ_{e ∈ E} Π_d s_d(e_d), per row (0 without exclusions)."""
    if not len(model.excluded):
        return np.zeros(len(s))
    cols = model.excluded + np.array(model.layout.starts)
    return s[:, cols].prod(axis=2).sum(axis=1)


def row_cells(model: Model, batch: ContextBatch, inverse: NDArray[np.int64], v: int) -> NDArray[np.int64]:
    """Per row and dimension, the flat index of its context's chosen value in a (U, V) table: one
    gather of ``table.ravel()`` reads every row's cells (a two-axis fancy index costs more)."""
    return inverse[:, None] * v + (batch.actions + np.array(model.layout.starts))


def log_q(s: Array, model: Model, batch: ContextBatch, inverse: NDArray[np.int64]) -> Array:
    """log q(a_i | x_i) of every row, from the per-context probabilities ``s``."""
    log_s = np.log(np.maximum(s, 1e-300))
    cells = log_s.ravel()[row_cells(model, batch, inverse, s.shape[1])]
    out = cells[:, 0].copy() if cells.shape[1] == 1 else cells.sum(axis=1)
    if len(model.excluded):
        out -= np.log(np.maximum(1.0 - excluded_mass(s, model), MIN_ALLOWED_MASS))[inverse]
        np.minimum(out, 0.0, out=out)  # a probability, also where rounding leaves Z_s unresolved
    return out


def context_gradient(s: Array, model: Model, batch: ContextBatch, inverse: NDArray[np.int64], coef: Array) -> Array:
    """Σ_{i in context u} coef_i ∇_ℓ log q(a_i | x_u) for every context u, (U, V) (module
    docstring): the rows' one-hot part is scattered with one bincount, the rest is per context."""
    t = model.temperature
    u, v = s.shape
    cols = batch.actions + np.array(model.layout.starts)
    keys = (inverse[:, None] * v + cols).ravel()
    weights = coef if cols.shape[1] == 1 else np.repeat(coef, cols.shape[1])  # one key per row and dimension
    chosen = np.bincount(keys, weights=weights, minlength=u * v).reshape(u, v)
    total = np.bincount(inverse, weights=coef, minlength=u)[:, None]
    grad = (chosen - total * s) / t
    if len(model.excluded):
        ecols = model.excluded + np.array(model.layout.starts)
        masses = s[:, ecols].prod(axis=2)  # (U, |E|)
        excluded_at = np.zeros_like(s)  # per value v of each dimension: Σ_{e ∈ E, e_d = v} Π_d' s_d'(e_d')
        for k in range(len(model.excluded)):
            excluded_at[:, ecols[k]] += masses[:, k : k + 1]
        z = np.maximum(1.0 - masses.sum(axis=1), MIN_ALLOWED_MASS)
        # ∇ log Z_s = (q_d − s_d)/T with q_d(v) = (s_d(v) − excluded_at)/Z_s, q's marginal (module
        # docstring); a marginal is in [0, 1], which holds it where rounding leaves Z_s unresolved.
        marginal = np.clip((s - excluded_at) / z[:, None], 0.0, 1.0)
        grad -= total * (marginal - s) / t
    return grad


def surrogate(
    params: Params, model: Model, batch: ContextBatch, weights: Array, advantages: Array, beta: float
) -> float:
    """L = 1/N Σ w_i A_i log q(a_i | x_i) + β Σ_d H(s_d(θ)); its gradient is :func:`gradient`."""
    contexts = Contexts(batch, model)
    s = dimension_softmax(contexts.logits(params), model)
    value = float((weights * advantages * log_q(s, model, batch, contexts.inverse)).mean())
    g = dimension_softmax(params.theta[None, :], model)[0]
    return value + beta * sum(entropy(g[sl]) for sl in model.slices)


def gradient(
    params: Params,
    model: Model,
    batch: ContextBatch,
    weights: Array,
    advantages: Array,
    beta: float,
    contexts: Contexts | None = None,
    probabilities: Array | None = None,
) -> Params:
    """The exact gradient of :func:`surrogate` with respect to θ, every δ and every β
    (``contexts`` and their per-dimension ``probabilities`` when the caller has them already)."""
    contexts = contexts or Contexts(batch, model)
    s = dimension_softmax(contexts.logits(params), model) if probabilities is None else probabilities
    per_context = context_gradient(s, model, batch, contexts.inverse, weights * advantages / len(batch))
    theta = per_context.sum(axis=0)
    g = dimension_softmax(params.theta[None, :], model)[0]
    log_g = np.log(np.maximum(g, np.finfo(float).tiny))
    for sl in model.slices:
        h = -(g[sl] * log_g[sl]).sum()
        theta[sl] += beta * (-g[sl] * (log_g[sl] + h) / model.temperature)
    offsets = []
    for f, o in enumerate(params.offsets):
        rows = contexts.categories[:, f]
        has = rows >= 0
        acc = np.zeros_like(o)
        np.add.at(acc, rows[has], per_context[has])
        offsets.append(acc)
    weights_g = contexts.numbers.T @ per_context if params.weights.size else np.zeros_like(params.weights)
    action, action_offsets = np.zeros_like(params.action), [np.zeros_like(u) for u in params.action_offsets]
    if contexts.phi is not None and params.action.size:
        by_value = per_context @ contexts.phi  # (U, P): Σ_a ∂/∂ℓ_a · φ(a)
        action = by_value.sum(axis=0)
        for f, u in enumerate(action_offsets):
            rows = contexts.categories[:, f]
            has = rows >= 0
            np.add.at(u, rows[has], by_value[has])
    return Params(theta, offsets, weights_g, action, action_offsets)


class Reinforce:
    """REINFORCE with baseline, clipped importance weights, entropy bonus and trust region, for
    every policy: a flat list of actions is one dimension without context (module docstring)."""

    name = "reinforce"

    def __init__(self, config: LearnerConfig | None = None) -> None:
        self.config = config or LearnerConfig()

    def learn(self, doc: PolicyDocument, rows: Rows) -> Update:
        """One update of a policy document on scored rows (the trainer's entry point): the new
        logits, features, metrics and learner state. A policy with interactions learns on its merged
        view, each declared pair one dimension (rows give its values as :meth:`Layout.of` parses them)."""
        if doc.interactions:
            update = self.learn(merged_document(doc), rows)
            fields = declared_fields(doc, update.logits, update.features)
            return replace(update, logits=np.asarray(fields["logits"]), features=fields["features"],
                           interactions=fields["interactions"])
        model, params, batch = prepare(doc, rows)
        _check(batch, model)
        space = model.actions
        v, own = len(params.theta), len(doc.actions)
        state_in = _resized(doc.learner_state, own, v) if space is not None and v != own else doc.learner_state
        new, metrics, state = self.step(params, model, batch, state_in)
        state = {key: value for key, value in state.items() if key != PENDING_NUMBERS}
        if model.pending:
            state[PENDING_NUMBERS] = model.pending
        if space is None:
            return Update(new.theta, metrics, state, features_out(doc, model, new))
        kept = space.kept  # the new actions past it are scored by their features alone
        if kept < v:
            new = new.of_blocks([new.theta[:kept], *(o[:, :kept] for o in new.offsets), new.weights[:, :kept],
                                 new.action, *new.action_offsets])
            state = _resized(state, v, kept)
        actions = [a.model_dump(exclude_none=True) for a in space.actions[:kept]]
        return Update(new.theta, metrics, state, features_out(doc, model, new), actions,
                      action_features_out(doc, model, new))

    def update(
        self, logits: ArrayLike, batch: Batch, temperature: float = 1.0, state: Mapping[str, Any] | None = None
    ) -> Update:
        """One training step of a flat list of logits on ``batch`` (its episodes as arrays) from the
        learner ``state`` the previous update returned (None or {} for a new policy): the batch as
        the rows of one dimension without context, learned as :meth:`learn` learns them."""
        theta = np.asarray(logits, dtype=np.float64)
        check_inputs(theta, batch, temperature)
        model, params, rows = flat_inputs(theta, batch, temperature)
        new, metrics, new_state = self.step(params, model, rows, state)
        return Update(new.theta, metrics, new_state)

    # -- statistics

    def weights_and_advantages(
        self,
        params: Params,
        model: Model,
        batch: ContextBatch,
        fallback_std: float = 1.0,
        contexts: Contexts | None = None,
        probabilities: Array | None = None,
    ) -> tuple[Array, Array, dict[str, float]]:
        """Clipped importance weights w, context-baseline advantages A and their statistics
        (``contexts`` and their per-dimension ``probabilities`` when the caller has them already)."""
        cfg = self.config
        contexts = contexts or Contexts(batch, model)
        s = dimension_softmax(contexts.logits(params), model) if probabilities is None else probabilities
        # A value whose probability underflows to 0 (T = 0.01, 8 logits below the leader) gives its
        # episodes weight 0, not the 1e-300 that log_q's floor leaves (module docstring: Feedback corrections).
        q = np.exp(log_q(s, model, batch, contexts.inverse))
        if not (s > 0).all():  # rows of a value of probability 0 get weight 0 (read once per row only then)
            q[s.ravel()[row_cells(model, batch, contexts.inverse, s.shape[1])].min(axis=1) <= 0] = 0.0
        ratio = q / batch.logged_probs
        w = np.minimum(ratio, cfg.importance_clip)
        regular = batch.regular
        wr = w * regular
        wsum = wr.sum()
        if wsum <= 0 and regular.all():
            return np.zeros_like(w), np.zeros_like(w), {"baseline": 0.0, "reward_std": 0.0}
        global_b = float((wr * batch.rewards).sum() / wsum) if wsum > 0 else 0.0
        b = np.full(len(batch), global_b)
        if batch.categories.shape[1] and wsum > 0:
            if (batch.numbers.shape[1] and np.any(batch.numbers)) or batch.offered is not None:
                _, inverse = np.unique(segment_keys(batch.categories), return_inverse=True)
            else:
                inverse = contexts.inverse  # the contexts are the segments
            sw = np.bincount(inverse, weights=wr)
            swr = np.bincount(inverse, weights=wr * batch.rewards)
            m = cfg.baseline_prior
            b = ((swr + m * global_b) / (sw + m))[inverse]
        adv, stats = advantages(cfg, batch.rewards, regular, wr, b, fallback_std)
        return w, adv, {"baseline": global_b, **stats, **weight_stats(cfg, ratio)}

    # -- direction

    def direction(self, params: Params, model: Model, tallies: Tallies, probabilities: Array | None = None) -> Params:
        """The evidence direction of the module docstring, each block centred per dimension
        (``probabilities``: each distinct context's s, which the action features' blocks need)."""
        cfg = self.config
        t = model.temperature
        n_v = tallies.regular.sum(axis=0)
        sums = tallies.advantage.sum(axis=0)
        theta = t * sums / np.sqrt(np.maximum(n_v + cfg.evidence_prior, 1.0))
        s = np.maximum(dimension_softmax(params.theta[None, :], model)[0], 1e-12)
        log_s = np.log(s)
        for sl in model.slices:
            theta[sl] -= cfg.entropy_coef * t * (log_s[sl] - (s[sl] * log_s[sl]).sum())
        mean_adv = sums / np.maximum(tallies.rows.sum(axis=0), 1)  # Ā_{d,v}
        residual = tallies.advantage - tallies.rows * mean_adv  # per context: Σ R_i over its rows with a_d = v
        prior = cfg.evidence_prior + cfg.segment_prior
        offsets = [
            t
            * tallies.by_segment(residual, f, o.shape[0])
            / np.sqrt(tallies.by_segment(tallies.regular, f, o.shape[0]) + prior)
            for f, o in enumerate(params.offsets)
        ]
        weights = np.zeros_like(params.weights)
        for j in range(params.weights.shape[0]):
            x = tallies.numbers[:, j : j + 1]
            weights[j] = t * (residual * x).sum(axis=0) / np.sqrt((tallies.regular * x**2).sum(axis=0) + prior)
        action, action_offsets = np.zeros_like(params.action), [np.zeros_like(u) for u in params.action_offsets]
        if model.actions is not None and params.action.size and probabilities is not None:
            # Per feature value p, the score statistic Σ_i A_i c_ip / √(Σ_i c_ip² + c) with the feature
            # centred by the policy among what row i was offered, c_ip = φ_p(a_i) − Σ_b s(b | x_i) φ_p(b)
            # (∇_w log s(a_i | x_i) = c_i / T): over every row for w, over a segment's rows for its u.
            phi = model.actions.phi
            mean_phi = probabilities @ phi  # (U, P)
            score = tallies.advantage @ phi - tallies.advantage.sum(axis=1, keepdims=True) * mean_phi
            chosen = tallies.rows @ phi
            info = chosen - 2 * chosen * mean_phi + tallies.rows.sum(axis=1, keepdims=True) * mean_phi**2
            action = t * score.sum(axis=0) / np.sqrt(info.sum(axis=0) + cfg.evidence_prior)
            action_offsets = [
                t * tallies.by_segment(score, f, u.shape[0])
                / np.sqrt(tallies.by_segment(info, f, u.shape[0]) + prior)
                for f, u in enumerate(params.action_offsets)
            ]
        return centre(Params(theta, offsets, weights, action, action_offsets), model)

    # -- update

    def step(
        self, params: Params, model: Model, batch: ContextBatch, state: Mapping[str, Any] | None = None
    ) -> tuple[Params, dict[str, float], dict[str, Any]]:
        """One training step; returns the new parameters, metrics and learner state."""
        cfg = self.config
        v = len(params.theta)
        contexts = Contexts(batch, model)
        s_old = dimension_softmax(contexts.logits(params), model)
        g_old = dimension_softmax(params.theta[None, :], model)[0]
        metrics: dict[str, float] = {
            "episodes": float(batch.regular.sum()),
            "corrections": float(len(batch) - batch.regular.sum()),
            "softmax_entropy_before": sum(entropy(g_old[sl]) for sl in model.slices),
        }
        evidence, problem = Evidence.from_state(state, v)
        if problem:
            metrics["state_reset"] = 1.0
        segments_state = _segment_state(state if not problem else None, model, v)
        if len(batch) == 0:
            metrics.update(
                softmax_entropy_after=metrics["softmax_entropy_before"], kl=0.0, step_scale=0.0, grad_norm=0.0
            )
            return params.copy(), metrics, dict(state or {}) if not problem else {}
        w, adv, stats = self.weights_and_advantages(params, model, batch, evidence.pooled_std(), contexts, s_old)
        g = gradient(params, model, batch, w, adv, cfg.entropy_coef, contexts, s_old)
        tallies = Tallies(contexts, model, batch, adv)
        direction = g if cfg.direction == "plain" else self.direction(params, model, tallies, s_old)
        size = len(batch) / cfg.reference_batch if cfg.reference_batch else 1.0
        scale = cfg.learning_rate * (np.sqrt(size) if cfg.direction == "evidence" else size)
        max_kl = cfg.max_kl * size if cfg.max_kl is not None else None
        weights_u = np.bincount(contexts.inverse, weights=batch.regular.astype(float), minlength=len(contexts.counts))
        if weights_u.sum() <= 0:
            weights_u = contexts.counts
        new, kl = self._step(params, direction, scale, model, contexts, s_old, weights_u)
        if max_kl is not None:
            for _ in range(20):
                if kl <= max_kl:
                    break
                scale /= 2
                new, kl = self._step(params, direction, scale, model, contexts, s_old, weights_u)
        new_state: dict[str, Any] = {}
        if cfg.gap_per_evidence is not None:
            recent, corrections, recent_problem = recent_from_state(
                (state or {}).get(RECENT) if not problem else None, v
            )
            if recent_problem:
                metrics["recent_reset"] = 1.0
            evidence, recent_out, z, segments_state, corrections = _add_evidence(
                cfg, evidence, recent, corrections, segments_state, tallies, model, int(batch.regular.sum())
            )
            raised, lowered = self.bound_by_evidence(new, model, evidence, segments_state)
            metrics["raised_by_evidence"] = float(raised)
            metrics["lowered_by_evidence"] = float(lowered)
            kl = _mean_kl(s_old, dimension_softmax(contexts.logits(new), model), model, weights_u)
            new_state = {**evidence.to_state(), **_segment_state_out(segments_state, model)}
            if recent_out is not None:
                metrics["change_z"] = z
                new_state[RECENT] = recent_to_state(recent_out, corrections)
        g_new = dimension_softmax(new.theta[None, :], model)[0]
        regular = batch.regular
        metrics.update(
            stats,
            mean_reward=float(batch.rewards[regular].mean()) if regular.any() else 0.0,
            episode_reward_std=float(batch.rewards[regular].std()) if regular.any() else 0.0,
            softmax_entropy_after=sum(entropy(g_new[sl]) for sl in model.slices),
            kl=kl,
            step_scale=float(scale),
            grad_norm=float(np.linalg.norm(g.flat())),
        )
        return new, metrics, new_state

    def _step(
        self,
        params: Params,
        direction: Params,
        scale: float,
        model: Model,
        contexts: Contexts,
        s_old: Array,
        weights_u: Array,
    ) -> tuple[Params, float]:
        cfg = self.config
        new = params.add(direction, scale)
        if cfg.max_logit_gap is not None:
            for sl in model.slices:
                block = new.theta[sl]
                np.maximum(block, block.max() - cfg.max_logit_gap, out=block)
            for part in feature_parts(model):  # likewise each action feature's values, alone and per segment
                block = new.action[part]
                np.maximum(block, block.max() - cfg.max_logit_gap, out=block)
                for u in new.action_offsets:
                    combined = block + u[:, part]
                    lowest = combined.max(axis=1, keepdims=True) - cfg.max_logit_gap
                    u[:, part] += np.maximum(combined, lowest) - combined
        new = centre(new, model)
        _clip(new, cfg.logit_bound)
        return new, _mean_kl(s_old, dimension_softmax(contexts.logits(new), model), model, weights_u)

    def bound_by_evidence(
        self, params: Params, model: Model, evidence: Evidence, segments: list[list[tuple[Array, Array]]]
    ) -> tuple[int, int]:
        """Lower logits (in place) to the odds cap where it applies, then raise them to at least the
        leader's minus the evidence gap, per dimension for θ and per dimension and segment for
        θ + δ (module docstring); returns how many were raised and how many lowered."""
        cfg = self.config
        raised = lowered = 0
        # The odds cap reads the evidence's means as each value's mean reward. With context
        # features θ is no context's logits (its pooled evidence mixes contexts that prefer
        # different values): only the floor bounds it. A segment's evidence with several
        # dimensions mixes the other dimensions' choices in that segment, a few episodes a batch
        # that move as the policy learns: only the floor bounds those cells too. Without context,
        # a value's mean mixes the other dimensions' choices across the whole batch, as
        # per-dimension Thompson sampling's posteriors do; the cap applies there.
        single = len(model.slices) == 1
        contextual = bool(params.offsets or params.weights.size)
        # The bounds hold an action's own logits (θ, θ + δ) to its own evidence; the action features'
        # terms, learned from the evidence pooled over every action with a value, are not bounded by
        # one action's (module docstring: Action features).
        variances = []  # per dimension: its pooled reward variance, the spread of a cell's evidence
        # With several dimensions each one's Thompson floor is dimension_thompson_floor's (LearnerConfig).
        # A declared pair's is thompson_floor's: its pairs of values are configurations of their own.
        per_dimension = cfg if single else replace(cfg, thompson_floor=cfg.dimension_thompson_floor)
        for sl, name in zip(model.slices, model.layout.names, strict=True):
            sub = Evidence(evidence.count[sl], evidence.reward_sum[sl], evidence.reward_sq_sum[sl])
            params.theta[sl], count_raised, count_lowered = bound_logits(
                cfg if is_pair(name) else per_dimension, params.theta[sl], sub, cap=not contextual,
                temperature=model.temperature,
            )
            raised += count_raised
            lowered += count_lowered
            pooled = sub.pooled()
            variances.append(None if pooled is None else pooled[1])
        cells = [(offsets[k], segments[f][k], 1.0, cfg.segment_gap_slack)
                 for f, offsets in enumerate(params.offsets) for k in range(offsets.shape[0])]
        cells += [(params.weights[j], segments[len(params.offsets) + j][k], sign * NUMBER_PROBE, None)
                  for j in range(params.weights.shape[0]) for k, sign in enumerate((-1.0, 1.0))]
        # A segment's θ + δ, or a numeric half's θ ± β at one scale from the centre, bounded by the
        # cell's own evidence (with the dimension's pooled variance), moving δ or β only.
        for row, (count, total), scale, slack in cells:
            for sl, var in zip(model.slices, variances, strict=True):
                if var is None or count[sl].sum() <= 0:
                    continue
                mean = total[sl] / np.maximum(count[sl], 1e-12)
                cell = Evidence(count[sl], total[sl], count[sl] * (var + mean**2))
                logits = params.theta[sl] + scale * row[sl]
                bounded, count_raised, count_lowered = bound_logits(
                    cfg, logits, cell, slack, normalise=False, cap=single, temperature=model.temperature
                )
                raised += count_raised
                lowered += count_lowered
                row[sl] += (bounded - logits) / scale
        centred = centre(params, model)
        params.theta, params.offsets, params.weights = centred.theta, centred.offsets, centred.weights
        _clip(params, cfg.logit_bound)
        return raised, lowered


def feature_parts(model: Model) -> list[slice]:
    """Where each action feature's values sit in ``Params.action`` (none without action features)."""
    if model.actions is None:
        return []
    ends = list(accumulate(len(v) for v in model.actions.values))
    return [slice(end - len(v), end) for end, v in zip(ends, model.actions.values, strict=True)]


def centre(params: Params, model: Model) -> Params:
    """Every block with mean zero within each dimension, and each action feature's weights (and
    each segment's interactions) with mean zero over the feature's values."""
    out = params.copy()
    for sl in model.slices:
        out.theta[sl] -= out.theta[sl].mean()
        for o in out.offsets:
            if o.size:
                o[:, sl] -= o[:, sl].mean(axis=1, keepdims=True)
        if out.weights.size:
            out.weights[:, sl] -= out.weights[:, sl].mean(axis=1, keepdims=True)
    for part in feature_parts(model):  # and each action feature's weights over its values
        out.action[part] -= out.action[part].mean()
        for u in out.action_offsets:
            u[:, part] -= u[:, part].mean(axis=1, keepdims=True)
    return out


def _clip(params: Params, bound: float) -> None:
    np.clip(params.theta, -bound, bound, out=params.theta)
    for o in params.offsets:
        np.clip(o, -bound, bound, out=o)
    np.clip(params.weights, -bound, bound, out=params.weights)
    np.clip(params.action, -bound, bound, out=params.action)
    for u in params.action_offsets:
        np.clip(u, -bound, bound, out=u)


def _mean_kl(old: Array, new: Array, model: Model, weights: Array) -> float:
    """Weighted mean over contexts of Σ_d KL(old_d ‖ new_d), never below 0 (as ``kl_divergence``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(old > 0, old * (np.log(np.maximum(old, 1e-300)) - np.log(np.maximum(new, 1e-300))), 0.0)
    per_context = terms.sum(axis=1)
    return max(0.0, float((per_context * weights).sum() / weights.sum()))


HALVES = ("below", "above")
"""The evidence cells of a numeric feature: episodes below and above its centre."""


def _groups(model: Model) -> list[tuple[str, str, list[str]]]:
    """The evidence groups: (state key, feature, cell names), categorical features then numeric."""
    return [("segments", name, names) for name, names in zip(model.categorical, model.segments, strict=True)] + [
        ("halves", name, list(HALVES)) for name in model.numeric
    ]


def _segment_state(state: Mapping[str, Any] | None, model: Model, v: int) -> list[list[tuple[Array, Array]]]:
    """Per evidence group (:func:`_groups`) and cell: the discounted count and reward sum per value
    (none for a cell whose stored sums are unreadable, non-finite or have a negative count)."""
    out = []
    for key, name, names in _groups(model):
        feature = ((state or {}).get(key) or {}).get(name) or {}
        rows = []
        for seg in names:
            pair = feature.get(seg)
            try:
                count = np.asarray(pair[0], dtype=np.float64)
                total = np.asarray(pair[1], dtype=np.float64)
                if (
                    count.shape != (v,)
                    or total.shape != (v,)
                    or not (np.isfinite(count).all() and np.isfinite(total).all())
                    or (count < 0).any()  # discounted episodes, as Evidence.from_state requires
                ):
                    raise ValueError
            except (TypeError, ValueError, IndexError):
                count, total = np.zeros(v), np.zeros(v)
            rows.append((count, total))
        out.append(rows)
    return out


def _segment_state_out(segments: list[list[tuple[Array, Array]]], model: Model) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (key, name, names), rows in zip(_groups(model), segments, strict=True):
        out.setdefault(key, {})[name] = {
            cell: [[round(float(x), 4) for x in count], [round(float(x), 4) for x in total]]
            for cell, (count, total) in zip(names, rows, strict=True)
        }
    return out


def _add_evidence(
    cfg: LearnerConfig,
    evidence: Evidence,
    recent: Evidence,
    corrections: Array | None,
    segments: list[list[tuple[Array, Array]]],
    tallies: Tallies,
    model: Model,
    episodes: int,
) -> tuple[Evidence, Evidence | None, float, list[list[tuple[Array, Array]]], Array | None]:
    """Fade the state's evidence and add the batch's, globally and per cell (corrections shift
    reward sums only, as in the flat learner). The global evidence, and a numeric feature's
    halves (which together see every episode that carries it), fade by 2^(−N/H) for the batch's
    N episodes; a segment's by 2^(−n_c/H) for its own n_c, so that a segment with an eighth of
    the traffic keeps its evidence as long, in its own episodes, as the whole policy does. When
    the change test on the global evidence fires, the global state becomes the recent evidence
    and every cell is scaled by the share of the episodes it kept. ``corrections`` is the change
    test's C_a (:func:`~agent_learning.learning.reinforce.remember`), returned updated."""
    half_life = cfg.evidence_half_life
    batch = Evidence(tallies.regular.sum(axis=0), tallies.reward.sum(axis=0), tallies.reward_sq.sum(axis=0))
    new, recent_out, z, kept, corrections = remember(
        cfg, evidence, recent, batch, episodes, tallies.corrected, corrections
    )
    first = model.slices[0]  # one column per value of the first dimension: a cell's episodes sum over it
    out = []
    for f, rows in enumerate(segments):
        counts = tallies.by_segment(tallies.regular, f, len(rows))
        totals = tallies.by_segment(tallies.reward, f, len(rows))
        if f < len(model.categorical) and half_life:
            fades = 0.5 ** (counts[:, first].sum(axis=1) / half_life)
        else:
            fades = np.full(len(rows), fade(episodes, half_life))
        out.append(
            [(kept * (fades[k] * c + counts[k]), kept * (fades[k] * r + totals[k])) for k, (c, r) in enumerate(rows)]
        )
    return new, recent_out, z, out, corrections


def learn_structured(config: LearnerConfig, doc: PolicyDocument, rows: Rows) -> Update:
    """One update of a policy document on scored rows: :meth:`Reinforce.learn`."""
    return Reinforce(config).learn(doc, rows)


def flat_inputs(theta: Array, batch: Batch, temperature: float = 1.0) -> tuple[Model, Params, ContextBatch]:
    """The model, parameters and rows of a flat list of logits and its :class:`Batch`: one dimension
    without context, features or exclusions."""
    k, n = len(theta), len(batch)
    layout = Layout.build([Action.model_construct(id=str(i), config={}) for i in range(k)], None)
    model = Model(layout, np.empty((0, 1), dtype=np.int64), [], [], [], [], [], [], temperature)
    params = Params(theta.copy(), [], np.empty((0, k)))
    rows = ContextBatch(batch.actions[:, None], batch.rewards, batch.logged_probs, ~batch.regular,
                        np.empty((n, 0), dtype=np.int64), np.empty((n, 0)))
    return model, params, rows


StructuredReinforce = Reinforce
"""The same class, under the name the structured policies' learner had."""
StructuredUpdate = Update
"""The same class, under the name the structured policies' update had."""


def _check(batch: ContextBatch, model: Model) -> None:
    _first_bad("rewards", ~np.isfinite(batch.rewards), batch.rewards, "must be finite")
    p = batch.logged_probs
    _first_bad("logged_probs", ~((p > 0) & (p <= 1)), p, "must be in (0, 1]")
    for d, k in enumerate(model.layout.sizes):
        a = batch.actions[:, d]
        _first_bad(f"actions[:, {d}]", (a < 0) | (a >= k), a, f"must be a value index in [0, {k})")
