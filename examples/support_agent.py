"""A help-desk agent that learns which configuration to use: prompt variant, retrieval depth, tools.

    python examples/support_agent.py                      # a simulated model: no key, no network
    OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.2 python examples/support_agent.py

Each episode: choose a configuration from the policy → search a small knowledge base for
``retrieval_k`` passages (a recorded tool call) → ask the model with the configuration's
prompt → record the run as an episode. Every ``--train-every`` episodes the embedded pipeline
judges the new episodes (the offline judge, unless ``AGENT_LEARNING_JUDGE`` chooses another) and
publishes the next policy version; the next choice already uses it. The configurations are in
``examples/actions.json``; the policy is created from it if the agent has none.

With ``OPENAI_BASE_URL`` set, the model is called through the ``openai`` package
(``pip install openai``; ``OPENAI_API_KEY`` if the server needs one, ``OPENAI_MODEL`` for the
model name). Without it, a simulated model answers from the passages it is given.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import PolicyClient
from agent_learning.app.embedded import open_local
from agent_learning.pipeline import create_policy, load_current
from agent_learning.policy import SoftmaxPolicy
from agent_learning.store.sqlite import SQLiteStore

HERE = Path(__file__).resolve().parent

KNOWLEDGE = [
    "To reset your password, open Settings, choose Security, then select Reset password.",
    "Invoices are under Billing: choose Invoices, pick the month, then select Download PDF.",
    "To change your email address, open Profile, edit the Email field, then confirm the link we send.",
    "Two-factor authentication is under Settings, Security: turn on Authenticator app and scan the code.",
    "To cancel your subscription, open Billing, choose Plan, then select Cancel plan at the bottom.",
    "Export your data from Settings, Privacy: select Export and we email you an archive within a day.",
]
QUESTIONS = [
    "How do I reset my password?",
    "Where can I download my invoices?",
    "How do I change my email address?",
    "How do I turn on two-factor authentication?",
    "How do I cancel my subscription?",
    "How can I export my data?",
]
PROMPTS = {
    "concise": "Answer in one or two sentences only, using the passages.",
    "step-by-step": "Explain step by step how to do it, using the passages.",
}
CONFIG_KEYS = ("prompt", "retrieval_k", "tools")
"""What every configuration in the actions file gives the agent (see ``examples/actions.json``)."""


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def search(query: str, k: int) -> list[str]:
    """The ``k`` passages sharing the most words with ``query``."""
    return sorted(KNOWLEDGE, key=lambda p: -len(words(query) & words(p)))[:k]


class SimulatedModel:
    """Answers from the passages it is given, as a model would, without a model."""

    name = "simulated model"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def answer(self, instructions: str, question: str, passages: list[str]) -> str:
        if not passages:  # no retrieval: a generic answer, sometimes a guess that happens to fit
            return "Please check the Settings page or contact support for help with that."
        best = passages[0] if self.rng.random() < 0.8 else passages[-1]
        if instructions.startswith("Explain"):
            steps = [s.strip() for s in re.split(r"[,:]| then ", best) if s.strip()]
            return " ".join(f"{i}. {s}." for i, s in enumerate(steps, 1))
        return best


class OpenAIModel:
    """Any OpenAI-compatible chat completions endpoint (``OPENAI_BASE_URL``)."""

    def __init__(self) -> None:
        try:
            from openai import OpenAI  # only when a real model is asked for
        except ImportError:
            sys.exit("error: OPENAI_BASE_URL is set but the openai package is not installed (pip install openai)")
        self.client = OpenAI(api_key=os.environ.get("OPENAI_API_KEY") or "not-needed")
        self.model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
        self.name = f"{self.model} at {os.environ['OPENAI_BASE_URL']}"

    def answer(self, instructions: str, question: str, passages: list[str]) -> str:
        context = "\n".join(f"- {p}" for p in passages) or "(no passages)"
        reply = self.client.chat.completions.create(
            model=self.model,
            messages=[
                {"role": "system", "content": instructions},
                {"role": "user", "content": f"Passages:\n{context}\n\nQuestion: {question}"},
            ],
            max_tokens=300,
        )
        return reply.choices[0].message.content or ""


def run_episode(store: Any, client: PolicyClient, model: Any, rng: random.Random) -> None:
    decision = client.choose()
    config = decision.config
    if not set(CONFIG_KEYS) <= set(config) or config["prompt"] not in PROMPTS:
        raise ValueError(
            f"action {decision.action_id!r}: its config must give {', '.join(CONFIG_KEYS)}, with prompt one of "
            f"{', '.join(PROMPTS)} (see examples/actions.json)"
        )
    question = rng.choice(QUESTIONS)
    instructions = PROMPTS[config["prompt"]]
    passages: list[str] = []
    with EpisodeCapture(store, decision, input=question, instructions=instructions) as run:
        if "search" in config["tools"]:
            with run.tool("search", arguments={"query": question, "k": config["retrieval_k"]}) as call:
                if rng.random() < 0.05:
                    call.fail("search timed out")  # recorded as a failed call; the agent answers without it
                else:
                    passages = search(question, config["retrieval_k"])
                    call.result = passages
        with run.tool("model", kind="llm") as call:
            answer = model.answer(instructions, question, passages)
            call.result = answer
        run.end(answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-id", default="example-agent", help="the agent's id (default: example-agent)")
    parser.add_argument("--episodes", type=int, default=300, help="episodes to run (default: 300)")
    parser.add_argument("--train-every", type=int, default=50, help="train after this many episodes (default: 50)")
    parser.add_argument(
        "--db",
        default=os.environ.get("AGENT_LEARNING_SQLITE_PATH") or ".agent-learning/local.db",
        help="the embedded store (default: AGENT_LEARNING_SQLITE_PATH, as for agent-learn, or %(default)s)",
    )
    parser.add_argument("--actions", default=str(HERE / "actions.json"), help="configurations, for a new policy")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    args = parser.parse_args()
    if args.episodes < 1 or args.train_every < 1:
        sys.exit("error: --episodes and --train-every must be at least 1")

    rng = random.Random(args.seed)
    model = OpenAIModel() if os.environ.get("OPENAI_BASE_URL") else SimulatedModel(rng)
    try:
        learn(args, model, rng)
    except (OSError, ValueError) as exc:  # a missing or invalid actions file, agent id, configuration or store
        sys.exit(f"error: {exc}")


def learn(args: argparse.Namespace, model: Any, rng: random.Random) -> None:
    """Run ``args.episodes`` episodes, training every ``args.train_every``."""
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    with open_local(path=args.db) as pipeline:
        store = pipeline.store
        if load_current(store, args.agent_id) is None:
            try:
                actions = json.loads(Path(args.actions).read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"--actions {args.actions}: not JSON: {exc}") from None
            create_policy(store, SoftmaxPolicy.from_actions(args.agent_id, actions).to_document(created_at=None))
            print(f"created the policy of {args.agent_id} from {args.actions}")
        client = PolicyClient(store, args.agent_id, rng=rng)
        print(f"{args.agent_id}: {args.episodes} episodes with the {model.name}, training every {args.train_every}")
        for i in range(1, args.episodes + 1):
            run_episode(store, client, model, rng)
            if i % args.train_every == 0 or i == args.episodes:
                version = pipeline.run_once().published.get(args.agent_id)
                policy = client.policy()
                shown = ", ".join(f"{a} {p:.2f}" for a, p in policy.probabilities.items())
                print(f"after {i} episodes: v{policy.version}{'' if version else ' (unchanged)'}: {shown}")
        embedded = isinstance(store, SQLiteStore)  # AGENT_LEARNING_STORE may name another: then --db is unused
    where = f" --db {args.db}" if embedded else ""
    print(f"store: {args.db if embedded else type(store).__name__}; next: agent-learn policy show "
          f"--agent-id {args.agent_id}{where}")


if __name__ == "__main__":
    main()
