"""The arithmetic of a profile point from timed streams (bench/profile/stream.py), apart from the
sending so it can be checked on hand-made timings (bench/profile/test_points.py)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from bench.multiturn.stats import percentile


@dataclass(frozen=True)
class DecodeWindow:
    """What B concurrent streams did while all B were decoding."""

    start: float          # the last stream's first token: from here every stream is in the batch
    end: float            # the first stream's last token: after it the batch shrinks
    tokens: int           # tokens of all streams arriving in (start, end]
    gaps: tuple[float, ...]  # inter-token gaps ending in (start, end]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.end - self.start)

    @property
    def itl_p90_s(self) -> float:
        return percentile(list(self.gaps), 90)


def full_batch_window(token_times: list[list[float]]) -> DecodeWindow | None:
    """The window of `token_times` (one list of arrival times per stream) where every stream decodes;
    None when there is none (a stream ended before the last one started)."""
    start = max(times[0] for times in token_times)
    end = min(times[-1] for times in token_times)
    if end <= start:
        return None
    tokens, gaps = 0, []
    for times in token_times:
        for prev, t in pairwise(times):
            if start < t <= end:
                tokens += 1
                gaps.append(t - prev)
    if not gaps:
        return None
    return DecodeWindow(start, end, tokens, tuple(gaps))


def saturated_tokens_per_s(sent: float, first_token_times: list[float], prompt_tokens: int) -> float:
    """Prompt tokens per second of requests all sent at `sent`: every prompt's tokens over the time
    until the last one had its first token."""
    return len(first_token_times) * prompt_tokens / (max(first_token_times) - sent)


def burst_size(prompt_tokens: int, saturate_tokens: int, minimum: int = 4) -> int:
    """Requests in a saturating burst: about `saturate_tokens` prompt tokens, at least `minimum`."""
    return max(minimum, -(-saturate_tokens // prompt_tokens))
