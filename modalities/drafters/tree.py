"""Draft trees from any transformers draft model: static shapes (Sequoia's DP, EAGLE/Medusa trees), DySpec's
best-first expansion and EAGLE-2's expand-and-rerank, all built by the row-wise builders of
`specgen.samplers.trees` and batched over rows.

The drafter keeps a position-indexed cache of the committed context (the pending token included, fed at the
catch-up, so the root's law comes with it). Each later round scores every non-root node of every row's tree so
far in one forward with the ancestor mask (nodes attend to the cached context and to their ancestors) and
commits nothing: the next round and the next step overwrite those slots. Rows that need no law this round sit
the forward out; rows whose trees end up smaller than the others' are padded with harmless nodes.

Children are drawn as the verification rule requires:
- temperature > 0, static and DySpec: without replacement from the draft law (Gumbel-top-k with counter-based
  noise keyed by sample, position and the node's token path, so every node has its own independent draws);
  the DraftTree stores each node's law; verify with TreeRejection("without_replacement").
- temperature 0, and EAGLE-2 at any temperature: the draft's most probable tokens, ranked by its softmax at
  temperature 1 (greedy processing would leave one candidate); verify with TreeRejection("deterministic"),
  which at temperature 0 is greedy matching along the tree.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import torch

from specgen.errors import InvalidRequest
from specgen.modalities.drafters.model import ModelDrafter
from specgen.samplers import trees
from specgen.samplers.processing import Processing
from specgen.samplers.types import DecodeContext, DraftTree

CONSTRUCTIONS = ("static", "dyspec", "eagle2")
class TreeDrafter(ModelDrafter):
    """construction: 'static' (shape: a parent array), 'dyspec' (budget, max_depth, per_round) or 'eagle2' (budget,
    top_k, depth). `budget` counts drafted nodes (the root excluded). `rank_temperature`: at temperature 0, the
    temperature of the draft law whose probabilities rank candidate nodes (a small draft's plain softmax is less
    sure than its greedy agreement with the target: sharpening it grows DySpec's trees along the likely path).
    `per_round`: the most nodes DySpec adds per draft forward past a node whose law is still unknown (None or 0:
    one per 16 nodes of the budget, so up to 16 nodes the tree is exactly best-first)."""

    def __init__(self, model, processing: Processing, *, construction: str = "static", shape: Sequence[int] | None = None,
                 budget: int = 16, max_depth: int | None = None, top_k: int = 4, depth: int = 5,
                 rank_temperature: float = 1.0, per_round: int | None = None,
                 target_vocab_size: int | None = None, capacity: int | None = None):
        # trees occupy cache slots beyond their positions: leave room for the widest scored tree after a full context
        slack = 2 * (budget + top_k * depth + (len(shape) if shape is not None else 0) + 1)
        capacity = capacity or getattr(model.config, "max_position_embeddings", 2048) + slack
        super().__init__(model, processing, target_vocab_size=target_vocab_size, capacity=capacity)
        if construction not in CONSTRUCTIONS:
            raise InvalidRequest(f"unknown tree construction {construction!r}; choose from {', '.join(CONSTRUCTIONS)}")
        if construction == "static" and shape is None:
            raise InvalidRequest("a static tree needs a shape (parent array)")
        if budget < 1:
            raise InvalidRequest(f"tree budget must be >= 1, got {budget}")
        if rank_temperature <= 0 or (per_round is not None and per_round < 0):
            raise InvalidRequest(f"need rank_temperature > 0 and per_round >= 0, got {rank_temperature} and {per_round}")
        self.construction, self.budget, self.max_depth, self.top_k, self.depth = (
            construction, budget, max_depth, top_k, depth)
        self.per_round = per_round or -(-budget // 16)
        self.shape = None if shape is None else list(shape)
        sampled = not processing.greedy and construction != "eagle2"
        self.siblings = "without_replacement" if sampled else "deterministic"
        # the law that ranks candidates: the draft's own processing when it samples (keys stay token-free), else its
        # softmax at rank_temperature (any ranking is exact under greedy tree matching)
        self.rank_processing = processing if not processing.greedy else Processing(temperature=rank_temperature)

    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree:
        rows = ctx.rows
        if not self.cached or self.engine.cache is None or len(self.cached) <= int(rows.max()):
            self._reset(int(rows.max()) + 1)
        tokens, counts = self._catch_up(ctx)  # includes the pending token (the root)
        start = ctx.next_positions[:, None] - counts[:, None] + torch.arange(tokens.shape[1])
        logits = self.engine.score(tokens, start, rows)
        self.forward_calls += 1
        self.engine.commit(torch.arange(tokens.shape[1]) < counts[:, None], rows)
        for i, row in enumerate(rows.tolist()):
            self.cached[row] = ctx.tokens[i].tolist()
        root_laws = self.rank_processing(logits[torch.arange(len(rows)), counts - 1])  # [rows, vocab]
        builders = [self._builder(ctx, i, budget) for i in range(len(rows))]

        score = lambda later, wanted: self._score_trees(ctx, [builders[i] for i in later], later, wanted)  # noqa: E731
        trees.run_builders(builders, trees.laws_with_root(root_laws, score))
        return self._as_tree(builders)

    def _builder(self, ctx: DecodeContext, i: int, budget: int) -> trees.TreeBuilder:
        root_position = int(ctx.next_positions[i]) - 1
        sample = int(ctx.sample_ids[i])
        root = int(ctx.tokens[i][-1])
        holder: list[trees.TreeBuilder] = []

        def order(node: int, law: torch.Tensor, width: int) -> torch.Tensor:
            return trees.keyed_order(holder[0], node, law, width, seed=ctx.seed, sample=sample,
                                     root_position=root_position, siblings=self.siblings)

        depth_cap = max(1, budget)
        if self.construction == "static":
            builder = trees.StaticBuilder(root, order, trees.truncated_shape(self.shape, depth_cap))
        elif self.construction == "dyspec":
            max_depth = depth_cap if self.max_depth is None else min(self.max_depth, depth_cap)
            # DySpec expands every node added since the last draft forward, up to per_round past an unknown law
            builder = trees.DySpecBuilder(root, order, self.budget, max_depth, per_round=self.per_round)
        else:
            # a node deeper than the budget cannot be among the budget best (its ancestors score at least as high)
            builder = trees.Eagle2Builder(root, order, self.budget, self.top_k, min(self.depth, depth_cap, self.budget))
        holder.append(builder)
        return builder

    @property
    def max_nodes(self) -> int:
        """The most nodes a proposed tree can have (the target needs that many free cache slots)."""
        return max_nodes(self.construction, self.shape, self.budget, self.depth)

    def _score_trees(self, ctx: DecodeContext, builders: list[trees.TreeBuilder], index: list[int],
                     requests: list[list[int]]) -> list[dict]:
        """Laws at the requested nodes of the given rows' trees, from one forward over the requested nodes and
        their ancestors (the root excluded: it is in the cache and every node sees it)."""
        subsets, parents = trees.scored_subtrees(builders, requests)
        tokens = torch.zeros(len(builders), parents.shape[1] - 1, dtype=torch.long)
        for j, (b, subset) in enumerate(zip(builders, subsets)):
            tokens[j, :len(subset)] = torch.tensor([b.tokens[n] for n in subset])
        mask = trees_ancestor_mask(parents)[:, 1:, 1:]
        depths = mask.sum(-1)  # depth of each non-root node (>= 1); padding slots see only themselves
        positions = (ctx.next_positions[index] - 1)[:, None] + depths
        logits = self.engine.score(tokens, positions, ctx.rows[index], mask)
        self.forward_calls += 1
        laws = self.rank_processing(logits)
        return [{node: laws[j, subset.index(node)] for node in wanted}
                for j, (subset, wanted) in enumerate(zip(subsets, requests))]

    def _as_tree(self, builders: list[trees.TreeBuilder]) -> DraftTree:
        return tree_from_builders(builders, self.engine.vocab_size, self.siblings == "without_replacement")


def tree_from_builders(builders: list[trees.TreeBuilder], vocab: int, with_laws: bool) -> DraftTree:
    """The rows' built trees as one DraftTree (`pad_trees`); `with_laws` stores each node's law (for children
    drawn without replacement)."""
    return pad_trees([b.tokens for b in builders], [b.parents for b in builders],
                     [b.laws for b in builders] if with_laws else None, vocab)


def pad_trees(tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]],
              laws: Sequence[Sequence] | None = None, vocab: int | None = None) -> DraftTree:
    """Several rows' trees (node 0 the root, parent -1) as one DraftTree, smaller trees padded to the largest.
    `laws`: each node's draft law, None (not drafted from a law), a dense [vocab] tensor, or a sparse law that
    writes itself into a dense row (`write_into`)."""
    size = max(len(row) for row in tokens)
    out_tokens = torch.zeros(len(tokens), size, dtype=torch.long)
    out_parents = torch.zeros(len(tokens), size, dtype=torch.long)
    probs = torch.zeros(len(tokens), size, vocab) if laws is not None else None
    for j, (row_tokens, row_parents) in enumerate(zip(tokens, parents)):
        # padding repeats the root's first child, tried last among the root's children: after that child was
        # rejected it has draft and target probability 0, so it is never accepted
        filler = row_tokens[1] if len(row_tokens) > 1 else row_tokens[0]
        out_tokens[j] = torch.tensor(list(row_tokens) + [filler] * (size - len(row_tokens)))
        out_parents[j] = torch.tensor(list(row_parents) + [0] * (size - len(row_parents)))
        if probs is not None:
            for node, law in enumerate(laws[j]):
                if isinstance(law, torch.Tensor):
                    probs[j, node] = law
                elif law is not None:
                    law.write_into(probs[j, node])
    return DraftTree(out_tokens, out_parents, probs)


def trees_ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    from specgen.kernels import ancestor_mask

    return ancestor_mask(parents)


def parse_accept_probs(text: str) -> list[float]:
    try:
        probs = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise InvalidRequest(f"accept_probs must be comma-separated numbers, got {text!r}") from None
    if not probs or any(p < 0 for p in probs) or sum(probs) > 1 + 1e-9:
        raise InvalidRequest(f"accept_probs must be non-negative numbers summing to at most 1, got {text!r}")
    return probs


def tree_shape(knobs: dict) -> list[int]:
    """The static shape a `sequoia` request asks for: Sequoia's DP tree, or a named shape."""
    if knobs.get("shape", "dp") == "dp":
        return list(_dp_shape(str(knobs["accept_probs"]), knobs["tree_budget"], knobs["max_depth"]))
    return trees.named_shape(knobs["shape"])


@lru_cache(maxsize=64)
def _dp_shape(accept_probs: str, budget: int, max_depth: int | None) -> tuple[int, ...]:
    # the DP over a 16-node budget takes 5 ms, and every request builds its drafter (auto: every candidate's)
    return tuple(trees.sequoia_tree(parse_accept_probs(accept_probs), budget, max_depth))


def max_nodes(construction: str, shape: list[int] | None, budget: int, depth: int | None) -> int:
    """The most nodes a tree of this construction proposes: its static shape, or the budget, the root and, for
    EAGLE-2, the last level's candidates beyond the budget."""
    if construction == "static":
        return len(shape)
    return budget + 1 + (depth if construction == "eagle2" else 0)


def tree_room(kind: str, knobs: dict) -> int:
    """`max_nodes` of the drafter `tree_drafter(kind, ..., knobs)` builds, known before it is built (the target's
    cache is sized first)."""
    construction = kind.removeprefix("tree-")
    shape = tree_shape(knobs) if construction == "static" else None
    return max_nodes(construction, shape, knobs.get("tree_budget", 0), knobs.get("depth"))


def tree_drafter(kind: str, model, processing: Processing, knobs: dict, **options) -> TreeDrafter:
    """The drafter of a registry drafter key ('tree-static', 'tree-dyspec', 'tree-eagle2') with its knobs."""
    if kind == "tree-static":
        shape = tree_shape(knobs)
        return TreeDrafter(model, processing, construction="static", shape=shape, budget=len(shape) - 1, **options)
    if kind == "tree-dyspec":
        return TreeDrafter(model, processing, construction="dyspec", budget=knobs["tree_budget"],
                           max_depth=knobs["max_depth"], rank_temperature=knobs["rank_temperature"],
                           per_round=knobs["per_round"], **options)
    if kind == "tree-eagle2":
        return TreeDrafter(model, processing, construction="eagle2", budget=knobs["tree_budget"],
                           top_k=knobs["expand_top_k"], depth=knobs["depth"], **options)
    raise InvalidRequest(f"unknown tree drafter {kind!r}")


def acceptance_by_rank(target_model, draft_model, prompts: Sequence[torch.Tensor], *, width: int = 8,
                       temperature: float = 0.0, max_new_tokens: int = 64, seed: int = 0) -> dict:
    """Sequoia's calibration: decode with a one-level tree of `width` children (drawn without replacement, or the
    draft's top candidates at temperature 0) and count at which sibling rank the accepted child sits.
    Returns {"accept_probs": P(rank r accepted) for r = 1..width, "steps", "accepted_by_rank"}."""
    from specgen.modalities.runtime.transformers_adapter import TransformersTarget
    from specgen.samplers.acceptance import TreeRejection
    from specgen.samplers.loop import speculative_generate
    from specgen.samplers.length_policies import FixedLength

    processing = Processing(temperature=temperature)
    shape = [-1] + [0] * width
    drafter = TreeDrafter(draft_model, processing, construction="static", shape=shape, budget=width,
                          target_vocab_size=target_model.config.vocab_size)
    counts, steps = [0] * width, [0]

    class Recording(TreeRejection):
        def __call__(self, tree, target_probs, noise):
            verdict = super().__call__(tree, target_probs, noise)
            if not isinstance(tree, DraftTree):  # the last step of a run drafts nothing
                return verdict
            ranks = tree.sibling_rank
            for row, path in enumerate(verdict.accepted_path.tolist()):
                steps[0] += 1
                if len(path) > 1 and path[1] > 0:
                    counts[int(ranks[row, path[1]])] += 1
            return verdict

    capacity = getattr(target_model.config, "max_position_embeddings", 2048)
    for prompt in prompts:
        target = TransformersTarget(target_model, capacity + width + 1, decode_kernel=True)  # as text serves it
        for _ in speculative_generate(target, drafter, Recording(drafter.siblings), [prompt], processing=processing,
                                      max_new_tokens=max_new_tokens, policy=FixedLength(1), seed=seed):
            pass
    total = max(steps[0], 1)
    return {"accept_probs": [c / total for c in counts], "steps": steps[0], "accepted_by_rank": counts}


class StoppingModelDrafter(ModelDrafter):
    """A chain `ModelDrafter` that asks a length policy, before each drafted token after the first, whether a row
    stops there (`policy.stop(law, previous_law, index)`: SVIP's entropy rule, Kangaroo's confidence rule). The
    laws shown to the policy are the draft's softmax at temperature 1. Rows that stop keep drafting in the batch
    (their extra tokens are not proposed: `num_drafted` is per row) until every row has stopped."""

    def __init__(self, model, processing: Processing, policy, **options):
        super().__init__(model, processing, stop_policy=policy, **options)
        self.policy = policy
