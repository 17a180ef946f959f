"""The publish guardrail on the trainer the embedded pipeline runs: false holds and regret of healthy
learning, and what it stops of a learner gone wrong and of a step ten times too large.

K=4 Bernoulli actions (means 0.5/0.55/0.6/0.7), episodes drawn from the current version (exploration floor
:data:`FLOOR`), one training run (:func:`agent_learning.pipeline.train_agent`, memory store) per batch of 100.
Per scenario and seed:

- healthy: 3,000 episodes of :class:`~agent_learning.learning.reinforce.Reinforce`; false holds are held runs whose
  candidate is not truly worse than the current version by more than the margin (true values: the
  means under each version's probabilities), and the share of those shrunk; regret is the expected
  reward lost against the best action, with the guardrail on and off.
- gone wrong: 1,000 episodes learned from 1 − reward; of the candidates truly worse than the current
  version by more than the margin, the share held or shrunk to within the margin of the current
  version's true value, and the seeds whose first one is.
- tenfold: 1,000 episodes, each step ten times the learner's; the same share.
- world changes: 1,500 healthy episodes, then the best action becomes the worst (:data:`CHANGED`); the
  episodes until the current version recovers (:data:`RECOVERED`; 3,000 if it does not) and the regret
  after the change, guardrail on against off.

The seeds are the same whichever library is imported, so a checkout's figures (PYTHONPATH at its
``shared``) compare with another's. Common random numbers: each episode takes two uniform draws, one
for its action and one for its reward, whatever the policy, so the runs of one seed with the guardrail
on and off see the same luck until their policies part. Ratios are Σ on / Σ off over the seeds, with
their standard error bootstrapped over the seeds.

    python benchmarks/guardrail.py [--seeds 200] [--jobs N] [--exploration-floor F] [--safe-confidence P]
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import functools
import itertools
import logging
import multiprocessing
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent_learning.documents import PolicyDocument
from agent_learning.evaluation import GuardrailConfig
from agent_learning.learning.reinforce import Reinforce
from agent_learning.pipeline import create_policy, load_current, train_agent
from agent_learning.policy.softmax import mix_floor, policy_probabilities, softmax
from agent_learning.store.memory import MemoryStore

AGENT = "bench"
MEANS = (0.5, 0.55, 0.6, 0.7)
ACTIONS = tuple(f"a{i}" for i in range(len(MEANS)))
BATCH = 100
GUARD = GuardrailConfig()


class Recording(Reinforce):
    """Reinforce that keeps the logits of its last candidate; ``invert`` learns from 1 − reward, ``scale``
    multiplies its step."""

    def __init__(self, invert: bool = False, scale: float = 1.0) -> None:
        super().__init__()
        self.invert, self.scale = invert, scale
        self.last: Any = None

    def step(self, params: Any, model: Any, batch: Any, state: Any = None) -> Any:
        if self.invert:
            batch = dataclasses.replace(batch, rewards=1.0 - batch.rewards)
        new, metrics, learned = super().step(params, model, batch, state)
        scaled = params.theta + self.scale * (new.theta - params.theta)
        bound = self.config.logit_bound  # as the learner keeps its own logits, so the document stays valid
        new.theta = np.clip(scaled, -bound, bound)
        self.last = new.theta
        return new, metrics, learned


FLOOR = 0.01
"""The policy's exploration floor (``--exploration-floor``): the least probability every action keeps (K × the
floor of the episodes are spread evenly), which is what the guardrail has to judge a step towards them on."""
CHANGED = (0.5, 0.55, 0.6, 0.4)
"""The world that changes: the best action (a3) becomes the worst."""
RECOVERED = 0.05
"""Recovered: the current version's expected reward within this of the best action's."""


def value(probs: Any, means: tuple[float, ...] = MEANS) -> float:
    return float(np.dot(probs, means))


def run(seed: int, episodes: int, learner: Recording, guardrail: GuardrailConfig | None,
        change_at: int | None = None) -> dict[str, Any]:
    """One agent over ``episodes`` (the means :data:`CHANGED` from episode ``change_at`` on): per run,
    (status, verdict, true value of current, candidate, published); the regret; the episodes after the
    change until it recovered (:data:`RECOVERED`; None if it did not)."""
    from support.factories import make_episode, make_policy_doc, make_score  # the tests' factories

    store, rng = MemoryStore(), random.Random(seed)
    create_policy(store, make_policy_doc(AGENT, kind="current", actions=ACTIONS, logits=[0.0] * len(MEANS),
                                         exploration_floor=FLOOR))
    rows, regret, changed_regret, recovered = [], 0.0, 0.0, None
    for start in range(0, episodes, BATCH):
        means = CHANGED if change_at is not None and start >= change_at else MEANS
        current = load_current(store, AGENT)
        assert current is not None
        probs = policy_probabilities(current)
        regret += BATCH * (max(means) - value(probs, means))
        changed_regret += BATCH * (max(means) - value(probs, means)) * (means is CHANGED)
        if means is CHANGED and recovered is None and value(probs, means) >= max(means) - RECOVERED:
            recovered = start - change_at
        cumulative = list(itertools.accumulate(probs))
        for i in range(start, start + BATCH):
            # Common random numbers: two draws per episode whatever the policy, so runs of one seed
            # (guardrail on and off) see the same luck while their policies agree.
            u, v = rng.random(), rng.random()
            k = min(bisect.bisect_right(cumulative, u), len(means) - 1)
            episode = make_episode(f"ep-{i}", agent_id=AGENT, action_id=ACTIONS[k], probability=probs[k],
                                   policy_version=current.version)
            store.add_episode(episode)
            store.put_score(make_score(episode=episode, reward=float(v < means[k])))
        outcome = train_agent(AGENT, store, learner, guardrail=guardrail)
        after: PolicyDocument | None = load_current(store, AGENT)
        assert after is not None and learner.last is not None
        candidate = value(mix_floor(list(softmax(learner.last)), current.exploration_floor), means)
        ev = outcome.run.evaluation if outcome.run is not None else None
        published = value(policy_probabilities(after), means)
        rows.append((outcome.status, ev.verdict if ev else "", value(probs, means), candidate, published))
    return {"rows": rows, "regret": regret, "regret_after_change": changed_regret, "recovered": recovered}


def caught(rows: list[tuple[Any, ...]]) -> tuple[int, int, bool]:
    """Truly worse candidates, those held or shrunk to within the margin, whether the first was."""
    worse = [r for r in rows if r[3] < r[2] - GUARD.margin]
    ok = [r for r in worse if r[0] == "held" or (r[1] == "shrunk" and r[4] >= r[2] - GUARD.margin)]
    return len(worse), len(ok), bool(worse) and (worse[0] in ok)


def one_seed(seed: int, healthy_episodes: int = 3_000, bad_episodes: int = 1_000, change_at: int = 1_500,
             after_change: int = 3_000) -> dict[str, Any]:
    """Every scenario on one seed: the figures :func:`main` sums over the seeds."""
    out: dict[str, Any] = {}
    on, off = (run(seed, healthy_episodes, Recording(), guard) for guard in (GUARD, None))
    fine = [r[3] >= r[2] - GUARD.margin for r in on["rows"]]
    out["healthy"] = {"regret_on": on["regret"], "regret_off": off["regret"], "runs": len(fine),
                      "false_holds": sum(r[0] == "held" and ok for r, ok in zip(on["rows"], fine, strict=True)),
                      "shrunk": sum(r[1] == "shrunk" and ok for r, ok in zip(on["rows"], fine, strict=True))}
    for name, learner in (("gone wrong", lambda: Recording(invert=True)), ("tenfold", lambda: Recording(scale=10))):
        out[name] = caught(run(seed, bad_episodes, learner(), GUARD)["rows"])
    for side, guard in (("on", GUARD), ("off", None)):
        found = run(seed, change_at + after_change, Recording(), guard, change_at)
        took = found["recovered"]
        out[f"recovery {side}"] = (after_change if took is None else took, took is None,
                                   found["regret_after_change"])
    return out


def ratio_and_error(on: Sequence[float], off: Sequence[float], draws: int = 2_000) -> tuple[float, float]:
    """Σ on / Σ off over the seeds and its standard error, bootstrapped over the seeds (paired)."""
    a, b = np.asarray(on, dtype=np.float64), np.asarray(off, dtype=np.float64)
    picks = np.random.default_rng(0).integers(0, len(a), (draws, len(a)))
    return float(a.sum() / b.sum()), float((a[picks].sum(axis=1) / b[picks].sum(axis=1)).std())


def main(seeds: int = 20, jobs: int = 1, **sizes: int) -> dict[str, Any]:
    """The benchmark's figures over ``seeds`` seeds, ``jobs`` processes at a time, with progress on stderr;
    ``sizes``: :func:`one_seed`'s episode counts."""
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        per_seed = []
        for done, found in enumerate(pool.imap(functools.partial(one_seed, **sizes), range(seeds)), 1):
            per_seed.append(found)
            print(f"\rseed {done}/{seeds}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    out: dict[str, Any] = {}
    healthy = [s["healthy"] for s in per_seed]
    runs = sum(h["runs"] for h in healthy)
    out["healthy"] = {"false_holds": sum(h["false_holds"] for h in healthy) / runs,
                      "shrunk": sum(h["shrunk"] for h in healthy) / runs,
                      "regret_ratio": ratio_and_error([h["regret_on"] for h in healthy],
                                                      [h["regret_off"] for h in healthy])}
    for name in ("gone wrong", "tenfold"):
        worse, ok, first = (sum(s[name][i] for s in per_seed) for i in range(3))
        any_worse = sum(s[name][0] > 0 for s in per_seed)
        out[name] = {"caught": ok / worse if worse else 1.0, "first_caught": first / any_worse if any_worse else 1.0}
    on, off = ([s[f"recovery {side}"] for s in per_seed] for side in ("on", "off"))
    out["world changes"] = {
        "on": float(np.mean([r[0] for r in on])), "off": float(np.mean([r[0] for r in off])),
        "ratio": ratio_and_error([r[0] for r in on], [r[0] for r in off]),
        "missed": {"on": sum(r[1] for r in on), "off": sum(r[1] for r in off)},
        "regret_ratio": ratio_and_error([r[2] for r in on], [r[2] for r in off]),
    }
    return out


if __name__ == "__main__":
    logging.getLogger("agent_learning").setLevel(logging.ERROR)  # the trainer's hold warnings, hundreds a run
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: one per core)")
    parser.add_argument("--exploration-floor", type=float, default=FLOOR, help=f"the policy's (default {FLOOR})")
    parser.add_argument("--safe-confidence", type=float, help="GuardrailConfig.safe_confidence (0: None)")
    args = parser.parse_args()
    FLOOR = args.exploration_floor
    if args.safe_confidence is not None:
        GUARD = dataclasses.replace(GUARD, safe_confidence=args.safe_confidence or None)
    found = main(args.seeds, args.jobs)
    h, w = found["healthy"], found["world changes"]
    print("| scenario | measure | value |\n|---|---|---|")
    print(f"| healthy | false holds | {h['false_holds']:.1%} |")
    print(f"| healthy | sound candidates shrunk | {h['shrunk']:.1%} |")
    print(f"| healthy | regret on / off | {h['regret_ratio'][0]:.3f} ± {h['regret_ratio'][1]:.3f} |")
    for name in ("gone wrong", "tenfold"):
        print(f"| {name} | truly worse held or shrunk | {found[name]['caught']:.0%} |")
        print(f"| {name} | first one caught (seeds) | {found[name]['first_caught']:.0%} |")
    print(f"| world changes | episodes to recover, on / off | {w['on']:.0f} / {w['off']:.0f} = "
          f"{w['ratio'][0]:.2f} ± {w['ratio'][1]:.2f} |")
    print(f"| world changes | seeds not recovered, on / off | {w['missed']['on']} / {w['missed']['off']} |")
    print(f"| world changes | regret after the change, on / off | {w['regret_ratio'][0]:.3f} ± "
          f"{w['regret_ratio'][1]:.3f} |")
