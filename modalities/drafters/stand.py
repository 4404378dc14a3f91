"""`stand`: stochastic adaptive n-gram drafting (STAND, Song et al. 2025, arXiv 2506.04708).

An n-gram store keyed by the last n tokens (n = max_ngram down to 1) holds, for each key, an aggregated next-token
*distribution*: the prompt's own followers as point masses, and at every committed position the target's processed
law there (its top-k, renormalised), which verification computes anyway (`Verdict.target_probs`). A draft is a tree
grown best-first by path probability under the store's laws (the longest key with an entry answers), each node's
children drawn without replacement by Gumbel-top-k with counter-based noise keyed by (seed, sample, the node's token
path, position). The tree stores each node's law, so verification is the without-replacement tree rule with the
store's law as q: exact, and where the store has a distribution a draft is not a point mass, so acceptance is
sum(min(target, q)) rather than target(argmax q). At temperature 0 the children are the store's most probable tokens
and greedy tree matching verifies them.

Exactness needs the decision to try one more child to be taken before the child is drawn (samplers/trees.py): the
builder keys an undrawn sibling by the parent's value times the law's r-th largest probability (token-free) and
never tries a rank the law gives probability 0 or whose key is below `min_value` (verifying a slot is not free: on
Gemma 3 270M the 262k-token output layer makes every scored slot cost). The store changes only between steps and
only from committed text, so a proposal depends on the past alone. With several samples of one prompt (`--num-
samples`) the samples share one store (`share="samples"`): each sample's law stays the target's and the samples stay
independent in distribution (a draft depends only on what every sample committed before the step; each verification
uses its own sample's noise).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import torch

from specgen.errors import InvalidRequest
from specgen.modalities.drafters.tree import tree_from_builders
from specgen.samplers import trees
from specgen.samplers.noise import Purpose, counter_exponential
from specgen.samplers.processing import Processing
from specgen.samplers.types import DecodeContext, Draft, DraftTree, Verdict


class SparseLaw:
    """A distribution over a few token ids of a `vocab`-sized vocabulary; answers what the tree builders ask of a
    law (`shape`, `topk(n).values`, `law[token]`) without a dense vector."""

    def __init__(self, tokens: Sequence[int], probs: Sequence[float], vocab: int):
        self.tokens = torch.as_tensor(list(tokens), dtype=torch.long)
        self.probs = torch.as_tensor(list(probs), dtype=torch.float64)
        self.shape = (vocab,)
        self._by_token = dict(zip(self.tokens.tolist(), self.probs.tolist()))

    def topk(self, n: int):
        n = min(n, len(self.tokens))
        return self.probs.topk(n) if n else torch.return_types.topk((self.probs[:0], self.tokens[:0]))

    def __getitem__(self, token) -> torch.Tensor:
        return torch.tensor(self._by_token.get(int(token), 0.0), dtype=torch.float64)

    def __len__(self) -> int:
        return len(self.tokens)

    def write_into(self, row: torch.Tensor) -> None:
        """This law as a dense [vocab] row (what a DraftTree stores per node)."""
        row[self.tokens] = self.probs.to(row.dtype)

    def dense(self, vocab: int | None = None) -> torch.Tensor:
        out = torch.zeros(vocab or self.shape[0], dtype=torch.float64)
        return out.index_put_((self.tokens,), self.probs)


class LawStore:
    """n-gram key -> aggregated next-token weights (n <= max_ngram), each entry pruned to its `top_k` heaviest
    tokens. `law(context)` answers from the longest suffix key of at least `min_ngram` tokens that has an entry."""

    def __init__(self, vocab: int, max_ngram: int = 4, top_k: int = 8, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram or top_k < 1:
            raise InvalidRequest(f"need 1 <= min_ngram <= max_ngram and top_k >= 1, got {min_ngram}, {max_ngram}, "
                                 f"{top_k}")
        self.vocab, self.max_ngram, self.top_k, self.min_ngram = vocab, max_ngram, top_k, min_ngram
        self.table: dict[tuple[int, ...], dict[int, float]] = {}

    def add(self, context: Sequence[int], tokens: Sequence[int], weights: Sequence[float]) -> None:
        """Add `weights` of `tokens` as followers of every suffix key of `context`."""
        for n in range(1, min(self.max_ngram, len(context)) + 1):
            entry = self.table.setdefault(tuple(context[len(context) - n:]), {})
            for token, weight in zip(tokens, weights):
                entry[token] = entry.get(token, 0.0) + weight
            if len(entry) > 2 * self.top_k:  # amortised pruning: keep the top_k heaviest (ties: lower id)
                kept = sorted(entry.items(), key=lambda item: (-item[1], item[0]))[:self.top_k]
                entry.clear()
                entry.update(kept)

    def add_text(self, tokens: Sequence[int]) -> None:
        """Every position's token as a point-mass follower of the tokens before it (the prompt's n-grams)."""
        tokens = list(tokens)
        for i in range(1, len(tokens)):
            self.add(tokens[max(0, i - self.max_ngram):i], [tokens[i]], [1.0])

    def add_law(self, context: Sequence[int], law: torch.Tensor) -> None:
        """The target's law after `context` ([vocab] probabilities): its top_k tokens, renormalised."""
        top = law.double().topk(min(self.top_k, law.shape[-1]))
        keep = top.values > 0
        values = top.values[keep]
        if len(values):
            self.add(context[-self.max_ngram:], top.indices[keep].tolist(), (values / values.sum()).tolist())

    def law(self, context: Sequence[int]) -> SparseLaw | None:
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            entry = self.table.get(tuple(context[len(context) - n:]))
            if entry:
                items = sorted(entry.items(), key=lambda item: (-item[1], item[0]))[:self.top_k]
                total = sum(w for _, w in items)
                return SparseLaw([t for t, _ in items], [w / total for _, w in items], self.vocab)
        return None

    def dense_law(self, context: Sequence[int]) -> torch.Tensor:
        """The law as a [vocab] float64 vector (zeros where the store knows nothing): the oracle's view."""
        found = self.law(context)
        return torch.zeros(self.vocab, dtype=torch.float64) if found is None else found.dense()


class StandBuilder(trees.DySpecBuilder):
    """Best-first growth by path probability (DySpec's builder, one node per round: laws cost no forward), that
    never tries a child rank the law gives probability 0 (the store's laws are sparse). The decision to try rank r
    reads only the law's r-th largest probability, never the drawn token: exact under the without-replacement rule."""

    def __init__(self, root_token: int, order, budget: int, max_depth: int | None = None, min_value: float = 0.0):
        super().__init__(root_token, order, budget, max_depth)
        self.min_value = min_value

    def _push(self, node: int, rank: int) -> None:
        ranked = self._sorted[node]
        if rank >= len(ranked) or float(ranked[rank]) <= 0.0:
            return
        key = self.values[node] * float(ranked[rank])
        if key < self.min_value:  # token-free too: a candidate worth less than min_value is never tried
            return
        heapq.heappush(self._heap, (-key, next(self._tie), node, rank))


def sparse_order(builder: trees.TreeBuilder, node: int, law, width: int, *, seed: int, sample: int,
                 root_position: int, sampled: bool) -> torch.Tensor:
    """A node's children in draw order: Gumbel-top-k over the law's support with noise keyed as
    `trees.keyed_order` keys it (so a dense law gives the same draws), or its most probable tokens."""
    if isinstance(law, torch.Tensor):  # a dense law (tests)
        siblings = "without_replacement" if sampled else "deterministic"
        return trees.keyed_order(builder, node, law, width, seed=seed, sample=sample, root_position=root_position,
                                 siblings=siblings)
    if len(law) == 0:
        return law.tokens
    if not sampled:
        return law.tokens[trees.top_order(law.probs, width)]
    path, n = [], node
    while n > 0:
        path.append(builder.tokens[n])
        n = builder.parents[n]
    key = trees.node_key(sample, root_position, [builder.tokens[0], *reversed(path)])
    exponential = counter_exponential(seed, key, root_position + len(path) + 1, Purpose.DRAFT_GUMBEL, law.tokens)
    return law.tokens[trees.gumbel_order(law.probs, exponential, width)]


class StandDrafter:
    """`stand`. vocab: the target's vocabulary size; processing: the request's (greedy: deterministic children)."""

    def __init__(self, vocab: int, processing: Processing, *, tree_budget: int = 8, max_depth: int = 6,
                 max_ngram: int = 4, top_k: int = 8, share: str = "samples", min_value: float = 0.0):
        if tree_budget < 1 or max_depth < 1:
            raise InvalidRequest(f"need tree_budget >= 1 and max_depth >= 1, got {tree_budget} and {max_depth}")
        if share not in ("samples", "none"):
            raise InvalidRequest(f"share must be 'samples' or 'none', got {share!r}")
        self.vocab, self.tree_budget, self.max_depth = vocab, tree_budget, max_depth
        self.max_ngram, self.top_k, self.share, self.min_value = max_ngram, top_k, share, min_value
        self.sampled = not processing.greedy
        self.siblings = "without_replacement" if self.sampled else "deterministic"
        self.stores: dict[object, LawStore] = {}
        self._seeded_samples: set[int] = set()
        self._seeded_texts: set[tuple] = set()
        self._last: tuple[DecodeContext, DraftTree | Draft] | None = None
        self.drafted_nodes = 0
        self.steps = 0

    def store_for(self, sample: int) -> LawStore:
        key = "shared" if self.share == "samples" else sample
        if key not in self.stores:
            self.stores[key] = LawStore(self.vocab, self.max_ngram, self.top_k)
        return self.stores[key]

    def _seed(self, sample: int, context: list[int]) -> None:
        """The prompt's n-grams enter the store once per sample (once per prompt text when samples share it)."""
        if sample in self._seeded_samples:
            return
        self._seeded_samples.add(sample)
        key = tuple(context) if self.share == "samples" else (sample, tuple(context))
        if key not in self._seeded_texts:
            self._seeded_texts.add(key)
            self.store_for(sample).add_text(context)

    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree | Draft:
        builders = []
        for i, tokens in enumerate(ctx.tokens):
            context, sample = tokens.tolist(), int(ctx.sample_ids[i])
            self._seed(sample, context)
            store, root_position, holder = self.store_for(sample), len(context) - 1, []

            def order(node, law, width, holder=holder, sample=sample, root_position=root_position):
                return sparse_order(holder[0], node, law, width, seed=ctx.seed, sample=sample,
                                    root_position=root_position, sampled=self.sampled)

            builder = StandBuilder(context[-1], order, self.tree_budget, min(self.max_depth, max(1, budget)),
                                   self.min_value)
            holder.append(builder)

            def laws_for(requests, builder=builder, context=context, store=store):
                empty = SparseLaw([], [], self.vocab)
                return [{node: store.law(context + builder.path(node)) or empty for node in requests[0]}]

            trees.run_builders([builder], laws_for)
            builders.append(builder)
        drafted = any(len(b.tokens) > 1 for b in builders)
        tree = tree_from_builders(builders, self.vocab, self.sampled) if drafted else None
        proposal = tree if tree is not None else Draft.empty(len(ctx.tokens))
        self._last = (ctx, proposal)
        self.steps += len(builders)
        self.drafted_nodes += 0 if tree is None else sum(len(b.tokens) - 1 for b in builders)
        return proposal

    def observe(self, verdict: Verdict) -> None:
        """Store the target's law at every committed position of the step (the accepted path and the emit slot)."""
        last, self._last = self._last, None
        if last is None or verdict.target_probs is None:
            return
        ctx, proposal = last
        observe_laws(verdict, ctx, proposal, lambda i: self.store_for(int(ctx.sample_ids[i])))

    def run_summary(self) -> dict:
        entries = sum(len(s.table) for s in self.stores.values())
        return {"store_keys": entries, "drafted_nodes_per_row_step": self.drafted_nodes / max(self.steps, 1)}


def observe_laws(verdict: Verdict, ctx: DecodeContext, proposal, store_of) -> None:
    """For each row i: the target's law at each node of the accepted path (for a chain: each accepted slot and the
    emit slot) goes into store_of(i) under the committed context it follows."""
    probs = verdict.target_probs
    for i, tokens in enumerate(ctx.tokens):
        context = tokens.tolist()
        if isinstance(proposal, DraftTree):
            path = [n for n in verdict.accepted_path[i].tolist() if n >= 0]
            node_tokens = proposal.tokens[i]
        else:
            path = list(range(int(verdict.num_accepted[i]) + 1))
            node_tokens = torch.cat([tokens[-1:], proposal.tokens[i]])
        laws = probs[i, path]
        store = store_of(i)
        for j, node in enumerate(path):
            if j:
                context.append(int(node_tokens[node]))
            store.add_law(context, laws[j])
