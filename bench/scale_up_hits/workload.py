"""The workload: conversations whose prompts grow turn by turn (bench/multiturn's Conversation:
each turn sends the whole conversation so far plus a new user turn), in three phases around the
moment the fleet grows.

    before   the old conversations' first turns, then their second turns
    -- the join (the scaled fleet grows from 1+1 to 2+2 here; the fixed fleet is 2+2 throughout) --
    after    the old conversations' next turn and the new conversations' first turn, in one round
    later    two more rounds of both

A round's requests are sent together (at most `parallel` in flight); a conversation's next turn
goes only once its previous answer is in.
"""

from __future__ import annotations

import dataclasses

PHASES = ("before", "after", "later")


@dataclasses.dataclass(frozen=True)
class Workload:
    old_conversations: int = 8   # started before the join
    new_conversations: int = 8   # started right after it
    first_tokens: int = 64       # each conversation's first turn (4 pages of 16)
    turn_tokens: int = 32        # each later user turn
    output_tokens: int = 16      # each answer
    parallel: int = 8            # requests in flight at most
    seed: int = 0

    def rounds(self) -> dict[str, list[list[tuple[int, int]]]]:
        """Per phase, its rounds; a round is (conversation, turn) pairs, old and new interleaved.
        Conversations 0.. are the old ones, old_conversations.. the new ones."""
        old = range(self.old_conversations)
        new = range(self.old_conversations, self.old_conversations + self.new_conversations)

        def mixed(old_turn: int, new_turn: int) -> list[tuple[int, int]]:
            pairs = [(c, old_turn) for c in old]
            for i, c in enumerate(new):  # interleave: neither kind goes first as a block
                pairs.insert(min(2 * i + 1, len(pairs)), (c, new_turn))
            return pairs

        return {"before": [[(c, 0) for c in old], [(c, 1) for c in old]],
                "after": [mixed(2, 0)],
                "later": [mixed(3, 1), mixed(4, 2)]}

    def is_new(self, conversation: int) -> bool:
        return conversation >= self.old_conversations
