"""`rest`: retrieval drafting from a sparse datastore (REST, He et al. 2024, arXiv 2311.08252).

Each step the longest suffix of the context (up to 16 tokens, at least `min_match`) is looked up in the datastore's
suffix array (`modalities/text/datastore.py`); the continuations after up to `candidates` of its occurrences, and
after the context's own earlier occurrences of its longest repeated suffix (prompt lookup, weighted
`context_weight` each), are merged into a trie whose nodes count the continuations through them. The `tree_budget`
heaviest nodes (an ancestor is never lighter than its descendant, so the set is a tree) are the draft, siblings
ordered by weight. Candidates are deterministic: verification is the deterministic tree rule (each candidate
accepted with the target's probability, which is zeroed on rejection), exact for any candidate set, and greedy
tree matching at temperature 0.

`trie_tree` and `candidates_as_tree` are shared with the consensus drafter.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Sequence

import numpy as np

from specgen.errors import InvalidRequest
from specgen.modalities.drafters.tree import pad_trees
from specgen.samplers.types import DecodeContext, Draft, DraftTree, Verdict


def trie_tree(continuations: Sequence[tuple[Sequence[int], float]], budget: int, max_depth: int,
              min_share: float = 0.0) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the non-root nodes (parents index the returned list, -1 = the root) of the trie of
    `continuations` (token lists with weights) cut to its `budget` heaviest nodes no deeper than max_depth and
    carrying at least `min_share` of the total weight; breadth-first, siblings heaviest first (ties: lower id)."""
    weight: dict[tuple[int, ...], float] = defaultdict(float)
    for tokens, w in continuations:
        for d in range(1, min(len(tokens), max_depth) + 1):
            weight[tuple(tokens[:d])] += w
    floor = min_share * sum(w for tokens, w in continuations if tokens)
    # heaviest first; equal weights: shallower first, so every chosen node's ancestors are chosen before it
    chosen = set(p for p in sorted(weight, key=lambda p: (-weight[p], len(p), p))[:budget] if weight[p] >= floor)
    kids: dict[tuple, list] = defaultdict(list)
    for path in chosen:
        kids[path[:-1]].append(path)
    tokens, parents, index, queue = [], [], {(): -1}, [()]
    while queue:
        path = queue.pop(0)
        for kid in sorted(kids[path], key=lambda p: (-weight[p], p[-1])):
            index[kid] = len(tokens)
            tokens.append(kid[-1])
            parents.append(index[path])
            queue.append(kid)
    return tokens, parents


def candidates_as_tree(roots: Sequence[int], rows: Sequence[tuple[list[int], list[int]]]) -> DraftTree | Draft:
    """Deterministic candidate trees of several rows (from `trie_tree`) under their roots as one DraftTree
    (`pad_trees`), or an empty chain when no row has a candidate."""
    if all(not tokens for tokens, _ in rows):
        return Draft.empty(len(rows))
    return pad_trees([[root, *tokens] for root, (tokens, _) in zip(roots, rows)],
                     [[-1] + [p + 1 for p in parents] for _, parents in rows])


def trie_proposal(ctx: DecodeContext, found_for, budget: int, depth: int, min_share: float) -> DraftTree | Draft:
    """Each row's retrieved continuations (`found_for(context, sample id)`, weighted) merged into a trie under its
    last token: the proposal of every retrieval drafter."""
    rows, roots = [], []
    for tokens, sample in zip(ctx.tokens, ctx.sample_ids.tolist()):
        context = tokens.tolist()
        rows.append(trie_tree(found_for(context, sample), budget, depth, min_share))
        roots.append(context[-1])
    return candidates_as_tree(roots, rows)


def context_continuations(context: np.ndarray, max_match: int, min_match: int, length: int,
                          limit: int = 16) -> list[list[int]]:
    """Continuations (up to `length` tokens) after the latest `limit` earlier occurrences of the context's longest
    repeated suffix (min_match <= n <= max_match)."""
    size = len(context)
    for n in range(min(max_match, size - 1), min_match - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[:size - 1], n)
        hits = np.flatnonzero((windows == context[size - n:]).all(axis=1))
        if len(hits):
            return [context[h + n:h + n + length].tolist() for h in hits[-limit:][::-1]]
    return []


class RestDrafter:
    """`rest` over an opened `Datastore`."""

    siblings = "deterministic"

    def __init__(self, datastore, *, tree_budget: int = 16, max_depth: int = 8, max_match: int = 16,
                 min_match: int = 2, candidates: int = 64, context_weight: float = 8.0, min_share: float = 0.0):
        if tree_budget < 1 or max_depth < 1 or not 1 <= min_match <= max_match:
            raise InvalidRequest("rest needs tree_budget >= 1, max_depth >= 1 and 1 <= min_match <= max_match")
        self.datastore, self.tree_budget, self.max_depth = datastore, tree_budget, max_depth
        self.max_match, self.min_match, self.candidates, self.context_weight = (max_match, min_match, candidates,
                                                                                context_weight)
        self.min_share = min_share
        self.retrieval_s, self.steps, self.matched_steps, self.match_tokens = 0.0, 0, 0, 0

    def continuations(self, context: list[int], depth: int) -> list[tuple[list[int], float]]:
        started = time.perf_counter()
        found: list[tuple[list[int], float]] = []
        if self.datastore is not None:
            n, lo, hi = self.datastore.longest_match(context, self.max_match, self.min_match)
            if n:
                self.matched_steps += 1
                self.match_tokens += n
                found += [(c, 1.0) for c in self.datastore.continuations(lo, hi, n, depth, self.candidates)]
        if self.context_weight > 0:
            own = context_continuations(np.asarray(context), self.max_match, self.min_match, depth)
            found += [(c, self.context_weight) for c in own]
        self.retrieval_s += time.perf_counter() - started
        return found

    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree | Draft:
        depth = min(self.max_depth, max(1, budget))
        self.steps += len(ctx.tokens)
        return trie_proposal(ctx, lambda context, sample: self.continuations(context, depth), self.tree_budget,
                             depth, self.min_share)

    def observe(self, verdict: Verdict) -> None:
        pass

    def run_summary(self) -> dict:
        steps = max(self.steps, 1)
        return {"retrieval_ms_per_step": 1e3 * self.retrieval_s / steps, "matched_steps": self.matched_steps / steps,
                "mean_match_tokens": self.match_tokens / max(self.matched_steps, 1)}
