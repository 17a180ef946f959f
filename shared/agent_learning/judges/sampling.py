"""Which episodes are judged: per agent, every one, a fixed fraction, or up to N a minute.

Every judged episode costs three judge-model calls, and a judge deployment admits only so many
tokens a minute, so a busy agent can use up the quota of every agent. ``AGENT_LEARNING_JUDGING``
chooses per agent (:meth:`JudgingRules.parse`)::

    support-*=0.2, batch-bot=30/min, *=all

Comma-separated ``pattern=spec`` entries; a pattern is an agent id or an ``fnmatch`` pattern
(as in ``AGENT_LEARNING_EPISODE_WRITERS``), the first entry whose pattern matches an agent
applies to it, and an agent no entry matches is judged in full (an entry an earlier one makes
unreachable, such as ``support-eu`` after ``support-*``, is refused). ``spec`` is

* ``all`` — judge every episode (the default for every agent);
* a fraction ``f`` from 0 to 1 (``0.2``) — judge an episode if and only if
  :func:`id_fraction` of its id (a SHA-256 hash mapped to [0, 1)) is below ``f``; ``0`` judges
  none (every episode is recorded, to be judged later);
* ``N/min`` (a whole number N ≥ 1) — judge up to N episodes of the agent in any 60 seconds,
  counted by each scorer process on its own (:class:`RateWindow`); with k scorer instances
  the agent's episodes are judged at up to k·N a minute in all.

An episode that is not judged is recorded, never lost: the scorer writes an
:class:`~agent_learning.documents.UnjudgedRecord` in its score slot (``Store.mark_unjudged``),
which the trainer never reads, and ``agent-learn rescore --unjudged`` judges it later.

Why the learning stays unbiased. A fraction is decided by the episode id alone. Episode ids are
random (``EpisodeCapture``'s are UUID4s) or at least fixed without looking at the chosen
action, so whether an episode is judged is independent of its action, its context and its
outcome: the judged episodes are a uniform random subsample, each action still appears with the
probability the policy gave it, and the logged probability stays the right one for the learner
and for the off-policy estimators, with no correction. A redelivered message hashes to the same
answer (idempotent), and raising the fraction later judges a superset of what was judged before.

A rate is decided by when the message is scored and how many of the agent's episodes this
process judged in the last minute, never by anything in the episode, so it too needs no
correction. It is exact at a steady load; when the load changes within the time an episode
takes (a batch of episodes started at the same moment), the episodes that finish first take
the minute's places, so an action that makes episodes faster is over-represented in that
minute's judged episodes. Where that matters, use a fraction. Because a rate's answer depends
on the moment, the first answer is kept: an episode over the rate is recorded unjudged, and an
episode admitted by the rate is judged only if its slot holds no such record (one point read).
Store requests per episode, against judging every one: an episode left out writes its record
where its score would have been written (none more); an episode a rate admits costs that one
point read more. So a rule costs at most one extra request per episode, and ``all`` none.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from agent_learning.core.limits import AGENT_PATTERN

SETTING = "AGENT_LEARNING_JUDGING"
RATE_WINDOW_SECONDS = 60.0
"""The window ``N/min`` counts judged episodes in."""
MAX_PER_MINUTE = 100_000
"""The largest N of ``N/min`` (beyond it, use ``all``)."""

_FRACTION = re.compile(r"^(0|1|0?\.[0-9]+|[01]\.[0-9]*)$")
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]*)?$")
"""A plain number, to say "more than 1" of 2 or 30 (a fraction was meant, or N/min)."""
_RATE = re.compile(r"^([0-9]+)\s*/\s*min$", re.IGNORECASE)
_WILDCARD = re.compile(r"[*?\[]")
"""A pattern without one of these is a single agent id."""
SPEC_RULE = "all, a fraction from 0 to 1 (e.g. 0.2) or N/min with a whole N >= 1 (e.g. 30/min)"

Reason = Literal["sampled_out", "over_rate"]


@dataclass(frozen=True)
class JudgingSpec:
    """How many of an agent's episodes are judged: ``all``, a ``fraction`` or a ``rate``."""

    kind: Literal["all", "fraction", "rate"]
    fraction: float = 1.0
    """For ``fraction``: the share judged, 0 to 1."""
    per_minute: int = 0
    """For ``rate``: at most this many judged in any 60 s, per scorer process."""

    def __str__(self) -> str:
        if self.kind == "fraction":  # every digit, never an exponent: parse() reads it back as the same fraction
            return format(Decimal(repr(self.fraction)).normalize(), "f")
        if self.kind == "rate":
            return f"{self.per_minute}/min"
        return "all"

    @classmethod
    def parse(cls, text: str) -> JudgingSpec:
        """``all``, a fraction or ``N/min``; raises ValueError saying what is allowed."""
        value = text.strip()
        if value.lower() == "all":
            return cls("all")
        if _FRACTION.match(value) or _NUMBER.match(value):
            fraction = float(value)
            if fraction > 1:
                raise ValueError(f"{text!r} is more than 1: use {SPEC_RULE}")
            if _FRACTION.match(value):
                return cls("all") if fraction == 1 else cls("fraction", fraction=fraction)
        rate = _RATE.match(value)
        if rate:
            n = int(rate.group(1))
            if not 1 <= n <= MAX_PER_MINUTE:
                raise ValueError(f"{text!r}: N must be from 1 to {MAX_PER_MINUTE:,} (0: use the fraction 0)")
            return cls("rate", per_minute=n)
        raise ValueError(f"{text!r} is not a spec: use {SPEC_RULE}")


JUDGE_EVERY = JudgingSpec("all")


@dataclass(frozen=True)
class JudgingRule:
    """One ``pattern=spec`` entry."""

    pattern: str
    spec: JudgingSpec

    def __str__(self) -> str:
        return f"{self.pattern}={self.spec}"


@dataclass(frozen=True)
class JudgingRules:
    """The ``pattern=spec`` entries of ``AGENT_LEARNING_JUDGING``, first match wins."""

    rules: tuple[JudgingRule, ...] = ()

    @classmethod
    def parse(cls, text: str) -> JudgingRules:
        """The rules of a setting's value; raises ValueError naming the bad entry."""
        rules: list[JudgingRule] = []
        seen: list[str] = []
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            pattern, sep, spec = entry.partition("=")
            pattern = pattern.strip()
            if not sep:
                raise ValueError(f"entry {entry!r}: expected pattern=spec, e.g. support-*=0.2 (spec: {SPEC_RULE})")
            if not AGENT_PATTERN.match(pattern):
                raise ValueError(
                    f"entry {entry!r}: {pattern!r} is not an agent id or pattern (letters, digits, . _ - and the "
                    "wildcards * ? [ ] !, at most 128 characters)"
                )
            if pattern in seen:
                raise ValueError(f"entry {entry!r}: the pattern {pattern!r} is given twice")
            if "*" in seen:
                raise ValueError(f"entry {entry!r} is never used: the entry '*=...' before it matches every agent")
            if not _WILDCARD.search(pattern):  # one agent: an earlier pattern that matches it wins
                shadow = next((p for p in seen if fnmatch.fnmatchcase(pattern, p)), None)
                if shadow is not None:
                    raise ValueError(
                        f"entry {entry!r} is never used: the entry '{shadow}=...' before it matches {pattern!r}"
                    )
            seen.append(pattern)
            try:
                rules.append(JudgingRule(pattern, JudgingSpec.parse(spec)))
            except ValueError as exc:
                raise ValueError(f"entry {entry!r}: {exc}") from None
        return cls(tuple(rules))

    def rule_for(self, agent_id: str) -> JudgingRule:
        """The first rule whose pattern matches ``agent_id`` (``*=all`` when none does)."""
        for rule in self.rules:
            if fnmatch.fnmatchcase(agent_id, rule.pattern):
                return rule
        return JudgingRule("*", JUDGE_EVERY)

    def __str__(self) -> str:
        return ", ".join(str(r) for r in self.rules) or "*=all"


def normalise(text: str) -> str:
    """The setting's value in its canonical form (for :class:`~agent_learning.app.settings.Settings`)."""
    return str(JudgingRules.parse(text))


def id_fraction(episode_id: str) -> float:
    """A number in [0, 1) fixed by the episode id: the first 53 bits of its SHA-256, over 2⁵³ (the
    first 64 over 2⁶⁴ rounded to 1.0 for one id in 2⁵⁴: a float holds 53 bits)."""
    return (int.from_bytes(hashlib.sha256(episode_id.encode("utf-8")).digest()[:8], "big") >> 11) / 2.0**53


class RateWindow:
    """Per agent, the times of the judgings admitted in the last :data:`RATE_WINDOW_SECONDS`
    (at most N each). Thread-safe; one per scorer process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admitted: dict[str, deque[float]] = {}

    def acquire(self, agent_id: str, per_minute: int, now: float) -> bool:
        """Take one of the agent's N places of the last minute, if one is free."""
        with self._lock:
            times = self._admitted.setdefault(agent_id, deque())
            while times and times[0] <= now - RATE_WINDOW_SECONDS:
                times.popleft()
            if len(times) >= per_minute:
                return False
            times.append(now)
            return True

    def release(self, agent_id: str, now: float) -> None:
        """Give back a place taken at ``now`` that was not used (the episode needs no judging)."""
        with self._lock:
            times = self._admitted.get(agent_id)
            if times is not None and now in times:
                times.remove(now)


@dataclass(frozen=True)
class Decision:
    """Whether to judge one episode, and if not, why."""

    judge: bool
    rule: JudgingRule
    reason: Reason | None = None
    admitted_at: float | None = None
    """Set when a rate admitted the episode: the place to give back if it needs no judging."""

    @property
    def check_recorded(self) -> bool:
        """A rate admitted it: the slot must be read first, since an earlier delivery may have
        recorded it as over the rate (the first answer stands)."""
        return self.admitted_at is not None


@dataclass
class Judging:
    """The rules and, for ``N/min`` rules, this process's window (:meth:`decide`)."""

    rules: JudgingRules = field(default_factory=JudgingRules)
    window: RateWindow = field(default_factory=RateWindow)

    def decide(self, agent_id: str, episode_id: str, now: float) -> Decision:
        """Judge the episode, or record it unjudged (see the module docstring)."""
        rule = self.rules.rule_for(agent_id)
        spec = rule.spec
        if spec.kind == "fraction":
            judged = id_fraction(episode_id) < spec.fraction
            return Decision(judged, rule, None if judged else "sampled_out")
        if spec.kind == "rate":
            if self.window.acquire(agent_id, spec.per_minute, now):
                return Decision(True, rule, admitted_at=now)
            return Decision(False, rule, "over_rate")
        return Decision(True, rule)

    def release(self, agent_id: str, decision: Decision) -> None:
        """Give back the place a rate admitted the episode with (it needed no judging)."""
        if decision.admitted_at is not None:
            self.window.release(agent_id, decision.admitted_at)
