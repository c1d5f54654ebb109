"""One request of a trace as every reader gives it, whatever the file's format.

A trace request says what was sent and when, not the tokens themselves: either block hash ids (the
Mooncake and Bailian formats: two requests share a prefix exactly where their ids are equal; the
replay turns each id into the same token ids every time, bench/trace/tokens.py) or text (aiperf's
formats: tokenized with the served model's tokenizer). Times are seconds since the trace's start.
"""

from __future__ import annotations

from dataclasses import dataclass


class TraceError(ValueError):
    """A trace file the benchmark cannot replay as written: names the file, the line and the field."""


@dataclass(frozen=True)
class TraceRequest:
    index: int                      # position in the file (records sorted by arrival keep it as a tie-break)
    session: str                    # requests of one session are subsampled together (--sessions-fraction)
    arrival_s: float | None         # recorded arrival since the trace's start; None: not recorded
    output_tokens: int | None       # recorded output length; None: not recorded (--default-output-tokens)
    blocks: tuple[int, ...] = ()    # hash ids, one per block of the recorded block size
    input_length: int | None = None  # recorded prompt tokens (the last block may be partial)
    text: str | None = None         # aiperf: the prompt text of this turn
    delay_s: float | None = None    # aiperf: sent this long after the previous turn of its session ended
    follows_previous: bool = False  # sent only once the previous request of its session has ended
    carries_history: bool = False   # prompt = previous prompt + previous answer + this turn (aiperf multi-turn)
