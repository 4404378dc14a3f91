"""Prompt lookup (n-gram) drafting from the context itself: the context's own n-gram statistics predict what
comes next (Saxena's prompt lookup, ranked by frequency as SGLang's n-gram trie and SuffixDecoding rank theirs).

`NgramIndex` keeps, for every n-gram of up to `max_ngram` tokens in a growing token list, how often each token
followed it and where it last did. A drafted token is the most frequent follower of the longest suffix n-gram
that occurred before (n = max_matching_ngram_size down to the minimum; ties go to the latest occurrence, the
one code and edited text repeat), and each next slot looks up again with the drafted token appended, so a draft
follows the branch the context supports most instead of one earlier occurrence's continuation. Hugging Face's
prompt lookup copies the earliest occurrence's continuation instead (docs/text.md compares them).

The proposal is a function of the context alone, a point mass (no draft probabilities): verification accepts a
token with the target's own probability of it and recovers from the target with that token zeroed, so sampling
stays exact; at temperature 0 it is greedy matching.
"""

from __future__ import annotations

import torch

from specgen.errors import InvalidRequest
from specgen.samplers.types import DecodeContext, Draft, Verdict


class NgramIndex:
    """Followers of the n-grams (n <= max_ngram) of one token list, kept in step with the list it is asked
    about: `sync` rolls back to the common prefix with the previous list (rejected drafts) and indexes the rest."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self.followers: dict[tuple[int, ...], dict[int, tuple[int, int]]] = {}  # n-gram -> {token: (count, last)}
        self._undo: list[list[tuple[dict, int, tuple[int, int] | None]]] = []  # per indexed position

    def sync(self, tokens: list[int]) -> None:
        keep = _common_prefix(self.tokens, tokens)
        while len(self.tokens) > keep:  # undo the followers the dropped positions added, latest first
            for entry, token, before in reversed(self._undo.pop()):
                if before is None:
                    del entry[token]
                else:
                    entry[token] = before
            self.tokens.pop()
        for i in range(keep, len(tokens)):  # position i is a follower of the n-grams that end before it
            token, undo = tokens[i], []
            for n in range(1, min(self.max_ngram, i) + 1):
                entry = self.followers.setdefault(tuple(tokens[i - n:i]), {})
                before = entry.get(token)
                entry[token] = (1 if before is None else before[0] + 1, i)
                undo.append((entry, token, before))
            self.tokens.append(token)
            self._undo.append(undo)

    def follower(self, tokens: list[int], min_ngram: int = 1) -> int | None:
        """The most frequent follower of `tokens`' longest suffix n-gram (n >= min_ngram) seen before, or None."""
        self.sync(tokens)
        for n in range(min(self.max_ngram, len(tokens) - 1), min_ngram - 1, -1):
            entry = self.followers.get(tuple(tokens[-n:]))
            if entry:
                return max(entry.items(), key=lambda item: item[1])[0]
        return None


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix; whole-slice comparisons run in C, so the usual case (one list
    extends the other, or they differ only near the end) costs a few of them."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if a[:mid] == b[:mid] else (low, mid)
    return low


def lookup(tokens: list[int], max_ngram: int, length: int, min_ngram: int = 1, *,
           index: NgramIndex | None = None) -> list[int]:
    """Up to `length` drafted tokens continuing `tokens`: the first needs a matching n-gram of at least one
    token (as Hugging Face's lookup), each later one of at least `min_ngram` tokens, so a draft stops where
    the context no longer supports it."""
    index = index or NgramIndex(max_ngram)
    drafted: list[int] = []
    for slot in range(length):
        found = index.follower(tokens + drafted, 1 if slot == 0 else min_ngram)
        if found is None:
            break
        drafted.append(found)
    return drafted


def _checked_sizes(max_ngram: int, min_ngram: int) -> tuple[int, int]:
    if not 1 <= min_ngram <= max_ngram:
        raise InvalidRequest(f"need 1 <= min_matching_ngram_size <= max_matching_ngram_size, got "
                             f"{min_ngram} and {max_ngram}")
    return max_ngram, min_ngram


def _row_index(indices: dict[int, NgramIndex], row: int, max_ngram: int) -> NgramIndex:
    """The batch row's index, made on its first lookup."""
    if row not in indices:
        indices[row] = NgramIndex(max_ngram)
    return indices[row]


class LookupSlots:
    """Which drafted slots of a draft model prompt lookup fills (`draft-lookup`): where the context so far ends
    in an n-gram (n >= min_ngram) that occurred before, its most frequent follower.

    The choice is a function of the context alone, so the slot's law is a point mass there and the draft
    model's law elsewhere; reporting exactly that keeps verification exact. Repetitive text (loops in greedy
    output, code that reuses names) is copied; the draft model writes the rest. One index per batch row keeps
    the lookups incremental (`row` names it; any list may be asked about)."""

    def __init__(self, max_matching_ngram_size: int = 5, min_matching_ngram_size: int = 2):
        self.max_ngram, self.min_ngram = _checked_sizes(max_matching_ngram_size, min_matching_ngram_size)
        self.indices: dict[int, NgramIndex] = {}

    def next_token(self, tokens: list[int], row: int = 0) -> int | None:
        return _row_index(self.indices, row, self.max_ngram).follower(tokens, self.min_ngram)


class PromptLookupDrafter:
    """`ngram`: every slot drafted by lookup (`lookup`); rows keep their own index across steps."""

    def __init__(self, max_matching_ngram_size: int = 5, min_matching_ngram_size: int = 2):
        self.max_ngram, self.min_ngram = _checked_sizes(max_matching_ngram_size, min_matching_ngram_size)
        self.indices: dict[int, NgramIndex] = {}

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        found = []
        for row, context in zip(ctx.rows.tolist(), ctx.tokens):
            found.append(lookup(context.tolist(), self.max_ngram, budget, self.min_ngram,
                                index=_row_index(self.indices, row, self.max_ngram)))
        tokens = torch.zeros(len(found), budget, dtype=torch.long)
        for i, follow in enumerate(found):
            tokens[i, :len(follow)] = torch.tensor(follow, dtype=torch.long)
        return Draft(tokens, None, num_drafted=torch.tensor([len(f) for f in found]))

    def agreement(self, ctx: DecodeContext, truths: list[list[int]], budget: int) -> list[tuple[int, int]]:
        """(slots compared, slots matched) per row between what `propose(ctx, budget)` drafts and `truths` (the
        tokens the rows went on with), compared slot by slot up to the first mismatch: what a shadowed lookup would
        have had accepted, without looking up the slots past the first mismatch (`auto` asks this after every step,
        where the step commits a few tokens and a full proposal looked up 16)."""
        out = []
        for row, context, truth in zip(ctx.rows.tolist(), ctx.tokens, truths):
            index, tokens = _row_index(self.indices, row, self.max_ngram), context.tolist()
            tested = matched = 0
            for slot in range(min(budget, len(truth))):
                found = index.follower(tokens + truth[:slot], 1 if slot == 0 else self.min_ngram)
                if found is None:
                    break
                tested += 1
                if found != truth[slot]:
                    break
                matched += 1
            out.append((tested, matched))
        return out

    def observe(self, verdict: Verdict) -> None:
        pass
