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
* ``"natural"``: the natural gradient F⁺g, where F = (diag(s) − s sᵀ)/T² is the Fisher
  information of the softmax: F⁺g = T²·g / s, centred (Kakade 2001). Its component for
  action a is, up to the centring, T times the importance-sampled estimate of a's advantage,
  T·(1/N) Σ_{i: a_i = a} w_i A_i / s(a) (the entropy term aside), so each logit moves by its
  action's advantage rather than by advantage × probability and learning does not stall as the
  policy sharpens.
* ``"evidence"`` (default): the natural-gradient component with its advantage estimate
  replaced by the per-action sum scaled by the evidence behind it::

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
with the batch size N: the step by N/N_ref (``"plain"``, ``"natural"``) or √(N/N_ref)
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

Rewards must be finite; :class:`Batch` rejects anything else before it reaches the math.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]


@dataclass(frozen=True)
class LearnerConfig:
    """Settings of :class:`Reinforce`. Every default is explained in the module docstring;
    defaults were chosen on ``benchmarks/learning.py`` (docs/benchmarks.md: Learning benchmark)."""

    learning_rate: float = 1.2
    """η: scale of one step before the trust region shrinks it."""
    direction: Literal["evidence", "natural", "plain"] = "evidence"
    """``"evidence"`` (recommended), ``"natural"`` or ``"plain"`` gradient."""
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
    other policy), smaller so a value the policy dropped keeps more draws: its episodes were mostly
    drawn early, beside the other dimensions' worse values, and look worse than the value is. On
    ``benchmarks/learning.py``'s four factorized rows, 1.5 against 2.5 took the seeds that end with
    the best configuration below 0.5 from 6 / 47 / 15 / 39 to 3 / 44 / 9 / 33 of 200, at the same
    regret within noise (None: off)."""
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
            "direction": self.direction in ("evidence", "natural", "plain"),
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


def surrogate(
    logits: Array, batch: Batch, weights: Array, advantages: Array, entropy_coef: float, temperature: float = 1.0
) -> float:
    """``L(θ) = 1/N Σ w_i A_i log s_θ(a_i) + β H(s_θ)`` — its gradient is the update direction."""
    z = logits / temperature
    log_s = z - z.max() - np.log(np.exp(z - z.max()).sum())
    s = np.exp(log_s)
    return float((weights * advantages * log_s[batch.actions]).mean() - entropy_coef * (s * log_s).sum())


class Reinforce:
    """REINFORCE with baseline, clipped importance weights, entropy bonus and trust region."""

    name = "reinforce"

    def __init__(self, config: LearnerConfig | None = None) -> None:
        self.config = config or LearnerConfig()

    def weights_and_advantages(
        self, logits: Array, batch: Batch, temperature: float = 1.0, fallback_std: float = 1.0
    ) -> tuple[Array, Array, dict[str, float]]:
        """Clipped importance weights w, advantages A and the statistics behind them.

        ``fallback_std`` is σ when no episode of the batch carries weight (a batch of feedback
        corrections alone; module docstring: Feedback corrections)."""
        cfg = self.config
        s = softmax(logits, temperature)
        ratio = s[batch.actions] / batch.logged_probs
        w = np.minimum(ratio, cfg.importance_clip)
        regular = batch.regular
        wr = w * regular
        wsum = wr.sum()
        if wsum <= 0 and regular.all():  # every weight underflowed: nothing to learn from
            return np.zeros_like(w), np.zeros_like(w), {"baseline": 0.0, "reward_std": 0.0}
        baseline = float((wr * batch.rewards).sum() / wsum) if wsum > 0 else 0.0
        adv, stats = advantages(cfg, batch.rewards, regular, wr, baseline, fallback_std)
        return w, adv, {"baseline": baseline, **stats, **weight_stats(cfg, ratio)}

    def gradient(self, logits: Array, batch: Batch, temperature: float = 1.0) -> tuple[Array, dict[str, float]]:
        """The gradient ``g`` of the module docstring (ascent direction) and its statistics."""
        logits = np.asarray(logits, dtype=np.float64)
        check_inputs(logits, batch, temperature)
        w, adv, stats = self.weights_and_advantages(logits, batch, temperature)
        return self._gradient(logits, batch, w, adv, temperature), stats

    def _gradient(self, logits: Array, batch: Batch, w: Array, adv: Array, temperature: float) -> Array:
        s = softmax(logits, temperature)
        n = len(batch)
        k = len(logits)
        # Σ_i w_i A_i (e_{a_i} − s) / T, vectorised: a bincount for the e_a part.
        coef = w * adv
        score_term = (np.bincount(batch.actions, weights=coef, minlength=k) - coef.sum() * s) / (n * temperature)
        log_s = np.log(np.maximum(s, np.finfo(float).tiny))
        h = -(s * log_s).sum()
        entropy_term = -s * (log_s + h) / temperature
        return score_term + self.config.entropy_coef * entropy_term

    def update(
        self, logits: ArrayLike, batch: Batch, temperature: float = 1.0, state: Mapping[str, Any] | None = None
    ) -> Update:
        """One training step on ``batch`` from the learner ``state`` the previous update returned
        (None or {} for a new policy); returns the new logits, metrics and state."""
        cfg = self.config
        theta = np.asarray(logits, dtype=np.float64)
        check_inputs(theta, batch, temperature)
        s_old = softmax(theta, temperature)
        base_metrics = {
            "episodes": float(batch.regular.sum()),
            "corrections": float(len(batch) - batch.regular.sum()),
            "softmax_entropy_before": entropy(s_old),
        }
        evidence, state_problem = Evidence.from_state(state, len(theta))
        if state_problem:
            base_metrics["state_reset"] = 1.0
        if len(batch) == 0:
            return Update(
                theta.copy(),
                {
                    **base_metrics,
                    "softmax_entropy_after": base_metrics["softmax_entropy_before"],
                    "kl": 0.0,
                    "step_scale": 0.0,
                    "grad_norm": 0.0,
                },
                dict(state or {}) if not state_problem else {},
            )
        w, adv, stats = self.weights_and_advantages(theta, batch, temperature, evidence.pooled_std())
        g = self._gradient(theta, batch, w, adv, temperature)
        direction = self.direction(theta, batch, g, adv, temperature)
        size = len(batch) / cfg.reference_batch if cfg.reference_batch else 1.0
        scale = cfg.learning_rate * (np.sqrt(size) if cfg.direction == "evidence" else size)
        max_kl = cfg.max_kl * size if cfg.max_kl is not None else None
        new, kl = self._step(theta, direction, scale, temperature, s_old)
        if max_kl is not None:
            for _ in range(20):
                if kl <= max_kl:
                    break
                scale /= 2
                new, kl = self._step(theta, direction, scale, temperature, s_old)
        new_state: dict[str, Any] = {}
        if cfg.gap_per_evidence is not None:
            k = len(theta)
            recent, corrections, recent_problem = recent_from_state(
                (state or {}).get(RECENT) if not state_problem else None, k
            )
            if recent_problem:
                base_metrics["recent_reset"] = 1.0
            evidence, recent, z, _, corrections = remember(
                cfg,
                evidence,
                recent,
                Evidence.of_batch(batch, k),
                int(batch.regular.sum()),
                Evidence.corrected(batch, k),
                corrections,
            )
            new, raised, lowered = self.bound_by_evidence(new, evidence, temperature)
            kl = kl_divergence(s_old, softmax(new, temperature))
            base_metrics["raised_by_evidence"] = float(raised)
            base_metrics["lowered_by_evidence"] = float(lowered)
            new_state = evidence.to_state()
            if recent is not None:
                base_metrics["change_z"] = z
                new_state[RECENT] = recent_to_state(recent, corrections)
        s_new = softmax(new, temperature)
        metrics = {
            **base_metrics,
            **stats,
            "mean_reward": float(batch.rewards[batch.regular].mean()) if batch.regular.any() else 0.0,
            "episode_reward_std": float(batch.rewards[batch.regular].std()) if batch.regular.any() else 0.0,
            "softmax_entropy_after": entropy(s_new),
            "kl": kl,
            "step_scale": scale,
            "grad_norm": float(np.linalg.norm(g)),
        }
        return Update(new, metrics, new_state)

    def bound_by_evidence(
        self, logits: Array, evidence: Evidence, temperature: float = 1.0
    ) -> tuple[Array, int, int]:
        """Lower every logit to at most the odds cap, then raise it to at least θ_L − T·gap_a
        (module docstring: Evidence bound); returns the new centred logits and how many were
        raised and lowered."""
        cfg = self.config
        new, raised, lowered = bound_logits(cfg, logits, evidence, temperature=temperature)
        new -= new.mean()
        np.clip(new, -cfg.logit_bound, cfg.logit_bound, out=new)
        return new, raised, lowered

    def direction(self, logits: Array, batch: Batch, g: Array, adv: Array, temperature: float = 1.0) -> Array:
        """The update direction ``d`` of the module docstring (centred unless ``"plain"``), from
        the gradient ``g`` and the advantages ``adv`` of :meth:`weights_and_advantages`."""
        cfg = self.config
        if cfg.direction == "plain":
            return g.copy()
        s = np.maximum(softmax(logits, temperature), 1e-12)
        if cfg.direction == "natural":
            natural = temperature**2 * g / s  # F⁺g, entropy term included
            return natural - natural.mean()
        k = len(logits)
        n_a = np.bincount(batch.actions, weights=batch.regular, minlength=k)  # corrections are no evidence
        sums = np.bincount(batch.actions, weights=adv, minlength=k)
        # At least 1 under the root: an action with only feedback corrections (n_a = 0) moves by
        # their advantage sum, and c = 0 never divides by zero.
        evidence = temperature * sums / np.sqrt(np.maximum(n_a + cfg.evidence_prior, 1.0))
        # The entropy bonus's natural gradient: T²·β·∇H / s = −β·T·(log s + H).
        log_s = np.log(s)
        d = evidence - cfg.entropy_coef * temperature * (log_s - (s * log_s).sum())
        return d - d.mean()

    def _step(
        self, theta: Array, direction: Array, scale: float, temperature: float, s_old: Array
    ) -> tuple[Array, float]:
        new = theta + scale * direction
        if self.config.max_logit_gap is not None:
            np.maximum(new, new.max() - self.config.max_logit_gap, out=new)
        new -= new.mean()
        np.clip(new, -self.config.logit_bound, self.config.logit_bound, out=new)
        return new, kl_divergence(s_old, softmax(new, temperature))


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
