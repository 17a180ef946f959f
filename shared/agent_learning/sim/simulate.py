"""Synthetic agents for the demo, the tests and the benchmarks.

A :class:`Scenario` is an agent with a task set and a few actions (configurations) whose
behaviour differs in ways the offline judge can see: how often the answer is right,
whether it explains, whether its tool fails, how long it takes, how verbose it is. Episodes
go through the real :class:`~agent_learning.agent.capture.EpisodeCapture`, so the pipeline sees
exactly what it would see from a real agent. :meth:`Scenario.expected_rewards` measures
the true value of every action with the real judge and reward function, so the best action
is known.

Three scenarios ship:

* ``math-tutor`` — prompt variants for arithmetic questions; the instructions ask for an
  explanation. ``step-by-step`` is best; ``calculator`` is accurate when its tool works but
  the tool fails a third of the time; ``direct`` ignores the instructions.
* ``support-bot`` — retrieval depth k for a help-desk bot; deeper retrieval finds the right
  article more often but is slower, and k=10 stuffs so much context into the answer that it
  often breaks the "answer concisely" instruction. ``k=5`` is best.
* ``triage-bot`` — a structured, contextual agent: its configuration has two dimensions
  (prompt × retrieval k) and each request has a task type (``billing`` or ``technical``) that
  it chooses by. The best prompt differs by task type (concise for billing, step-by-step for
  technical questions); deeper retrieval helps both (k=5 just ahead of k=3, k=1 misses).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import product
from typing import Any

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.core.clock import Clock, ManualClock
from agent_learning.documents import Action, Episode, PolicyDocument
from agent_learning.policy.softmax import Decision, SoftmaxPolicy, value_id
from agent_learning.store.base import Store
from agent_learning.store.memory import MemoryStore

CHARS_PER_TOKEN = 4
"""The simulated agents' token count: a token per four characters, as English text averages."""
ARTICLE_TOKENS = 250
"""Prompt tokens one retrieved help article adds."""
EXAMPLE_TOKENS = 120
"""Prompt tokens one worked example adds."""


@dataclass(frozen=True)
class Task:
    query: str
    answer: str
    """The right answer (a number or the key sentence of the right help article)."""
    wrong: str
    """A plausible wrong answer."""
    context: Mapping[str, Any] | None = None
    """The request's features a contextual agent chooses by (``{"task": "billing"}``)."""


@dataclass(frozen=True)
class Behaviour:
    """How one action behaves: probabilities and latencies of the simulated run."""

    action: Action
    p_correct: float
    explains: bool = True
    tool: str | None = None
    p_tool_error: float = 0.0
    p_correct_after_tool_error: float = 0.5
    latency_ms: float = 1_500.0
    p_verbose: float = 0.0
    context_tokens: int = 0
    """Prompt tokens the configuration adds (retrieved articles, worked examples)."""


@dataclass
class Scenario:
    """An agent, its instructions, its task generator and its actions' behaviours."""

    agent_id: str
    instructions: str
    behaviours: Sequence[Behaviour]
    make_task: Callable[[random.Random], Task]
    explain: Callable[[Task, str], str]
    verbose_padding: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    dimensions: Mapping[str, Sequence[Any]] | None = None
    """A structured agent's configuration: its policy is a
    :meth:`~agent_learning.policy.SoftmaxPolicy.create` and ``behave`` says how each
    configuration behaves in each context (``behaviours`` is then empty)."""
    context_features: Mapping[str, str] | None = None
    behave: Callable[[Mapping[str, Any], Mapping[str, Any] | None], Behaviour] | None = None
    make_typed_task: Callable[[random.Random, str], Task] | None = None
    """A task of a given type (the value of the first context feature), for :meth:`expected_by_segment`."""
    task_types: Sequence[str] = ()

    @property
    def actions(self) -> list[Action]:
        return [b.action for b in self.behaviours]

    def first_policy(self, *, temperature: float, exploration_floor: float, created_at: Any) -> PolicyDocument:
        """Version 1 of this agent's policy: uniform over its actions or configurations."""
        if self.dimensions is not None:
            return SoftmaxPolicy.create(
                self.agent_id,
                self.dimensions,
                context=self.context_features,
                temperature=temperature,
                exploration_floor=exploration_floor,
                created_at=created_at,
            ).document
        return SoftmaxPolicy.from_actions(
            self.agent_id, self.actions, temperature=temperature, exploration_floor=exploration_floor
        ).to_document(created_at=created_at)

    def behaviour(self, action_id: str) -> Behaviour:
        for b in self.behaviours:
            if b.action.id == action_id:
                return b
        raise KeyError(action_id)

    def behaviour_of(self, decision: Decision) -> Behaviour:
        """How the decision's action (or configuration, in its context) behaves."""
        if self.behave is not None:
            return self.behave(decision.config, decision.context)
        return self.behaviour(decision.action_id)

    def step(self, store: Store, policy: Any, rng: random.Random, clock: ManualClock) -> Episode:
        """One request: a task, the policy's choice for its context, the simulated run."""
        task = self.make_task(rng)
        decision = policy.choose(context=task.context) if task.context is not None else policy.choose()
        return self.run_episode(store, decision, rng, clock, task=task)

    def run_episode(
        self,
        store: Store,
        decision: Decision,
        rng: random.Random,
        clock: ManualClock,
        episode_id: str | None = None,
        task: Task | None = None,
    ) -> Episode:
        """Simulate one run of the chosen action and write it through ``EpisodeCapture``."""
        b = self.behaviour_of(decision)
        task = task or self.make_task(rng)
        cap = EpisodeCapture(
            store,
            decision,
            input=task.query,
            instructions=self.instructions,
            clock=clock,
            episode_id=episode_id or f"{self.agent_id}-{rng.getrandbits(64):016x}",
        )
        p_correct = b.p_correct
        if b.tool:
            tool_ms = max(1.0, rng.gauss(b.latency_ms * 0.4, b.latency_ms * 0.1))
            if rng.random() < b.p_tool_error:
                cap.step(
                    b.tool,
                    latency_ms=tool_ms,
                    status="error",
                    error="TimeoutError: the tool did not answer",
                    arguments={"query": task.query},
                )
                p_correct = b.p_correct_after_tool_error
            else:
                cap.step(b.tool, latency_ms=tool_ms, arguments={"query": task.query}, result=task.answer)
        answer = task.answer if rng.random() < p_correct else task.wrong
        output = self.explain(task, answer) if b.explains else answer
        if b.p_verbose and rng.random() < b.p_verbose:
            output = f"{output} {self.verbose_padding}"
        clock.advance(max(0.05, rng.gauss(b.latency_ms, b.latency_ms * 0.2)) / 1000.0)
        prompt = (len(self.instructions) + len(task.query)) // CHARS_PER_TOKEN + b.context_tokens
        cap.add_usage(prompt_tokens=prompt, completion_tokens=max(1, len(output) // CHARS_PER_TOKEN))
        return cap.end(output)

    def expected_rewards(self, judge: Any, reward: Any, n: int = 2_000, seed: int = 0) -> dict[str, float]:
        """The true mean reward of each action, by simulation with the given judge and reward. Every
        action's simulation starts from the same seed, so actions that draw alike meet the same tasks
        and luck (common random numbers); an action whose tool call draws more random numbers falls
        out of step after its first such episode, and its difference from the others is only as
        sharp as two independent means of ``n`` episodes."""
        clock = ManualClock()
        out = {}
        for b in self.behaviours:
            rng = random.Random(seed)
            policy = SoftmaxPolicy(self.agent_id, self.actions, [0.0] * len(self.actions))
            decision = policy.decision_for(b.action.id)
            store = MemoryStore()
            total = 0.0
            for i in range(n):
                ep = self.run_episode(store, decision, rng, clock, episode_id=f"x{i}")
                total += reward(judge.judge(ep).metrics, ep)[0]
            out[b.action.id] = total / n
        return out

    def expected_by_segment(self, judge: Any, reward: Any, n: int = 300, seed: int = 0) -> dict[str, dict[str, float]]:
        """A structured agent's true mean reward of every configuration, per task type
        (``{"task=billing": {"prompt=concise:retrieval_k=3": 0.91, ...}}``), by simulation; within a
        task type every configuration's simulation starts from the same seed, as in :meth:`expected_rewards`."""
        assert self.dimensions is not None and self.make_typed_task is not None and self.context_features
        feature = next(iter(self.context_features))
        policy = SoftmaxPolicy.create(self.agent_id, self.dimensions)
        clock = ManualClock()
        out: dict[str, dict[str, float]] = {}
        names = list(self.dimensions)
        for t, task_type in enumerate(self.task_types):
            means = out[f"{feature}={task_type}"] = {}
            for values in product(*self.dimensions.values()):
                rng = random.Random(seed * len(self.task_types) + t)
                config = dict(zip(names, values, strict=True))
                action_id = ":".join(f"{k}={value_id(v)}" for k, v in config.items())
                p = policy.probability(action_id)
                decision = Decision(self.agent_id, action_id, 0, p, math.log(p), 1, config, {feature: task_type})
                store = MemoryStore()
                total = 0.0
                for i in range(n):
                    task = self.make_typed_task(rng, task_type)
                    ep = self.run_episode(store, decision, rng, clock, episode_id=f"x{i}", task=task)
                    total += reward(judge.judge(ep).metrics, ep)[0]
                means[action_id] = total / n
        return out


# --------------------------------------------------------------------------- scenarios


def _arithmetic(rng: random.Random) -> Task:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    wrong = value + rng.choice([-10, -2, -1, 1, 2, 10])
    phrasing = rng.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Please work out {a} {op} {b}."])
    return Task(phrasing.format(a=a, op=op, b=b), str(value), str(wrong))


def _explain_arithmetic(task: Task, answer: str) -> str:
    return (
        f"Take the two numbers in '{task.query}' and combine them step by step; "
        f"that gives {answer}. The answer is {answer}."
    )


def math_tutor(agent_id: str = "math-tutor") -> Scenario:
    return Scenario(
        agent_id=agent_id,
        instructions="You are a patient math tutor. Explain your reasoning briefly, then give the answer.",
        behaviours=[
            Behaviour(
                Action(id="direct", description="Answer immediately", config={"prompt": "direct"}),
                p_correct=0.70,
                explains=False,
                latency_ms=800,
            ),
            Behaviour(
                Action(id="step-by-step", description="Reason step by step", config={"prompt": "cot"}),
                p_correct=0.90,
                latency_ms=2_500,
            ),
            Behaviour(
                Action(id="calculator", description="Use the calculator tool", config={"prompt": "tool"}),
                p_correct=0.99,
                tool="calculator",
                p_tool_error=0.35,
                latency_ms=3_000,
            ),
            Behaviour(
                Action(id="few-shot", description="Three worked examples", config={"prompt": "few-shot"}),
                context_tokens=3 * EXAMPLE_TOKENS,
                p_correct=0.75,
                latency_ms=2_000,
            ),
        ],
        make_task=_arithmetic,
        explain=_explain_arithmetic,
    )


_ARTICLES = [
    (
        "How do I reset my password?",
        "To reset your password, open Settings, choose Security and select Reset password.",
    ),
    (
        "How can I change my billing address?",
        "To change your billing address, open Billing, choose Address and save the change.",
    ),
    (
        "Where can I download my invoices?",
        "You can download invoices from the Billing page under Invoices and download.",
    ),
    (
        "How do I enable two-factor authentication?",
        "To enable two-factor authentication, open Security settings and turn on two-factor authentication.",
    ),
    (
        "How do I cancel my subscription?",
        "To cancel your subscription, open Billing, choose Subscription and select cancel.",
    ),
    (
        "Why was my payment declined?",
        "A payment is declined when the card expired or the bank blocked it; update the card.",
    ),
    ("How do I export my data?", "To export your data, open Settings, choose Privacy and select export data."),
    ("How do I invite a team member?", "To invite a team member, open Team, choose Invite and enter their email."),
]
_FALLBACK = "Thanks for reaching out. Our support team will look into this and get back to you shortly."


def _help_desk(rng: random.Random) -> Task:
    query, answer = rng.choice(_ARTICLES)
    return Task(query, answer, _FALLBACK)


def support_bot(agent_id: str = "support-bot") -> Scenario:
    padding = "Here is everything else I found in the knowledge base that might be related: " + " ".join(
        a for _, a in _ARTICLES[:4]
    )
    return Scenario(
        agent_id=agent_id,
        instructions="You are a help-desk assistant. Answer concisely from the knowledge base.",
        behaviours=[
            Behaviour(
                Action(id="k=1", description="Retrieve 1 article", config={"retrieval_k": 1}),
                context_tokens=1 * ARTICLE_TOKENS,
                p_correct=0.55,
                tool="search",
                latency_ms=1_200,
            ),
            Behaviour(
                Action(id="k=3", description="Retrieve 3 articles", config={"retrieval_k": 3}),
                context_tokens=3 * ARTICLE_TOKENS,
                p_correct=0.80,
                tool="search",
                latency_ms=1_800,
            ),
            Behaviour(
                Action(id="k=5", description="Retrieve 5 articles", config={"retrieval_k": 5}),
                context_tokens=5 * ARTICLE_TOKENS,
                p_correct=0.92,
                tool="search",
                latency_ms=2_500,
            ),
            Behaviour(
                Action(id="k=10", description="Retrieve 10 articles", config={"retrieval_k": 10}),
                context_tokens=10 * ARTICLE_TOKENS,
                p_correct=0.94,
                tool="search",
                latency_ms=6_000,
                p_verbose=0.5,
            ),
        ],
        make_task=_help_desk,
        explain=lambda task, answer: answer,
        verbose_padding=padding,
    )


_BILLING = [a for a in _ARTICLES if any(w in a[0].lower() for w in ("billing", "invoice", "subscription", "payment"))]
_TECHNICAL = [a for a in _ARTICLES if a not in _BILLING]
TRIAGE_PROMPTS = {
    # prompt → (correctness change on billing questions, on technical questions, explains, chance of padding)
    "concise": (0.10, -0.25, False, 0.0),
    "step-by-step": (-0.20, 0.10, True, 0.0),
    "empathetic": (-0.05, -0.05, True, 0.5),
}
TRIAGE_RETRIEVAL = {1: (0.60, 1_200.0), 3: (0.80, 1_800.0), 5: (0.84, 3_500.0)}
"""retrieval k → (chance of finding the right article, latency in ms)."""


def _typed_help_desk(rng: random.Random, task_type: str) -> Task:
    query, answer = rng.choice(_BILLING if task_type == "billing" else _TECHNICAL)
    return Task(query, answer, _FALLBACK, {"task": task_type})


def _triage_behaviour(config: Mapping[str, Any], context: Mapping[str, Any] | None) -> Behaviour:
    billing, technical, explains, padding = TRIAGE_PROMPTS[config["prompt"]]
    found, latency = TRIAGE_RETRIEVAL[config["retrieval_k"]]
    task_type = (context or {}).get("task")
    shift = billing if task_type == "billing" else technical
    return Behaviour(
        Action(id=f"prompt={config['prompt']}:retrieval_k={config['retrieval_k']}"),
        p_correct=min(0.98, max(0.05, found + shift)),
        explains=explains,
        tool="search",
        latency_ms=latency,
        p_verbose=padding,
        context_tokens=config["retrieval_k"] * ARTICLE_TOKENS,
    )


def triage_bot(agent_id: str = "triage-bot") -> Scenario:
    padding = "I completely understand how frustrating this must be, and I am here to help. " * 6
    return Scenario(
        agent_id=agent_id,
        instructions="You are a help-desk assistant. Answer concisely from the knowledge base.",
        behaviours=[],
        make_task=lambda rng: _typed_help_desk(rng, rng.choice(("billing", "technical"))),
        explain=lambda task, answer: f"First, find the right setting. Then follow these steps: {answer}",
        verbose_padding=padding,
        dimensions={"prompt": list(TRIAGE_PROMPTS), "retrieval_k": list(TRIAGE_RETRIEVAL)},
        context_features={"task": "category"},
        behave=_triage_behaviour,
        make_typed_task=_typed_help_desk,
        task_types=("billing", "technical"),
    )


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "math-tutor": math_tutor,
    "support-bot": support_bot,
    "triage-bot": triage_bot,
}


def simulate_round(
    scenario: Scenario, policy: SoftmaxPolicy, store: Store, n: int, rng: random.Random, clock: Clock
) -> list[Episode]:
    """``n`` episodes of ``scenario``, each choosing from ``policy``."""
    assert isinstance(clock, ManualClock)
    episodes = []
    for _ in range(n):
        episodes.append(scenario.step(store, policy, rng, clock))
    clock.advance(timedelta(seconds=1).total_seconds())
    return episodes
