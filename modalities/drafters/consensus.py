"""`consensus`: the samples of one request draft for each other (multi-sample consensus drafting, Li et al. 2025,
arXiv 2503.05330).

With `--num-samples N` the N paths decode as rows of one batch. For path i, each other path j (and i itself, as
prompt lookup does) is searched for the longest suffix of path i's committed text (min_match <= n <= max_match);
the tokens that followed it there are a candidate continuation, weighted by the match length n / max_match (a
longer shared context is stronger evidence) and counted once per supporting path. The weighted continuations are
merged into a trie and its `tree_budget` heaviest nodes are the draft (`retrieval.trie_tree`): the sequences most
paths agree on come first. Paths that have finished keep lending their text.

Exact per path: candidates are deterministic and verified by the deterministic tree rule (greedy matching at
temperature 0), exact for any candidate set; a draft depends only on text every path committed before the step,
and each path's verification uses its own sample's noise, so each path's law is the target's and the paths stay
independent in distribution (a draft never sees a neighbour's randomness of the current or a later step).
"""

from __future__ import annotations

import time

import numpy as np

from specgen.errors import InvalidRequest
from specgen.modalities.drafters.retrieval import trie_proposal
from specgen.samplers.types import DecodeContext, Draft, DraftTree, Verdict


def latest_match(path: np.ndarray, query: np.ndarray, max_match: int, min_match: int, exclude_end: bool):
    """(n, position after the match) of the latest occurrence in `path` of query's longest suffix (n >= min_match),
    or None. exclude_end: the path is the query itself, so its trivial match at the end does not count."""
    size = len(path) - (1 if exclude_end else 0)
    for n in range(min(max_match, len(query), size), min_match - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(path[:size], n)
        hits = np.flatnonzero((windows == query[len(query) - n:]).all(axis=1))
        if len(hits):
            return n, int(hits[-1]) + n
    return None


class ConsensusDrafter:
    siblings = "deterministic"

    def __init__(self, *, tree_budget: int = 16, max_depth: int = 8, max_match: int = 8, min_match: int = 2,
                 self_weight: float = 0.5, group: int = 16, min_share: float = 0.0):
        if tree_budget < 1 or max_depth < 1 or not 1 <= min_match <= max_match:
            raise InvalidRequest("consensus needs tree_budget >= 1, max_depth >= 1 and 1 <= min_match <= max_match")
        self.tree_budget, self.max_depth, self.max_match, self.min_match = tree_budget, max_depth, max_match, min_match
        self.self_weight, self.group, self.min_share = self_weight, max(1, group), min_share
        self.paths: dict[int, np.ndarray] = {}  # sample id -> its committed text (finished paths stay)
        self.draft_s, self.steps, self.supported = 0.0, 0, 0

    def continuations(self, sample: int, depth: int) -> list[tuple[list[int], float]]:
        query = self.paths[sample]
        found = []
        for other, path in self.paths.items():
            if other // self.group != sample // self.group:  # paths draft for each other in groups of `group`
                continue
            hit = latest_match(path, query, self.max_match, self.min_match, exclude_end=other == sample)
            if hit is None:
                continue
            n, after = hit
            tokens = path[after:after + depth].tolist()
            if tokens:
                found.append((tokens, (n / self.max_match) * (self.self_weight if other == sample else 1.0)))
        return found

    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree | Draft:
        started = time.perf_counter()
        for tokens, sample in zip(ctx.tokens, ctx.sample_ids.tolist()):
            self.paths[sample] = tokens.numpy()
        depth = min(self.max_depth, max(1, budget))

        def found_for(context, sample):
            found = self.continuations(sample, depth)
            self.supported += bool(found)
            return found

        proposal = trie_proposal(ctx, found_for, self.tree_budget, depth, self.min_share)
        self.steps += len(ctx.tokens)
        self.draft_s += time.perf_counter() - started
        return proposal

    def observe(self, verdict: Verdict) -> None:
        pass

    def run_summary(self) -> dict:
        return {"consensus_ms_per_row_step": 1e3 * self.draft_s / max(self.steps, 1),
                "rows_with_candidates": self.supported / max(self.steps, 1)}
