"""``AGENT_LEARNING_JUDGING``: the rules, their validation, and the decisions they make (a hash of
the episode id for a fraction, a per-process window for ``N/min``)."""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pytest

from agent_learning.app.settings import load_settings
from agent_learning.core.errors import ConfigurationError
from agent_learning.judges.sampling import Judging, JudgingRules, JudgingSpec, RateWindow, id_fraction


def test_the_default_judges_every_episode_of_every_agent() -> None:
    settings = load_settings()
    assert settings.judging == "*=all"
    rules = JudgingRules.parse(settings.judging)
    judging = Judging(rules)
    assert all(judging.decide("any-agent", f"ep-{i}", 0.0).judge for i in range(200))
    assert JudgingRules.parse("").rule_for("x").spec.kind == "all"  # no entry: all


def test_the_setting_is_read_from_the_environment_in_canonical_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_LEARNING_JUDGING", " support-*=0.20 ,batch-bot=30/MIN,, tutor=1, *=all ")
    assert load_settings().judging == "support-*=0.2, batch-bot=30/min, tutor=all, *=all"


@pytest.mark.parametrize(
    ("value", "fraction"), [("0.00001", 1e-5), ("0.0000001", 1e-7), ("0.1234567", 0.1234567), ("0.9999999", 0.9999999)]
)
def test_a_fraction_keeps_every_digit_in_the_canonical_form(value: str, fraction: float) -> None:
    settings = load_settings(judging=f"bot={value}")  # 1e-05 was refused as not a spec; 0.9999999 became all
    assert settings.judging == f"bot={value}"
    assert JudgingRules.parse(settings.judging).rule_for("bot").spec == JudgingSpec("fraction", fraction=fraction)
    assert str(JudgingSpec("fraction", fraction=0.0)) == "0"


def test_the_first_matching_entry_applies_and_unmatched_agents_are_judged_in_full() -> None:
    rules = JudgingRules.parse("support-eu=all, support-*=0.25, batch-?=5/min")
    assert rules.rule_for("support-eu").spec == JudgingSpec("all")
    assert rules.rule_for("support-us").spec == JudgingSpec("fraction", fraction=0.25)
    assert rules.rule_for("batch-1").spec == JudgingSpec("rate", per_minute=5)
    assert rules.rule_for("batch-12").spec.kind == "all"  # ? is one character
    assert rules.rule_for("Support-us").spec.kind == "all"  # patterns are case-sensitive, like agent ids
    assert str(rules.rule_for("support-us")) == "support-*=0.25"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("support", "entry 'support': expected pattern=spec"),
        ("support bot=0.2", "'support bot' is not an agent id or pattern"),
        ("x=1.5", "entry 'x=1.5': '1.5' is more than 1"),
        ("x=2", "entry 'x=2': '2' is more than 1"),  # a whole number is not a spec of its own kind
        ("x=-0.1", "entry 'x=-0.1': '-0.1' is not a spec"),
        ("x=20%", "entry 'x=20%': '20%' is not a spec"),
        ("x=0/min", "entry 'x=0/min': '0/min': N must be from 1"),
        ("x=2.5/min", "entry 'x=2.5/min': '2.5/min' is not a spec"),
        ("x=10/h", "entry 'x=10/h': '10/h' is not a spec"),
        ("x=0.2, x=all", "entry 'x=all': the pattern 'x' is given twice"),
        ("*=all, support-*=0.2", "entry 'support-*=0.2' is never used"),
        ("support-*=0.2, support-eu=all", "entry 'support-eu=all' is never used: the entry 'support-*=...'"),
        ("bot-?=5/min, bot-1=all", "entry 'bot-1=all' is never used: the entry 'bot-?=...' before it matches 'bot-1'"),
        ("=0.2", "'' is not an agent id or pattern"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_setting_and_the_entry(
    monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("AGENT_LEARNING_JUDGING", value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "AGENT_LEARNING_JUDGING: " in str(info.value) and problem in str(info.value)


def test_a_fraction_is_decided_by_the_id_alone_the_same_every_time() -> None:
    judging = Judging(JudgingRules.parse("a=0.3"))
    ids = [uuid.uuid4().hex for _ in range(2_000)]
    first = [judging.decide("a", i, 0.0) for i in ids]
    again = [judging.decide("a", i, 1e9) for i in ids]  # later, as a redelivery would be
    assert [d.judge for d in first] == [d.judge for d in again]
    assert {d.reason for d in first if not d.judge} == {"sampled_out"}
    assert not any(d.check_recorded for d in first)  # deterministic: nothing to read first
    assert [d.judge for d in first] == [id_fraction(i) < 0.3 for i in ids]


def test_a_larger_fraction_judges_a_superset_and_zero_judges_none() -> None:
    ids = [f"ep-{i}" for i in range(3_000)]
    judged = {
        f: {i for i in ids if Judging(JudgingRules.parse(f"*={f}")).decide("a", i, 0).judge} for f in (0, 0.1, 0.5)
    }
    assert judged[0] == set() and judged[0.1] < judged[0.5]


def test_the_judged_share_is_the_fraction_for_every_action_and_context() -> None:
    """The hash of a random id is independent of what the episode did: among 40,000 episodes whose
    actions and contexts a skewed policy drew, each action's and each context's judged share is the
    fraction, within five standard errors."""
    rng = random.Random(11)
    judging = Judging(JudgingRules.parse("*=0.2"))
    seen: Counter[tuple[str, str]] = Counter()
    kept: Counter[tuple[str, str]] = Counter()
    for _ in range(40_000):
        context = rng.choice(["billing", "technical"])
        action = rng.choices(["a", "b", "c"], weights=[0.7, 0.2, 0.1] if context == "billing" else [0.1, 0.3, 0.6])[0]
        key = (context, action)
        seen[key] += 1
        kept[key] += judging.decide("agent", uuid.UUID(int=rng.getrandbits(128)).hex, 0.0).judge
    for key, n in seen.items():
        share, error = kept[key] / n, (0.2 * 0.8 / n) ** 0.5
        assert abs(share - 0.2) < 5 * error, (key, share, n)


def test_a_rate_admits_n_in_any_sixty_seconds_per_agent() -> None:
    judging = Judging(JudgingRules.parse("busy=3/min"))
    decisions = [judging.decide("busy", f"ep-{i}", t) for i, t in enumerate([0, 1, 2, 3, 30, 59.9])]
    assert [d.judge for d in decisions] == [True, True, True, False, False, False]
    assert {d.reason for d in decisions if not d.judge} == {"over_rate"}
    assert all(d.check_recorded for d in decisions if d.judge)  # the first answer must be looked up
    assert judging.decide("quiet", "ep-q", 2).judge  # another agent has its own window (here: all)
    assert judging.decide("busy", "ep-6", 60.0).judge  # the place taken at 0 is free again
    assert not judging.decide("busy", "ep-7", 60.5).judge
    assert judging.decide("busy", "ep-8", 61.0).judge


def test_a_place_given_back_is_free_again() -> None:
    window = RateWindow()
    assert window.acquire("a", 1, 10.0)
    assert not window.acquire("a", 1, 11.0)
    window.release("a", 10.0)
    assert window.acquire("a", 1, 12.0)
    window.release("b", 12.0)  # nothing of b's: no effect
    assert not window.acquire("a", 1, 13.0)


def test_the_fraction_of_the_largest_hash_stays_below_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """An id whose hash starts with 64 one-bits falls in [0, 1), as documented (the first 64 bits
    over 2⁶⁴ rounded to 1.0 for one id in 2⁵⁴)."""
    import agent_learning.judges.sampling as judging

    class Largest:
        def digest(self) -> bytes:
            return b"\xff" * 32

    monkeypatch.setattr(judging.hashlib, "sha256", lambda data: Largest())
    assert 0.999 < id_fraction("any") < 1.0
