"""A client-side token budget that paces judge calls below the judge deployment's limits.

Azure OpenAI admits a request against a deployment's tokens-per-minute (TPM) limit by its prompt
tokens plus its completion limit (``max_tokens``), adds that to a running count for the minute,
and answers 429 once the count would pass the limit; it also allows 6 requests a minute per 1,000
TPM, enforced over windows of a few seconds. Meeting those limits as 429s costs a failed attempt,
a backoff and, when the backoffs run out, a redelivered message. Instead, the judge reserves each
call's admission cost here before sending it (:meth:`TokenBudget.reserve`), and sends it at the
start time the budget books for it:

* tokens: in any 60 seconds the booked calls add up to at most ``tokens_per_minute``; a call that
  costs more than that on its own starts in an empty window and holds it for cost / limit minutes,
  so the long-run rate holds too;
* requests: calls start at least 60 / (6 × ``tokens_per_minute`` / 1,000) seconds apart;
* first come, first served: a call is never booked before one booked earlier.

A reservation is booked with the estimated prompt tokens (:class:`PromptEstimate`) plus the call's
``max_tokens`` and corrected (:meth:`TokenBudget.settle`) with the prompt tokens the evaluator
reports; the completion part stays at ``max_tokens``, which is what the deployment's counter
charged when it admitted the call. A call that fails keeps its reservation (it may well have
been admitted). A call whose start would come later than its deadline is not booked:
:meth:`~TokenBudget.reserve` returns ``None`` and the judge fails the episode transiently, so the
message is redelivered later instead of holding a worker past its deadline.

The budget is per process: processes that share a deployment each need their share of its limit.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_SECONDS = 60.0
"""The span the deployment counts tokens over."""
REQUESTS_PER_THOUSAND_TPM = 6
"""Requests a minute Azure OpenAI allows per 1,000 tokens a minute of a deployment."""


@dataclass
class Reservation:
    """One booked call: when it may start, what it costs, and until when that cost holds the window."""

    start: float
    cost: int
    until: float


class TokenBudget:
    """Books judge calls under ``tokens_per_minute`` (see the module docstring). Thread-safe.

    ``clock`` is a monotonic clock in seconds (the event loop's own, by default).
    """

    def __init__(self, tokens_per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if tokens_per_minute < 1:
            raise ValueError("a token budget needs tokens_per_minute >= 1")
        self.tokens_per_minute = tokens_per_minute
        self.spacing = WINDOW_SECONDS / (REQUESTS_PER_THOUSAND_TPM * tokens_per_minute / 1000)
        """Seconds between call starts, from the requests-per-minute allowance."""
        self.clock = clock
        self._lock = threading.RLock()
        self._booked: list[Reservation] = []
        self._last_start: float | None = None

    def _hold(self, start: float, cost: int) -> float:
        return start + WINDOW_SECONDS * max(1.0, cost / self.tokens_per_minute)

    def reserve(self, cost: int, max_wait: float) -> Reservation | None:
        """Book the earliest start for a call of ``cost`` tokens, or ``None`` (nothing booked) if
        that start is ``max_wait`` seconds or more away."""
        if cost < 0:
            raise ValueError("a call's cost must be >= 0 tokens")
        with self._lock:
            now = self.clock()
            self._booked = [r for r in self._booked if r.until > now]
            start = now if self._last_start is None else max(now, self._last_start + self.spacing)
            # The window at ``start`` holds every booking that has not expired by then; each candidate
            # start after that is the moment the next one expires (every booking starts before ``start``).
            for expiry in sorted({r.until for r in self._booked} | {start}):
                start = max(start, expiry)
                held = sum(r.cost for r in self._booked if r.until > start)
                if held == 0 or held + cost <= self.tokens_per_minute:
                    break
            if start - now >= max_wait:
                return None
            reservation = Reservation(start, cost, self._hold(start, cost))
            self._booked.append(reservation)
            self._last_start = start
            return reservation

    def reserve_all(self, costs: list[int], max_wait: float) -> list[Reservation] | None:
        """Book calls of ``costs`` one after another, all or none: ``None`` (nothing booked) if the
        last would start ``max_wait`` seconds or more from now."""
        with self._lock:
            booked: list[Reservation] = []
            last_start = self._last_start
            for cost in costs:
                reservation = self.reserve(cost, max_wait)
                if reservation is None:
                    for r in booked:
                        self._booked.remove(r)
                    self._last_start = last_start
                    return None
                booked.append(reservation)
            return booked

    def wait(self, reservation: Reservation) -> float:
        """Seconds until ``reservation`` may start (0 if it may now)."""
        return max(0.0, reservation.start - self.clock())

    def settle(self, reservation: Reservation, cost: int) -> None:
        """Correct a reservation's cost once the call's real count is known."""
        with self._lock:
            reservation.cost = max(0, cost)
            reservation.until = self._hold(reservation.start, reservation.cost)

    def release(self, reservation: Reservation) -> None:
        """Drop a reservation whose call was never sent."""
        with self._lock:
            if reservation in self._booked:
                self._booked.remove(reservation)

    def held(self, at: float | None = None) -> int:
        """Tokens the bookings hold in the window at ``at`` (now by default)."""
        at = self.clock() if at is None else at
        with self._lock:
            return sum(r.cost for r in self._booked if r.start <= at < r.until)


class PromptEstimate:
    """The prompt tokens of an evaluator's next call, before it is rendered: its template's and its
    input's characters at 4 characters a token, scaled by the ratio the last reported count showed.

    Four characters a token over-estimates the evaluators' prompts by about 14% (7,066 against
    6,181 o200k tokens for the benchmark episode; ``benchmarks/judge_tokens.py``), the safe side
    until the first call reports its count.
    """

    CHARS_PER_TOKEN = 4.0

    def __init__(self, template_chars: int) -> None:
        self.template_chars = template_chars
        self.ratio = 1.0

    def _raw(self, input_chars: int) -> float:
        return (self.template_chars + input_chars) / self.CHARS_PER_TOKEN

    def tokens(self, input_chars: int) -> int:
        """The estimate for a call whose inputs serialise to ``input_chars`` characters."""
        return math.ceil(self.ratio * self._raw(input_chars))

    def observe(self, input_chars: int, prompt_tokens: int) -> None:
        """Learn from a call whose inputs had ``input_chars`` characters and whose prompt the model
        counted as ``prompt_tokens``."""
        if prompt_tokens > 0:
            self.ratio = prompt_tokens / self._raw(input_chars)
