"""SamplingParams: how one request picks its tokens and when it stops. Torch-free, frozen."""

from __future__ import annotations

from dataclasses import dataclass, replace

GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "ebnf", "structural_tag")
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar the output must follow (engine/grammar.py)."""

    kind: str                         # one of GRAMMAR_KINDS
    spec: str = ""                    # the JSON schema text, regex, EBNF or structural tag; "" for json_object

    def __post_init__(self):
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0          # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1                   # -1 (or 0) = whole vocabulary
    min_p: float = 0.0                # drop tokens below min_p x the top token's probability; 0 = off
    max_tokens: int = 16
    stop: tuple[str, ...] = ()        # stop strings; trimmed from the output text
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None           # per-request generator: same seed -> same tokens
    skip_special_tokens: bool = True  # for the output text only
    spaces_between_special_tokens: bool = True  # False (with special tokens shown): adjacent ones as written
    include_stop_str_in_output: bool = False  # the matched stop string / stop token's text ends the output
    grammar: GrammarSpec | None = None  # structured output; None: unconstrained
    logprobs: int | None = None       # each token's logprob and this many alternatives (0-20); None: none
    presence_penalty: float = 0.0     # logit -= presence_penalty x (count in the output > 0)
    frequency_penalty: float = 0.0    # logit -= frequency_penalty x count in the output
    repetition_penalty: float = 1.0   # prompt and output tokens: positive logits / p, negative x p
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0               # no EOS / stop token / stop string before this many tokens
    resumed_tokens: int = 0           # the prompt's last that many tokens are output already (failover)
    n: int = 1                        # output sequences for the prompt; sequence i samples with seed + i
    prompt_logprobs: int | None = None  # each prompt token's logprob and this many alternatives; None: none
    allowed_token_ids: tuple[int, ...] = ()  # only these may be sampled; (): any
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences the output never completes (vLLM's bad_words)

    def __post_init__(self):
        # NOTE: lists from JSON are accepted and frozen into tuples, so params stay hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "allowed_token_ids", tuple(int(t) for t in self.allowed_token_ids))
        object.__setattr__(self, "bad_words", tuple(tuple(int(t) for t in w) for w in self.bad_words))
        if any(not w for w in self.bad_words):
            raise ValueError("bad_words must be non-empty token sequences")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 0, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in self.logit_bias))
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.min_tokens < 0 or self.resumed_tokens < 0:
            raise ValueError("min_tokens and resumed_tokens must be >= 0")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {k}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    def sequence(self, i: int) -> SamplingParams:
        """Sequence i's own params (n > 1): one sequence, its generator seeded seed + i."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + i)

    @property
    def needs_history(self) -> bool:
        """Whether sampling reads the tokens so far (penalties, min_tokens, bad_words) or changes the
        logits by itself (logit_bias, allowed_token_ids): the rows engine/sampler.py apply_controls takes."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.allowed_token_ids or self.bad_words)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
