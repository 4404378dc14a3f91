"""EAGLE-2's dynamic tree (Li et al. 2024, arXiv 2406.16858) from a feature head: `eagle2` with `head` 'eagle' or
'mtp' (with 'model', the draft model's tree: modalities/drafters/tree.py; both grow it with `trees.Eagle2Builder`).

The head's cache holds the committed context's true pairs, as for its chain (`EagleDrafter.begin`), and the
pending token's predicted feature gives the root's law. Each round scores the frontier: a node's pair is (its
token, its parent's predicted feature), at position root + depth, and one head forward over the frontier and its
ancestors with the ancestor mask (a node sees the cached pairs and its ancestors' pairs) gives each node's
predicted feature, hence its law through the output rows. Nothing is committed: the next round and the next step
overwrite those slots, so only true pairs persist.

Candidates are the head's most probable tokens under its temperature-1 law over the kept rows (a token outside
them is never proposed); verification is the deterministic tree rule (greedy matching at temperature 0), exact at
any temperature because deterministic candidates carry no draft law to correct for.
"""

from __future__ import annotations

import torch

from specgen.errors import InvalidRequest
from specgen.kernels import ancestor_mask
from specgen.modalities.drafters.eagle import EagleDrafter
from specgen.modalities.drafters.tree import max_nodes, pad_trees
from specgen.samplers import trees
from specgen.samplers.processing import Processing
from specgen.samplers.types import DecodeContext, DraftTree

HEADS = ("eagle", "mtp")


class HeadTreeDrafter:
    """EAGLE-2's tree from the head of a chain drafter (`EagleDrafter`: its cache, feature store and output rows)."""

    def __init__(self, chain: EagleDrafter, *, budget: int, top_k: int, depth: int):
        if budget < 1 or top_k < 1 or depth < 1:
            raise InvalidRequest(f"a tree needs tree_budget, expand_top_k and depth >= 1, got {budget}, {top_k}, "
                                 f"{depth}")
        self.chain, self.budget, self.top_k, self.depth = chain, budget, top_k, depth
        self.rank_processing = Processing(temperature=1.0)  # ranks candidates; any ranking is exact
        self.siblings = "deterministic"

    @property
    def max_nodes(self) -> int:
        return max_nodes("eagle2", None, self.budget, self.depth)

    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree:
        chain = self.chain
        root_features = chain.begin(ctx)  # [rows, d]
        root_laws = self.rank_processing(chain._logits(root_features))  # [rows, kept]
        depth = min(self.depth, max(1, budget), self.budget)  # a node deeper than the budget is never kept
        builders = [trees.Eagle2Builder(int(ctx.tokens[i][-1]), lambda node, law, width: trees.top_order(law, width),
                                        self.budget, self.top_k, depth) for i in range(len(ctx.rows))]
        features = [{0: root_features[i]} for i in range(len(ctx.rows))]  # per row: node -> predicted feature

        def score(index: list[int], requests: list[list[int]]) -> list[dict]:
            return self._score(ctx, [builders[i] for i in index], [features[i] for i in index], index, requests)

        trees.run_builders(builders, trees.laws_with_root(root_laws, score))
        tokens = [[b.tokens[0], *self._target_ids(b.tokens[1:])] for b in builders]
        return pad_trees(tokens, [b.parents for b in builders])

    def _target_ids(self, indices: list[int]) -> list[int]:
        ids = self.chain.vocab_ids
        return list(indices) if ids is None else ids[torch.tensor(indices, dtype=torch.long)].tolist()

    def _score(self, ctx: DecodeContext, builders, features, index: list[int], requests: list[list[int]]):
        """Laws at the requested nodes of the given rows' trees from one head forward over those nodes and their
        ancestors (the root excluded: its pair is in the cache); each scored node's predicted feature is kept for
        its children's pairs."""
        chain = self.chain
        subsets, parents = trees.scored_subtrees(builders, requests)
        inputs = torch.zeros(len(builders), parents.shape[1] - 1, chain.token_fc.shape[0])
        for j, (b, subset, known) in enumerate(zip(builders, subsets, features)):
            tokens = torch.tensor(self._target_ids([b.tokens[n] for n in subset]))
            inputs[j, :len(subset)] = chain._pairs(tokens, self._read_features(known, [b.parents[n] for n in subset]))
        mask = ancestor_mask(parents)[:, 1:, 1:]  # [rows, width, width]; padding slots see only themselves
        positions = (ctx.next_positions[index] - 1)[:, None] + mask.sum(-1)  # root position + depth
        hidden = chain.engines[0].score(inputs, positions, ctx.rows[index], mask)  # [rows, width, d]
        chain.forward_calls += 1
        out = []
        for j, (subset, wanted, known) in enumerate(zip(subsets, requests, features)):
            slots = torch.tensor([subset.index(node) for node in wanted])
            for node, slot in zip(wanted, slots.tolist()):
                known[node] = hidden[j, slot]
            laws = self.rank_processing(chain._logits(hidden[j, slots]))
            out.append(dict(zip(wanted, laws)))
        return out

    @staticmethod
    def _read_features(known: dict, nodes: list[int]) -> torch.Tensor:
        """[len(nodes), d] the predicted features of `nodes` (a child's pair reads its parent's)."""
        return torch.stack([known[n] for n in nodes])

    def observe(self, verdict) -> None:
        pass

    def run_summary(self) -> dict:
        return self.chain.run_summary()


def build_drafter(generator, knobs: dict, processing: Processing, policy, engine) -> HeadTreeDrafter:
    """`eagle2` over the target's trained head `knobs['head']` ('eagle' or 'mtp')."""
    head = knobs["head"]
    if head == "eagle":
        from specgen.modalities.drafters.eagle import build_drafter as build_chain
    elif head == "mtp":
        from specgen.modalities.drafters.mtp import build_drafter as build_chain
    else:
        raise InvalidRequest(f"eagle2's head must be 'model' or one of {', '.join(HEADS)}, got {head!r}")
    chain = build_chain(generator, knobs, processing, policy, engine)
    return HeadTreeDrafter(chain, budget=knobs["tree_budget"], top_k=knobs["expand_top_k"], depth=knobs["depth"])
