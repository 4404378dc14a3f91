"""Prompt lookup (n-gram) drafting: find the most recent earlier occurrence of the context's last n tokens
(n = max_matching_ngram_size down to 1, as Hugging Face's prompt lookup) and propose what followed it.

The proposal is a point mass (no draft probabilities): verification accepts a token with the target's own
probability of it and recovers from the target with that token zeroed, so sampling stays exact; at
temperature 0 it is greedy matching. Hugging Face takes the earliest match; the latest one copies the most
recent continuation, which is what repeats in code and edited text.
"""

from __future__ import annotations

import torch

from specgen.errors import InvalidRequest
from specgen.samplers.types import DecodeContext, Draft, Verdict


def lookup(tokens: list[int], max_ngram: int, length: int, min_ngram: int = 1) -> list[int]:
    """Continuation (up to `length` tokens) of the latest earlier match of the longest matching suffix n-gram
    (n from `max_ngram` down to `min_ngram`)."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest first; never the suffix itself
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + length]
                if follow:
                    return follow
    return []


class LookupSlots:
    """Which drafted slots of a draft model prompt lookup fills (`draft-lookup`): where the context so far ends
    in an n-gram (n >= min_ngram) that occurred before, the token that followed its latest occurrence.

    The choice is a function of the context alone, so the slot's law is a point mass there and the draft
    model's law elsewhere; reporting exactly that keeps verification exact. Repetitive text (loops in greedy
    output, code that reuses names) is copied; the draft model writes the rest."""

    def __init__(self, max_matching_ngram_size: int = 3, min_matching_ngram_size: int = 2):
        if not 1 <= min_matching_ngram_size <= max_matching_ngram_size:
            raise InvalidRequest(f"need 1 <= min_matching_ngram_size <= max_matching_ngram_size, got "
                                 f"{min_matching_ngram_size} and {max_matching_ngram_size}")
        self.max_ngram, self.min_ngram = max_matching_ngram_size, min_matching_ngram_size

    def next_token(self, tokens: list[int]) -> int | None:
        follow = lookup(tokens, self.max_ngram, 1, self.min_ngram)
        return follow[0] if follow else None


class PromptLookupDrafter:
    def __init__(self, max_matching_ngram_size: int = 3):
        if max_matching_ngram_size < 1:
            raise InvalidRequest(f"max_matching_ngram_size must be >= 1, got {max_matching_ngram_size}")
        self.max_ngram = max_matching_ngram_size

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        found = [lookup(t.tolist(), self.max_ngram, budget) for t in ctx.tokens]
        tokens = torch.zeros(len(found), budget, dtype=torch.long)
        for i, follow in enumerate(found):
            tokens[i, :len(follow)] = torch.tensor(follow, dtype=torch.long)
        return Draft(tokens, None, num_drafted=torch.tensor([len(f) for f in found]))

    def observe(self, verdict: Verdict) -> None:
        pass
