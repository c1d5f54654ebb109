"""Turn content for `pdorch bench multiturn`: English-like sentences from a small built-in grammar,
seeded, tokenized to an exact length. Real text (not random ids) so the tokenizer merges words the
way it does on user input, and the OpenAI format round-trips through the chat template.

Every (seed, client, round) gives its own text, the same on every run and every machine.
"""

from __future__ import annotations

import random

_SUBJECTS = ["the engineer", "a small team", "our neighbour", "the old captain", "every student", "the committee",
             "a curious child", "the night nurse", "my grandmother", "the new manager", "the baker", "a traveller"]
_VERBS = ["repaired", "described", "carried", "painted", "measured", "forgot", "borrowed", "planted", "explained",
          "questioned", "delivered", "studied", "followed", "counted", "photographed", "rebuilt"]
_OBJECTS = ["the wooden bridge", "a letter from the coast", "three baskets of apples", "the broken clock",
            "an unusual map", "the garden wall", "a recipe for bread", "the train timetable", "two copper lamps",
            "the village records", "a box of old photographs", "the river boat", "the winter coats"]
_PLACES = ["near the harbour", "behind the library", "in the quiet valley", "before the storm arrived",
           "after the market closed", "on the northern hill", "during the long summer", "beside the station",
           "at the edge of the forest", "under the grey sky"]
_ADVERBS = ["carefully", "slowly", "without a word", "with great patience", "for the second time", "again",
            "quickly", "as the sun went down"]
_LINKS = ["Later,", "Meanwhile,", "Because of that,", "In the end,", "At first,", "Nobody knew why, but",
          "Some say that", "Of course,"]
_QUESTIONS = ["Can you explain why this happened?", "What would you do next?", "Summarise the story so far.",
              "Which detail matters most?", "How could it have gone differently?"]


def sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_PLACES)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(_ADVERBS)}"
    if rng.random() < 0.3:
        s = f"{rng.choice(_LINKS)} {s}"
    return s[0].upper() + s[1:] + "."


def paragraph(rng: random.Random, min_words: int) -> str:
    words, parts = 0, []
    while words < min_words:
        parts.append(sentence(rng))
        words += len(parts[-1].split())
    parts.append(rng.choice(_QUESTIONS))
    return " ".join(parts)


class TurnSource:
    """Token ids (and their text) of each user turn: exactly `n` ids, unless the text round-trip
    of a truncated tail re-tokenizes differently (OpenAI format; the router's count is reported)."""

    def __init__(self, tokenizer, seed: int, random_ids: bool = False):
        self.tok = tokenizer
        self.seed = seed
        self.random_ids = random_ids

    def turn(self, client: int, round_index: int, n: int) -> tuple[list[int], str]:
        # NOTE: str seeds are hashed with sha512 by random.Random: stable across processes,
        # unlike hash() of a tuple.
        rng = random.Random(f"{self.seed}:{client}:{round_index}")
        if self.random_ids:
            # Ids of ordinary tokens: skip the low ids (special and byte tokens of BPE vocabularies).
            ids = [rng.randrange(1000, self.tok.vocab_size) for _ in range(n)]
            return ids, self.tok.decode(ids, skip_special_tokens=True)
        text, ids = "", []
        while len(ids) < n:
            text = (text + " " + paragraph(rng, n)).strip()
            ids = self.tok.encode(text, add_special_tokens=False)
        ids = ids[:n]
        return ids, self.tok.decode(ids, skip_special_tokens=True)
