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


def lookup(tokens: list[int], max_ngram: int, length: int) -> list[int]:
    """Continuation (up to `length` tokens) of the latest earlier match of the longest matching suffix n-gram."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest first; never the suffix itself
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + length]
                if follow:
                    return follow
    return []


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
