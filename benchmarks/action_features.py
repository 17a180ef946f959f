"""Actions described by features, offered per request (Personalizer's rank), against Vowpal Wabbit.

    python benchmarks/action_features.py [--seeds 20] [--horizon 10000] [--json out.json]

The problem, drawn per seed: 50 actions, each with 3 categorical features (``colour`` of 5
values, ``shape`` of 4, ``size`` of 3), and 2 categorical context features (``mood`` of 3
values, ``time`` of 2). An action's mean reward in a context is ::

    0.45 + 0.12·c[colour] + 0.12·s[shape, mood] + 0.06·z[size, time] + 0.02·e[action]

with c, s, z, e standard normal, drawn per seed, clipped to [0.02, 0.98]: which colour pays is
global, which shape pays depends on the mood, which size on the time, and each action has a
small effect of its own that no feature explains. Halfway, 10 new actions (features drawn the
same way, three of them with the best colour) join; from then each request offers the 10 new
and 40 of the 50 others (at most 50 a request, as Personalizer allowed), before it all 50.
Rewards are Bernoulli, with common random numbers (episode t pays if u_t < the chosen mean).

Algorithms: ours with the action features (``action_features`` and the two context features,
learning every 50 episodes); ours without them (the same policy knowing the ids only: a new
action starts from nothing); Vowpal Wabbit's ``--cb_explore_adf`` with the same features (the
context in namespace ``c``, the action's id and features in ``a``, ``-q ca``), with
``--squarecb`` and with ``--epsilon 0.2``, learning after every episode ("online") and once per
batch of 50 ("per batch").

Reported: cumulative expected regret (the best offered mean minus the chosen one's), its ratio to
VW's best variant with a paired standard error, and the episodes after the new actions join
until the policy chooses the best action in half the requests whose best offered action is a new
one, over the last 250 episodes (checked every 50; "never" counted when not reached by the
horizon; the median is over the seeds).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent_learning.documents import Action, Candidate, PolicyDocument
from agent_learning.learning.reinforce import Reinforce, Rows
from agent_learning.policy.softmax import DEFAULT_EXPLORATION_FLOOR, SoftmaxPolicy

BATCH = 50
ACTIONS = 50
NEW = 10
OFFERED = 50
FEATURES = {"colour": 5, "shape": 4, "size": 3}
CONTEXT = {"mood": 3, "time": 2}
SHARE = 0.5
"""The new actions have "reached their share" when, over the last :data:`WINDOW` episodes, the
policy chose the best offered action in this fraction of the requests whose best is a new one."""
WINDOW = 250


@dataclass(frozen=True)
class Problem:
    """One seed's instance (module docstring)."""

    features: np.ndarray
    """(60, 3) each action's value of each feature; the last 10 are the new ones."""
    colour: np.ndarray
    shape: np.ndarray
    """(shape values, moods)."""
    size: np.ndarray
    """(size values, times)."""
    own: np.ndarray

    @classmethod
    def draw(cls, seed: int) -> Problem:
        rng = np.random.default_rng([seed, 42])
        features = np.stack([rng.integers(0, k, ACTIONS + NEW) for k in FEATURES.values()], axis=1)
        colour = rng.normal(size=FEATURES["colour"])
        features[ACTIONS : ACTIONS + 3, 0] = int(colour.argmax())  # three new actions have the best colour
        return cls(features, colour, rng.normal(size=(FEATURES["shape"], CONTEXT["mood"])),
                   rng.normal(size=(FEATURES["size"], CONTEXT["time"])), rng.normal(size=ACTIONS + NEW))

    def means(self, mood: int, hour: int) -> np.ndarray:
        f = self.features
        raw = (0.45 + 0.12 * self.colour[f[:, 0]] + 0.12 * self.shape[f[:, 1], mood]
               + 0.06 * self.size[f[:, 2], hour] + 0.02 * self.own)
        return np.clip(raw, 0.02, 0.98)

    def action(self, a: int) -> Action:
        values = {name: f"{name[0]}{self.features[a, k]}" for k, name in enumerate(FEATURES)}
        return Action(id=f"a{a}", features=values)


class Chooser:
    """An algorithm: choose among offered actions in a context; learn from a batch."""

    name = "?"
    per_episode = False

    def choose(self, context: dict[str, str], offered: list[int], rng: random.Random) -> tuple[int, float]:
        """The position among ``offered`` chosen, and its probability."""
        raise NotImplementedError

    def learn(self, rows: list[tuple[dict[str, str], list[int], int, float, float]]) -> None:
        """Learn from (context, offered, position chosen, probability, reward) rows."""
        raise NotImplementedError


class Ours(Chooser):
    """The softmax policy and REINFORCE learner; with or without the action features."""

    def __init__(self, problem: Problem, features: bool) -> None:
        self.problem, self.name = problem, f"REINFORCE (ours){'' if features else ', ids only'}"
        self.actions = [problem.action(a) if features else Action(id=f"a{a}") for a in range(ACTIONS + NEW)]
        self.policy = SoftmaxPolicy.from_actions(
            "bench", self.actions[:ACTIONS], context=dict.fromkeys(CONTEXT, "category"),
            action_features=list(FEATURES) if features else (), exploration_floor=DEFAULT_EXPLORATION_FLOOR)
        self.doc: PolicyDocument = self.policy.document
        self.learner = Reinforce()

    def choose(self, context: dict[str, str], offered: list[int], rng: random.Random) -> tuple[int, float]:
        d = self.policy.choose(rng, context=context, actions=[self.actions[a] for a in offered])
        return d.index, d.probability

    def learn(self, rows: list[tuple[dict[str, str], list[int], int, float, float]]) -> None:
        candidates = [[self.actions[a] for a in offered] for _, offered, _, _, _ in rows]
        update = self.learner.learn(self.doc, Rows(
            [(j,) for _, _, j, _, _ in rows], [r for *_, r in rows], [p for _, _, _, p, _ in rows],
            [False] * len(rows), [c for c, *_ in rows],
            [[Candidate.model_construct(id=a.id, features=a.features) for a in c] for c in candidates]))
        self.doc = update.applied_to(self.doc)
        self.policy = SoftmaxPolicy(self.doc)


class VowpalWabbit(Chooser):
    """Vowpal Wabbit's ``--cb_explore_adf`` with the context and the actions' features."""

    def __init__(self, problem: Problem, explore: str, per_episode: bool, seed: int) -> None:
        from vowpalwabbit import Workspace  # imported only where this reference runs

        self.problem, self.per_episode = problem, per_episode
        self.name = f"VW {explore} ({'online' if per_episode else 'per batch'})"
        self.vw = Workspace(f"--cb_explore_adf {explore} -q ca --quiet --random_seed {seed}")
        self.lines = {a: "|a id=a{} {}".format(a, " ".join(f"{n}={v}" for n, v in problem.action(a).features.items()))
                      for a in range(ACTIONS + NEW)}

    def _example(self, context: dict[str, str], offered: list[int], label: tuple[int, float, float] | None = None
                 ) -> list[str]:
        lines = ["shared |c " + " ".join(f"{k}={v}" for k, v in context.items())]
        for j, a in enumerate(offered):
            prefix = f"0:{-label[1]:.6f}:{label[2]:.6f} " if label is not None and label[0] == j else ""
            lines.append(prefix + self.lines[a])
        return lines

    def choose(self, context: dict[str, str], offered: list[int], rng: random.Random) -> tuple[int, float]:
        pmf = np.asarray(self.vw.predict(self._example(context, offered)), dtype=float)
        pmf = pmf / pmf.sum()
        j = int(np.searchsorted(np.cumsum(pmf), rng.random() * pmf.sum(), side="right"))
        j = min(j, len(offered) - 1)
        return j, float(pmf[j])

    def learn(self, rows: list[tuple[dict[str, str], list[int], int, float, float]]) -> None:
        for context, offered, j, p, r in rows:
            self.vw.learn(self._example(context, offered, (j, r, p)))


@dataclass
class Result:
    regret: list[float] = field(default_factory=list)
    reach: list[float] = field(default_factory=list)
    """Episodes after the new actions joined until they reached their share (inf: never)."""


def run(make: Callable[[Problem, int], Chooser], seed: int, horizon: int) -> tuple[str, float, float]:
    """The algorithm's name, its regret and the episodes until the new actions reached their share."""
    problem = Problem.draw(seed)
    algo = make(problem, seed)
    luck = np.random.default_rng([seed, 7])
    moods, hours, pays = (luck.integers(0, CONTEXT["mood"], horizon), luck.integers(0, CONTEXT["time"], horizon),
                          luck.random(horizon))
    offers = np.random.default_rng([seed, 8])
    rng = random.Random(seed)
    half = horizon // 2
    regret, reached = 0.0, np.inf
    rows: list[tuple[dict[str, str], list[int], int, float, float]] = []
    hits: list[tuple[int, int]] = []  # per batch after the new actions joined: (best new chosen, best is new)
    new_chosen = new_best = 0
    for t in range(horizon):
        if t < half:
            offered = list(range(ACTIONS))
        else:
            offered = sorted(offers.choice(ACTIONS, OFFERED - NEW, replace=False).tolist()) + list(
                range(ACTIONS, ACTIONS + NEW))
        context = {"mood": f"m{moods[t]}", "time": f"t{hours[t]}"}
        means = problem.means(int(moods[t]), int(hours[t]))[offered]
        j, p = algo.choose(context, offered, rng)
        reward = float(pays[t] < means[j])
        regret += float(means.max() - means[j])
        if t >= half and offered[int(means.argmax())] >= ACTIONS:
            new_best += 1
            new_chosen += j == int(means.argmax())
        row = (context, offered, j, p, reward)
        if algo.per_episode:
            algo.learn([row])
        else:
            rows.append(row)
        if (t + 1) % BATCH == 0:
            if rows:
                algo.learn(rows)
                rows = []
            if t >= half:
                hits.append((new_chosen, new_best))
                new_chosen = new_best = 0
                chosen, best = (sum(x) for x in zip(*hits[-(WINDOW // BATCH):], strict=True))
                if reached == np.inf and len(hits) >= WINDOW // BATCH and best and chosen >= SHARE * best:
                    reached = t + 1 - half
    return algo.name, regret, reached


def algorithms() -> list[Callable[[Problem, int], Chooser]]:
    out: list[Callable[[Problem, int], Chooser]] = [
        lambda problem, seed: Ours(problem, features=True),
        lambda problem, seed: Ours(problem, features=False),
    ]
    for explore in ("--squarecb", "--epsilon 0.2"):
        for online in (True, False):
            out.append(lambda problem, seed, e=explore, o=online: VowpalWabbit(problem, e, o, seed))
    return out


def table(seeds: int, horizon: int) -> tuple[list[str], dict[str, Any]]:
    results: dict[str, Result] = {}
    t0 = time.perf_counter()
    for make in algorithms():
        result = Result()
        name = "?"
        for seed in range(seeds):
            name, regret, reached = run(make, seed, horizon)
            result.regret.append(regret)
            result.reach.append(reached)
        results[name] = result
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    vw = {k: v for k, v in results.items() if k.startswith("VW")}
    best = min(vw, key=lambda k: np.mean(vw[k].regret))
    reference = np.array(results[best].regret)
    lines = [
        f"Actions described by features: 50 actions × 3 categorical features, 2 context features, 10 new "
        f"actions at {horizon // 2:,} of {horizon:,} episodes ({seeds} seeds; ratio and ± to {best})",
        "",
        "| algorithm | regret | ÷ VW's best | new actions reach their share, median episodes (never) |",
        "|---|---:|---:|---:|",
    ]
    out: dict[str, Any] = {}
    for name, result in results.items():
        r = np.array(result.regret)
        ratio = r.mean() / reference.mean()
        se = float(np.std(r / reference.mean() - reference / reference.mean() * ratio, ddof=1) / np.sqrt(len(r)))
        reach = np.array(result.reach)
        never = int(np.isinf(reach).sum())
        median = float(np.median(reach)) if never < len(reach) / 2 else np.inf
        shown = "never" if np.isinf(median) else f"{median:,.0f}"
        lines.append(f"| {name} | {r.mean():.1f} | {ratio:.2f}× ± {se:.2f} | {shown} ({never}) |")
        out[name] = {"regret": float(r.mean()), "ratio": float(ratio), "se": se, "reach_median": median,
                     "never": never}
    return lines, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--horizon", type=int, default=10_000)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args(argv)
    lines, figures = table(args.seeds, args.horizon)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
