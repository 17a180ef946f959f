"""An agent's Personalizer service configuration (``GET/PUT …/configurations/service``): its fields,
their defaults as a new Personalizer resource had them, their checks and what each does here.

=========================  ===========  ==================================================
field                      default      here
=========================  ===========  ==================================================
``rewardWaitTime``         ``PT10M``    rewards count within it (5 s to 2 days); later
                                        ones are ignored
``defaultReward``          ``0``        the reward of an activated event whose wait passed
                                        without one (0 to 1: an episode's own reward),
                                        written by the timer's sweep
``rewardAggregation``      ``earliest`` ``earliest``: the first reward is the episode's, at
                                        once; ``average``: the mean of those received
                                        within the wait, when it is over
``explorationPercentage``  ``0.2``      served ε: (1 − ε)·π + ε uniform over the request's
                                        actions, logged as the event's probability
``logRetentionDays``       ``90``       the episode's time to live (``-1``: never deleted)
``learningMode``           ``Online``   ``Apprentice`` and ``LoggingOnly`` serve the baseline
                                        (the first action not excluded; a slot's baseline)
``modelExportFrequency``   ``PT5M``     stored and shown; training follows
                                        ``AGENT_LEARNING_TRAIN_SCHEDULE`` for every agent
``modelRetrainDays``       ``0``        stored and shown
=========================  ===========  ==================================================

Only plain Python here: the route table imports it, and the Functions app's start-up stays short.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any

LEARNING_MODES = ("Online", "Apprentice", "LoggingOnly")
AGGREGATIONS = ("earliest", "average")
"""The reward aggregations, as Personalizer's: the first reward, or the mean of those within the wait."""
MIN_REWARD_WAIT = timedelta(seconds=5)
MAX_REWARD_WAIT = timedelta(days=2)
"""Personalizer's bounds of ``rewardWaitTime``."""


@dataclass(frozen=True)
class ServiceConfiguration:
    """One agent's service configuration, as the Personalizer API names its fields."""

    rewardWaitTime: str = "PT10M"
    defaultReward: float = 0.0
    rewardAggregation: str = "earliest"
    explorationPercentage: float = 0.2
    logRetentionDays: int = 90
    learningMode: str = "Online"
    modelExportFrequency: str = "PT5M"
    modelRetrainDays: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def reward_wait(self) -> timedelta:
        return parse_duration(self.rewardWaitTime)

    @property
    def ttl_seconds(self) -> int:
        """The time to live of the agent's episodes (``-1``: never deleted)."""
        return -1 if self.logRetentionDays == -1 else self.logRetentionDays * 86_400


FIELDS = tuple(ServiceConfiguration.__dataclass_fields__)
INFORMATIONAL = frozenset({
    "lastConfigurationEditDate", "latestApprenticeModeMetrics", "isAutoOptimizationEnabled",
    "autoOptimizationFrequency", "autoOptimizationStartDate", "logMirrorEnabled", "logMirrorSasUri",
})
"""Fields a client may send back from a GET that are not settings here: accepted and not stored."""


def configuration_from(data: Any, base: ServiceConfiguration | None = None) -> ServiceConfiguration:
    """The configuration a PUT body states, over ``base`` (fields it leaves out keep theirs);
    ``ValueError`` naming the field for anything else."""
    if not isinstance(data, dict):
        raise ValueError("body: must be a JSON object of service configuration fields")
    unknown = sorted(set(data) - set(FIELDS) - INFORMATIONAL)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (known: {', '.join(FIELDS)})")
    given = {k: v for k, v in data.items() if k in FIELDS}
    for name in ("rewardWaitTime", "modelExportFrequency"):
        if name in given:
            if not isinstance(given[name], str):
                raise ValueError(f"{name}: must be an ISO 8601 duration such as PT10M, got {given[name]!r:.80}")
            given[name] = format_duration(_duration(name, given[name]))
    wait = parse_duration(given.get("rewardWaitTime", (base or ServiceConfiguration()).rewardWaitTime))
    if not MIN_REWARD_WAIT <= wait <= MAX_REWARD_WAIT:
        raise ValueError(f"rewardWaitTime: must be from 5 seconds to 2 days, got {format_duration(wait)}")
    for name, low, high in (("defaultReward", 0.0, 1.0), ("explorationPercentage", 0.0, 1.0)):
        if name in given:
            value = given[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or not low <= value <= high:
                raise ValueError(f"{name}: must be a number from {low:g} to {high:g}, got {value!r:.80}")
            given[name] = float(value)
    for name, low in (("logRetentionDays", -1), ("modelRetrainDays", 0)):
        if name in given:
            value = given[name]
            zero_days = name == "logRetentionDays" and value == 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low or zero_days:
                rule = "-1 (never deleted) or a whole number of days from 1" if low == -1 else "a whole number from 0"
                raise ValueError(f"{name}: must be {rule}, got {value!r:.80}")
    if "logRetentionDays" in given and given["logRetentionDays"] * 86_400 > 2**31 - 1:
        raise ValueError(f"logRetentionDays: at most {(2**31 - 1) // 86_400} days, got {given['logRetentionDays']}")
    for name, allowed in (("learningMode", LEARNING_MODES), ("rewardAggregation", AGGREGATIONS)):
        if name in given and given[name] not in allowed:
            raise ValueError(f"{name}: must be one of {', '.join(allowed)}, got {given[name]!r:.80}")
    return replace(base or ServiceConfiguration(), **given)


_ISO = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?")
_TIMESPAN = re.compile(r"(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)")
"""A .NET TimeSpan (``00:10:00``, ``1.00:00:00``), as older Personalizer clients sent durations."""


def parse_duration(text: str) -> timedelta:
    """An ISO 8601 duration of days, hours, minutes and seconds (``PT10M``), or a .NET TimeSpan."""
    return _duration("duration", text)


def _duration(name: str, text: str) -> timedelta:
    iso = text not in ("P", "PT") and not text.endswith("T") and _ISO.fullmatch(text)
    if m := iso or _TIMESPAN.fullmatch(text):
        days, hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    else:
        raise ValueError(f"{name}: must be an ISO 8601 duration such as PT10M, got {text!r:.80}")
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def format_duration(value: timedelta) -> str:
    """``value`` as an ISO 8601 duration (``PT10M``, ``P1DT2H``)."""
    seconds = value.total_seconds()
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    time = "".join(f"{int(n)}{u}" for n, u in ((hours, "H"), (minutes, "M")) if n) + (f"{secs:g}S" if secs else "")
    return f"P{f'{int(days)}D' if days else ''}{'T' + time if time else ''}" if days or time else "PT0S"


class Problem(Exception):
    """A request the Personalizer API refuses: its HTTP status, Personalizer's error code and a
    message naming the field (``{"error": {"code", "message"}}``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
