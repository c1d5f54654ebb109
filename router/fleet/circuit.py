"""Per-worker circuit breaker: stop sending to a worker after repeated failures.

    closed --(failures >= threshold)--> open --(cooldown elapsed)--> half_open
      ^                                                                  |
      +---------------------- success ---------------------------------+
                               failure in half_open -> open again

In half_open exactly one trial request is let through until it reports back.
Time is passed in (monotonic seconds) so tests need no sleeps.
"""

from __future__ import annotations


class CircuitBreaker:
    def __init__(self, failure_threshold: int, cooldown_s: float):
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self.state = "closed"
        self.failures = 0
        self.opened_at = 0.0
        self._trial_in_flight = False

    def allow(self, now: float) -> bool:
        """Whether a request may go to this worker now (a half_open trial counts as sent)."""
        if self.state == "closed":
            return True
        if self.state == "open":
            if now - self.opened_at < self.cooldown_s:
                return False
            self.state = "half_open"
            self._trial_in_flight = False
        return not self._trial_in_flight

    def on_sent(self) -> None:
        if self.state == "half_open":
            self._trial_in_flight = True

    def record_success(self) -> None:
        self.state = "closed"
        self.failures = 0
        self._trial_in_flight = False

    def record_failure(self, now: float) -> None:
        self.failures += 1
        if self.state == "half_open" or self.failures >= self.failure_threshold:
            self.state = "open"
            self.opened_at = now
            self._trial_in_flight = False
