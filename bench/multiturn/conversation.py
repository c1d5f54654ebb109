"""One client's conversation: what it sends each round and what that round could ideally reuse.

    round 0:  turn_0
    round r:  (prompt_{r-1} + answer_{r-1}) + turn_r      the whole conversation so far

`sglang` keeps the conversation as token ids (`/generate` with `input_ids`): the answer is the ids
the model generated, so the ideal is exact. `openai` keeps it as chat messages (text) and the
router applies the chat template; the ids sent are that template rendered here with the same
tokenizer, and the answer's ids are its text re-tokenized (plus the end-of-turn token when the
model stopped on it), since an OpenAI response carries no token ids.
"""

from __future__ import annotations

import dataclasses

from bench.multiturn.stats import ideal_cached_tokens


@dataclasses.dataclass
class Prompt:
    """One request to send: `ids` always (the engine variant and the ideal use them), `messages`
    for the OpenAI format."""

    client: int
    round: int
    ids: list[int]
    messages: list[dict] | None
    ideal_tokens: int
    previous_context_pages: int


class Conversation:
    def __init__(self, client: int, api: str, tokenizer, turns, page_size: int, first_tokens: int,
                 turn_tokens: int):
        self.client, self.api, self.tok, self.turns = client, api, tokenizer, turns
        self.page_size, self.first_tokens, self.turn_tokens = page_size, first_tokens, turn_tokens
        self.messages: list[dict] = []
        self.prev_context: list[int] = []   # previous prompt + answer ids
        self.prev_kv_tokens = 0             # how many of them had their KV computed
        self.last_prompt: list[int] = []

    def next_prompt(self, round_index: int) -> Prompt:
        n = self.first_tokens if round_index == 0 else self.turn_tokens
        turn_ids, turn_text = self.turns.turn(self.client, round_index, n)
        if self.api == "openai":
            self.messages.append({"role": "user", "content": turn_text})
            ids = self.tok.encode_chat(self.messages)
        else:
            ids = self.prev_context + turn_ids
        self.last_prompt = ids
        ideal = ideal_cached_tokens(ids, self.prev_context, self.prev_kv_tokens, self.page_size)
        return Prompt(self.client, round_index, ids, list(self.messages) if self.api == "openai" else None,
                      ideal, self.prev_kv_tokens // self.page_size)

    def record_answer(self, output_ids: list[int] | None, text: str, completion_tokens: int,
                      finish_reason: str | None) -> None:
        """Fold the answer in. `output_ids` None (OpenAI): re-tokenize `text`. A failed request
        (completion_tokens 0) leaves an empty answer; the next turn still follows."""
        if self.api == "openai":
            self.messages.append({"role": "assistant", "content": text})
        if output_ids is None:
            output_ids = self.tok.encode(text, add_special_tokens=False)
            if finish_reason == "stop" and completion_tokens > len(output_ids):
                output_ids = output_ids + list(self.tok.eos_token_ids[:1])
        self.prev_context = self.last_prompt + list(output_ids)
        # NOTE: the last generated token is never fed to the model, so its KV never exists.
        self.prev_kv_tokens = len(self.last_prompt) + max(0, completion_tokens - 1)
