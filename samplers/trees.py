"""Draft-tree shapes and draft-tree construction, shared by the toy oracle and the model tree drafter.

Shapes (Sequoia, EAGLE, Medusa): a tree is a parent array in topological order, node 0 the root (the pending
token); siblings are ranked by node order. Under the positional-acceptance assumption (a child is accepted with
a probability that depends only on its rank among its siblings: `accept_probs[r]` for rank r, counted from 0),
the expected number of committed tokens per step is F(T) = sum over nodes v of prod over the path to v of
accept_probs[rank(u)] (the root counts 1: the bonus or recovered token). `sequoia_tree` maximises F for a node
budget and an optional depth limit (Sequoia's dynamic program, Chen et al. 2024, arXiv 2402.12374).

Construction (`StaticBuilder`, `DySpecBuilder`, `Eagle2Builder`): one object per row that asks for the draft's
law at the nodes it adds and, from the laws and an ordering of each node's candidate children, decides the
tree. The orderings come from the caller: Gumbel-top-k with counter-based noise per node (children drawn
without replacement; verify with TreeRejection("without_replacement")), the draft's top candidates (verify
with TreeRejection("deterministic")), or the exact oracle, which enumerates every ordering.

Exactness. The without-replacement rule is exact when, at every node, the decision to try one more child is
taken before that child is drawn: it may depend on everything drawn so far (earlier siblings, other branches,
draft laws) but not on the child's own token. Static shapes satisfy it trivially; DySpec's best-first search
satisfies it because an undrawn sibling is ranked by a token-free key (the parent's value times the law's r-th
largest probability) and only a drawn node's own value uses its token. EAGLE-2's final re-ranking keeps or
drops a node on its own score, which the without-replacement rule does not allow; EAGLE verifies its
candidates with the deterministic rule (probability 1 per candidate), which is exact for any candidate set, and
so does `Eagle2Builder` at every temperature. The oracle tests in tests/samplers/test_trees.py enumerate all
three and show a token-dependent DySpec key failing.
"""

from __future__ import annotations

import heapq
import itertools
from functools import lru_cache
from typing import Callable, Sequence

import torch

from specgen.errors import InvalidRequest
from specgen.samplers.noise import Purpose, counter_exponential

# ---- shapes ---------------------------------------------------------------------------------------------------

# EAGLE's default static tree (`model/choices.py`, SafeAILab/EAGLE): root-to-node paths of sibling ranks.
EAGLE_MC_SIM_7B_63 = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
                      [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
                      [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
# Medusa's 63-node tree of the same name (`medusa/model/medusa_choices.py`, FasterDecoding/Medusa).
MEDUSA_MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0],
                       [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2],
                       [3, 0], [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4],
                       [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7],
                       [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2],
                       [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6],
                       [0, 7, 0]]


def shape_from_paths(paths: Sequence[Sequence[int]]) -> list[int]:
    """Parent array (breadth-first, siblings by rank) of the tree whose non-root nodes are the given rank paths
    (EAGLE/Medusa "choices"); every prefix of a path must be a path too."""
    paths = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
    index = {(): 0}
    parents = [-1]
    for path in paths:
        if not path or path[:-1] not in index:
            raise InvalidRequest(f"tree path {list(path)} has no parent path")
        if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in index:
            raise InvalidRequest(f"tree path {list(path)} skips a sibling rank")
        index[path] = len(parents)
        parents.append(index[path[:-1]])
    return parents


def chain_shape(nodes: int) -> list[int]:
    """A chain of `nodes` drafted tokens."""
    return list(range(-1, nodes))


def k_ary_shape(width: int, depth: int) -> list[int]:
    """Every node down to `depth` gets `width` children (SpecInfer-style full tree)."""
    return shape_from_paths([p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)])


def named_shape(name: str) -> list[int]:
    """'eagle' / 'medusa' (the mc_sim_7b_63 trees), 'chain-N', 'k-ary-WxD' (width x depth)."""
    if name in ("eagle", "eagle-mc_sim_7b_63"):
        return shape_from_paths(EAGLE_MC_SIM_7B_63)
    if name in ("medusa", "medusa-mc_sim_7b_63"):
        return shape_from_paths(MEDUSA_MC_SIM_7B_63)
    try:
        if name.startswith("chain-"):
            return chain_shape(int(name[6:]))
        if name.startswith("k-ary-"):
            width, depth = name[6:].split("x")
            return k_ary_shape(int(width), int(depth))
    except ValueError:
        pass
    raise InvalidRequest(f"unknown tree shape {name!r}; use 'dp', 'eagle', 'medusa', 'chain-N' or 'k-ary-WxD'")


def truncated_shape(shape: Sequence[int], max_depth: int) -> list[int]:
    """The parent array of `shape` without its nodes deeper than max_depth (the rest renumbered in order)."""
    depths = depths_of(shape)
    keep = [n for n in range(len(shape)) if depths[n] <= max_depth]
    new = {old: i for i, old in enumerate(keep)}
    return [-1] + [new[shape[n]] for n in keep[1:]]


def sibling_ranks(parents: Sequence[int]) -> list[int]:
    seen: dict[int, int] = {}
    ranks = [0]
    for parent in parents[1:]:
        ranks.append(seen.get(parent, 0))
        seen[parent] = ranks[-1] + 1
    return ranks


def depths_of(parents: Sequence[int]) -> list[int]:
    depths = [0]
    for parent in parents[1:]:
        depths.append(depths[parent] + 1)
    return depths


def expected_accepted(parents: Sequence[int], accept_probs: Sequence[float]) -> float:
    """F(T): expected committed tokens per step under positional acceptance (root included)."""
    ranks, reach = sibling_ranks(parents), [1.0]
    for node in range(1, len(parents)):
        p = accept_probs[ranks[node]] if ranks[node] < len(accept_probs) else 0.0
        reach.append(reach[parents[node]] * p)
    return sum(reach)


def _check_accept_probs(accept_probs: Sequence[float]) -> tuple[float, ...]:
    probs = tuple(float(p) for p in accept_probs)
    if not probs or any(p < 0 for p in probs) or sum(probs) > 1 + 1e-9:
        raise InvalidRequest("accept_probs must be non-negative with sum <= 1 (P(the r-th child is the accepted one))")
    return probs


def sequoia_tree(accept_probs: Sequence[float], budget: int, max_depth: int | None = None) -> list[int]:
    """The tree with at most `budget` drafted nodes (root excluded) and depth <= max_depth that maximises
    `expected_accepted` (Sequoia's DP). best(m, l) = 1 + R(m - 1, l, 0): a root and m - 1 nodes shared among its
    children of ranks 0, 1, ...; R(n, l, r) = max over the size s of the rank-r subtree of
    accept_probs[r] * best(s, l - 1) + R(n - s, l, r + 1). Returns a breadth-first parent array."""
    probs = _check_accept_probs(accept_probs)
    if budget < 0:
        raise InvalidRequest(f"tree budget must be >= 0, got {budget}")
    limit = budget if max_depth is None else min(max_depth, budget)
    neg = float("-inf")

    @lru_cache(maxsize=None)
    def best(m: int, depth: int) -> float:
        if m == 1:
            return 1.0
        if depth == 0:
            return neg
        return 1.0 + share(m - 1, depth, 0)[0]

    @lru_cache(maxsize=None)
    def share(n: int, depth: int, rank: int) -> tuple[float, int]:
        """(best value, size of the rank-`rank` subtree) for n nodes among children rank.. of one node."""
        if n == 0:
            return 0.0, 0
        if rank >= len(probs) or probs[rank] == 0:
            return neg, 0
        choice = (neg, 0)
        for size in range(1, n + 1):
            value = probs[rank] * best(size, depth - 1) + share(n - size, depth, rank + 1)[0]
            if value > choice[0] + 1e-15:
                choice = (value, size)
        return choice

    # the best size <= budget (sizes past the useful ranks and depth are infeasible)
    m = max(range(1, budget + 2), key=lambda size: (best(size, limit), -size))

    def subtree_sizes(n: int, depth: int) -> list[int]:
        sizes, rank = [], 0
        while n > 0:
            size = share(n, depth, rank)[1]
            sizes.append(size)
            n -= size
            rank += 1
        return sizes

    # breadth-first emission: a queue of (node id, subtree size, depth left)
    parents, queue = [-1], [(0, m, limit)]
    while queue:
        node, size, depth = queue.pop(0)
        for child_size in subtree_sizes(size - 1, depth):
            parents.append(node)
            queue.append((len(parents) - 1, child_size, depth - 1))
    return parents


def best_first_tree(accept_probs: Sequence[float], budget: int) -> list[int]:
    """Top-`budget` nodes by path product of accept_probs (DySpec's objective on a static vector); with no depth
    limit it reaches the DP's optimum."""
    probs = _check_accept_probs(accept_probs)
    parents, heap, counter = [-1], [], itertools.count()
    heapq.heappush(heap, (-probs[0], next(counter), 0, 0, 1.0))  # (-value, tie, parent, rank, parent value)
    while len(parents) <= budget and heap:
        neg_value, _, parent, rank, parent_value = heapq.heappop(heap)
        parents.append(parent)
        node = len(parents) - 1
        if rank + 1 < len(probs):
            heapq.heappush(heap, (-parent_value * probs[rank + 1], next(counter), parent, rank + 1, parent_value))
        heapq.heappush(heap, (neg_value * probs[0], next(counter), node, 0, -neg_value))
    return _breadth_first(parents)


def _breadth_first(parents: list[int]) -> list[int]:
    """Renumber a topological parent array breadth-first (siblings keep their order)."""
    depths = depths_of(parents)
    order = sorted(range(len(parents)), key=lambda n: (depths[n], n))
    new = {old: i for i, old in enumerate(order)}
    return [-1] + [new[parents[old]] for old in order[1:]]


# ---- construction ---------------------------------------------------------------------------------------------

# order(node, law, width) -> 1-D int64 tensor: the first `width` children of `node` in draw order
Order = Callable[[int, torch.Tensor, int], torch.Tensor]


class TreeBuilder:
    """One row's tree under construction. `start()` and `step(laws)` return the node ids whose draft law the
    builder needs next (empty list: done); `laws` maps node id -> [vocab] law. `tokens`, `parents` and `laws`
    (one per node; None where never asked) describe the tree."""

    def __init__(self, root_token: int, order: Order):
        self.tokens, self.parents, self.laws = [int(root_token)], [-1], [None]
        self.order = order
        self._orders: dict[int, torch.Tensor] = {}

    def path(self, node: int) -> list[int]:
        """Tokens from the root's first child down to `node` (the root itself excluded)."""
        path = []
        while node > 0:
            path.append(self.tokens[node])
            node = self.parents[node]
        return path[::-1]

    def add(self, parent: int, token: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.laws.append(None)
        return len(self.tokens) - 1

    def child_token(self, node: int, rank: int, width: int) -> int:
        if node not in self._orders:
            self._orders[node] = self.order(node, self.laws[node], width)
        return int(self._orders[node][rank])

    def start(self) -> list[int]:
        return [0]

    def step(self, laws: dict[int, torch.Tensor]) -> list[int]:
        raise NotImplementedError

    def _store(self, laws: dict[int, torch.Tensor]) -> None:
        for node, law in laws.items():
            self.laws[node] = law


class StaticBuilder(TreeBuilder):
    """A fixed shape: every node gets its children of the shape, the first ones of its ordering."""

    def __init__(self, root_token: int, order: Order, shape: Sequence[int]):
        super().__init__(root_token, order)
        self.shape = list(shape)
        self.kids = [[] for _ in self.shape]
        for node, parent in enumerate(self.shape[1:], start=1):
            self.kids[parent].append(node)
        self._map = {0: 0}  # shape node -> built node
        self._level = [0]

    def step(self, laws):
        self._store(laws)
        next_level = []
        for shape_node in self._level:
            built = self._map[shape_node]
            width = len(self.kids[shape_node])
            for rank, kid in enumerate(self.kids[shape_node]):
                self._map[kid] = self.add(built, self.child_token(built, rank, width))
                next_level.append(kid)
        self._level = [n for n in next_level if self.kids[n]]  # only nodes with children need a law
        return [self._map[n] for n in self._level]


class DySpecBuilder(TreeBuilder):
    """Greedy best-first expansion by path value under a node budget (DySpec, Xiong et al., arXiv 2410.11744).

    A drawn node's value is V(parent) * law_parent(token); the candidate "next child of u at rank r" waits in a
    max-heap under the token-free key V(u) * (r-th largest probability of law_u). Candidates are popped while
    their key is at least the value of every node whose law is still unknown (its children's keys cannot exceed
    its value), so batching the draft forwards per round gives exactly the sequential best-first tree.
    `per_round` > 1 keeps popping (up to that many nodes per round) past the point where a node's law is missing,
    as DySpec batches the expansion: fewer draft forwards, a tree that is best-first up to that delay, and
    exactness untouched (keys stay token-free). `token_key=True` keys a candidate by its drawn token instead (not
    exact: a negative control)."""

    def __init__(self, root_token: int, order: Order, budget: int, max_depth: int | None = None,
                 token_key: bool = False, per_round: int = 1):
        super().__init__(root_token, order)
        self.budget, self.max_depth, self.token_key, self.per_round = budget, max_depth, token_key, per_round
        self.values, self.depth = [1.0], [0]
        self._heap: list = []
        self._pending: list[int] = []  # nodes whose law is asked for
        self._sorted: dict[int, torch.Tensor] = {}
        self._tie = itertools.count()

    def _push(self, node: int, rank: int) -> None:
        law = self.laws[node]
        if rank >= min(self.budget, law.shape[-1]):
            return
        if self.token_key:
            key = self.values[node] * float(law[self.child_token(node, rank, self.budget)])
        else:
            key = self.values[node] * float(self._sorted[node][rank])
        heapq.heappush(self._heap, (-key, next(self._tie), node, rank))

    def start(self):
        self._pending = [0]
        return [0]

    def step(self, laws):
        self._store(laws)
        for node in self._pending:
            law = self.laws[node]
            self._sorted[node] = law.topk(min(self.budget, law.shape[-1])).values.double()
            if self.max_depth is None or self.depth[node] < self.max_depth:
                self._push(node, 0)
        self._pending = []
        popped = 0
        while len(self.tokens) <= self.budget and self._heap:
            key = -self._heap[0][0]
            if popped >= self.per_round and self._pending and key < max(self.values[n] for n in self._pending):
                break  # a node whose law is unknown may have better children: ask for its law first
            _, _, parent, rank = heapq.heappop(self._heap)
            popped += 1
            token = self.child_token(parent, rank, self.budget)
            node = self.add(parent, token)
            self.values.append(self.values[parent] * float(self.laws[parent][token]))
            self.depth.append(self.depth[parent] + 1)
            self._push(parent, rank + 1)
            if len(self.tokens) <= self.budget and (self.max_depth is None or self.depth[node] < self.max_depth):
                self._pending.append(node)
        return list(self._pending) if len(self.tokens) <= self.budget else []


class Eagle2Builder(TreeBuilder):
    """EAGLE-2's context-aware tree (Li et al., arXiv 2406.16858; `cnets.py::topK_generate`): the root's top_k
    candidates form the frontier; for `depth - 1` rounds every frontier node gets its top_k candidates scored by
    cumulative log-probability and the global top_k of those become the next frontier; finally the `budget`
    best-scoring recorded nodes are kept (ancestor-closed: scores fall along every path; ties go to the earlier
    node). Verify with the deterministic rule."""

    def __init__(self, root_token: int, order: Order, budget: int, top_k: int = 4, depth: int = 4):
        super().__init__(root_token, order)
        self.budget, self.top_k, self.depth = budget, top_k, depth
        self.scores = [0.0]
        self._frontier = [0]
        self._round = 0

    def step(self, laws):
        self._store(laws)
        candidates = []
        for node in self._frontier:
            law = self.laws[node].double()
            for rank in range(min(self.top_k, law.shape[-1])):
                token = self.child_token(node, rank, self.top_k)
                prob = float(law[token])
                score = self.scores[node] + (torch.log(torch.tensor(prob)).item() if prob > 0 else float("-inf"))
                candidates.append((score, self.add(node, token)))
                self.scores.append(score)
        self._round += 1
        if self._round >= self.depth:
            self._rerank()
            return []
        best = sorted(candidates, key=lambda c: (-c[0], c[1]))[:self.top_k]
        self._frontier = sorted(node for _, node in best)
        return list(self._frontier)

    def _rerank(self) -> None:
        nodes = range(1, len(self.tokens))
        keep = sorted(sorted(nodes, key=lambda n: (-self.scores[n], n))[:self.budget])
        closed = set(keep)
        for n in keep:  # equal scores along a path could leave an ancestor out: put it back
            parent = self.parents[n]
            while parent > 0 and parent not in closed:
                closed.add(parent)
                parent = self.parents[parent]
        keep = sorted(closed)
        new = {0: 0, **{old: i + 1 for i, old in enumerate(keep)}}
        self.tokens = [self.tokens[0]] + [self.tokens[n] for n in keep]
        self.laws = [self.laws[0]] + [self.laws[n] for n in keep]
        self.parents = [-1] + [new[self.parents[n]] for n in keep]
        self.scores = [0.0] + [self.scores[n] for n in keep]


def scored_subtrees(builders: Sequence[TreeBuilder], requests: Sequence[Sequence[int]]):
    """(subsets, parents) for one draft forward over the requested nodes of each row's tree: per row the requested
    nodes and their non-root ancestors, sorted (a parent before its children), and [rows, width + 1] their parent
    array in slot numbering (slot 0 the root, padding slots parented to it), for the ancestor mask."""
    subsets = []
    for b, wanted in zip(builders, requests):
        needed = set()
        for node in wanted:
            while node > 0 and node not in needed:
                needed.add(node)
                node = b.parents[node]
        subsets.append(sorted(needed))
    parents = torch.zeros(len(subsets), max(len(s) for s in subsets) + 1, dtype=torch.long)
    parents[:, 0] = -1
    for j, (b, subset) in enumerate(zip(builders, subsets)):
        slot = {0: 0, **{node: i + 1 for i, node in enumerate(subset)}}
        parents[j, 1:len(subset) + 1] = torch.tensor([slot[b.parents[n]] for n in subset])
    return subsets, parents


def run_builders(builders: Sequence[TreeBuilder], laws_for: Callable[[list[list[int]]], list[dict]]) -> None:
    """Drive every row's builder to the end in lockstep rounds. laws_for(requests) gets, per row, the node ids
    whose law is needed (possibly empty) and returns per row a dict node -> law (one draft forward per round)."""
    requests = [b.start() for b in builders]
    while any(requests):
        laws = laws_for(requests)
        requests = [b.step(l) if r else [] for b, r, l in zip(builders, requests, laws)]


def laws_with_root(root_laws, score: Callable[[list[int], list[list[int]]], list[dict]]):
    """A `laws_for` for run_builders when every row's root law is known already (root_laws[i]): the other requests
    go to score(rows, their requests) in one call, which returns per row a dict node -> law."""
    def laws_for(requests):
        out = [{} for _ in requests]
        later = [i for i, r in enumerate(requests) if r and r != [0]]
        for i, r in enumerate(requests):
            if r == [0]:
                out[i][0] = root_laws[i]
        if later:
            for i, laws in zip(later, score(later, [requests[i] for i in later])):
                out[i] = laws
        return out

    return laws_for


_FNV_OFFSET, _FNV_PRIME, _MASK32 = 0x811C9DC5, 0x01000193, 0xFFFFFFFF


def node_key(sample: int, root_position: int, path: Sequence[int]) -> int:
    """A 32-bit key naming one tree node: FNV-1a over the sample id, the root's position and the root-to-node
    tokens (root included). Distinct nodes get distinct keys, hence independent draws."""
    h = _FNV_OFFSET
    for word in (sample, root_position, *path):
        h = ((h ^ (int(word) & _MASK32)) * _FNV_PRIME) & _MASK32
    return h


def keyed_order(builder: TreeBuilder, node: int, law: torch.Tensor, width: int, *, seed: int, sample: int,
                root_position: int, siblings: str) -> torch.Tensor:
    """The children ordering a drafter uses at `node`: the top candidates ("deterministic") or Gumbel-top-k
    with counter-based noise keyed by (seed, node_key, position of the children, DRAFT_GUMBEL, token)."""
    if siblings == "deterministic":
        return top_order(law, width)
    path, n = [], node
    while n > 0:
        path.append(builder.tokens[n])
        n = builder.parents[n]
    key = node_key(sample, root_position, [builder.tokens[0], *reversed(path)])
    position = root_position + len(path) + 1  # where this node's children go
    support = (law > 0).nonzero().flatten()
    if support.numel() >= width:  # noise for the law's support only: the same draws (keyed by token), far fewer
        exponential = counter_exponential(seed, key, position, Purpose.DRAFT_GUMBEL, support)
        return support[gumbel_order(law[support], exponential, width)]
    exponential = counter_exponential(seed, key, position, Purpose.DRAFT_GUMBEL, torch.arange(law.shape[-1]))
    return gumbel_order(law, exponential, width)


class ContextLawDrafter:
    """A tree drafter over any law(context) -> [vocab] (a TableLM in tests): the builders of this module with
    keyed orderings, one row at a time. make_builder(root_token, order, depth_budget) -> TreeBuilder."""

    def __init__(self, law: Callable[[list[int]], torch.Tensor], make_builder, siblings: str = "without_replacement"):
        self.law, self.make_builder, self.siblings = law, make_builder, siblings

    def propose(self, ctx, budget: int):
        from specgen.samplers.types import DraftTree

        rows = []
        for i, context in enumerate(ctx.tokens):
            context = context.tolist()
            holder = []
            order = lambda node, law, width: keyed_order(holder[0], node, law, width, seed=ctx.seed,
                                                         sample=int(ctx.sample_ids[i]), root_position=len(context) - 1,
                                                         siblings=self.siblings)
            builder = self.make_builder(context[-1], order, budget)
            holder.append(builder)

            def laws_for(requests, builder=builder, context=context):
                return [{node: self.law(context + builder.path(node)) for node in requests[0]}]

            run_builders([builder], laws_for)
            rows.append(builder)
        size = max(len(b.tokens) for b in rows)
        if any(len(b.tokens) != size for b in rows):
            raise InvalidRequest("ContextLawDrafter needs trees of one size in a batch")
        vocab = len(self.law(ctx.tokens[0].tolist()))
        probs = None
        if self.siblings != "deterministic":
            probs = torch.stack([torch.stack([l.double() if l is not None else torch.zeros(vocab, dtype=torch.float64)
                                              for l in b.laws]) for b in rows])
        return DraftTree(torch.tensor([b.tokens for b in rows]), torch.tensor([b.parents for b in rows]), probs)

    def observe(self, verdict) -> None:
        pass


def gumbel_order(law: torch.Tensor, exponential: torch.Tensor, width: int) -> torch.Tensor:
    """The first `width` draws without replacement from `law` (Gumbel-top-k as an exponential race); past the
    law's support the order continues with zero-probability tokens, which verification treats as never drawn."""
    return (law.double() / exponential).topk(min(width, law.shape[-1])).indices


def top_order(law: torch.Tensor, width: int) -> torch.Tensor:
    """The `width` most probable tokens (deterministic candidates; any fixed rule for ties is exact)."""
    return law.topk(min(width, law.shape[-1])).indices


# ---- exact enumeration of a builder (the oracle's proposals) ----------------------------------------------------

class _NeedOrder(Exception):
    def __init__(self, key, law, width):
        self.key, self.law, self.width = key, law, width


def _orderings(law: torch.Tensor, width: int, siblings: str):
    """(probability, first `width` children) of one node's ordering."""
    law = law.double()
    if siblings == "deterministic":
        yield 1.0, top_order(law, width).tolist()
        return
    vocab = law.shape[-1]
    support = (law > 0).nonzero().flatten().tolist()
    take = min(width, vocab)
    phantoms = [t for t in range(vocab) if t not in support]
    for seq in itertools.permutations(support, min(take, len(support))):
        prob, used = 1.0, 0.0
        for token in seq:
            prob *= float(law[token]) / (1.0 - used)
            used += float(law[token])
        if prob > 0:  # the zero-probability tail comes in a fixed order
            yield prob, list(seq) + phantoms[:take - len(seq)]


def enumerate_builder(make_builder, law, prefix, siblings: str):
    """Every tree a builder can produce after `prefix` (node 0 = prefix[-1]) with its probability, when each node's
    children are drawn without replacement from law(context) (siblings="without_replacement") or are its top
    candidates ("deterministic"). make_builder(root_token, order) -> TreeBuilder; law(context) -> [vocab].
    Yields (probability, DraftTree of one row)."""
    from specgen.samplers.types import DraftTree

    def attempt(assigned: dict):
        contexts = {}

        def order(node, node_law, width):
            key = contexts[node]
            if key not in assigned:
                raise _NeedOrder(key, node_law, width)
            return torch.tensor(assigned[key][:width], dtype=torch.long)

        builder = make_builder(prefix[-1], order)

        def laws_for(requests):
            out = {}
            for node in requests[0]:
                path, n = [], node
                while n > 0:
                    path.append(builder.tokens[n])
                    n = builder.parents[n]
                contexts[node] = tuple(prefix) + tuple(reversed(path))
                out[node] = law(list(contexts[node]))
            return [out]

        run_builders([builder], laws_for)
        return builder

    stack = [({}, 1.0)]
    while stack:
        assigned, prob = stack.pop()
        try:
            builder = attempt(assigned)
        except _NeedOrder as need:
            for p, kids in _orderings(need.law, need.width, siblings):
                stack.append(({**assigned, need.key: kids}, prob * p))
            continue
        vocab = len(law(list(prefix)))
        laws = torch.stack([l.double() if l is not None else torch.zeros(vocab, dtype=torch.float64)
                            for l in builder.laws])
        probs = None if siblings == "deterministic" else laws[None]
        yield prob, DraftTree(torch.tensor([builder.tokens]), torch.tensor([builder.parents]), probs)


# ---- greedy verification of a tree -------------------------------------------------------------------------------

class GreedyTreeMatch:
    """Temperature 0 on a tree (EAGLE's `evaluate_posterior`, greedy branch): from the root, descend into the first
    child equal to the target's argmax at the current node; where none is, commit that argmax (recovered when the
    node had children, bonus at a leaf). The same decisions as TreeRejection("deterministic") under a one-hot
    target, without its per-sibling residual arithmetic over the vocabulary."""

    lossless = True
    name = "tree-greedy"
    uses_noise = False

    def decision_probs(self, tree, target_probs: torch.Tensor):
        from specgen.samplers.acceptance import GreedyMatch
        from specgen.samplers.types import Decisions, Draft

        if isinstance(tree, Draft):
            return GreedyMatch().decision_probs(tree, target_probs)
        argmax = target_probs.argmax(-1)  # [batch, nodes]
        parents = tree.verified_parents
        parent_argmax = argmax.gather(1, parents.clamp(min=0))
        accept = ((tree.tokens == parent_argmax) & (parents >= 0)).double()
        accept[:, 0] = 0.0
        emit = torch.zeros_like(target_probs, dtype=torch.float64).scatter_(-1, argmax[..., None], 1.0)
        return Decisions(accept, emit)

    def __call__(self, tree, target_probs: torch.Tensor, noise=None):
        from specgen.kernels import PLACEHOLDER, tree_children
        from specgen.samplers.acceptance import GreedyMatch
        from specgen.samplers.types import Draft, TokenSource, Verdict

        if isinstance(tree, Draft):  # a chain (e.g. nothing drafted at the end of a run)
            return GreedyMatch()(tree, target_probs, noise)
        argmax = target_probs.argmax(-1)  # [batch, nodes]
        children = tree_children(tree.verified_parents)  # [batch, nodes, width]
        batch = tree.batch_size
        rows = torch.arange(batch)
        width = int(tree.depths.max()) + 1
        path = torch.full((batch, width), -1, dtype=torch.long)
        tokens = torch.full((batch, width), PLACEHOLDER, dtype=torch.long)
        path[:, 0] = 0
        node = torch.zeros(batch, dtype=torch.long)
        depth = torch.zeros(batch, dtype=torch.long)
        done = torch.zeros(batch, dtype=torch.bool)
        rejected = torch.zeros(batch, dtype=torch.bool)
        while not bool(done.all()):
            kids = children[rows, node]  # [batch, width]
            want = argmax[rows, node]
            match = (kids >= 0) & (tree.tokens[rows[:, None], kids.clamp(min=0)] == want[:, None])
            found = match.any(-1) & ~done
            chosen = kids.gather(1, match.int().argmax(-1, keepdim=True)).squeeze(1)
            stopping = ~done & ~found
            tokens[rows, depth] = torch.where(stopping, want, torch.where(found, tree.tokens[rows, chosen.clamp(min=0)],
                                                                          tokens[rows, depth]))
            rejected |= stopping & (kids >= 0).any(-1)
            depth = depth + found.long()
            node = torch.where(found, chosen, node)
            path[rows, depth.clamp(max=width - 1)] = torch.where(found, chosen, path[rows, depth.clamp(max=width - 1)])
            done |= stopping
        slots = torch.arange(width)
        emitted = torch.where(rejected, int(TokenSource.RECOVERED), int(TokenSource.BONUS))
        source = torch.where(slots < depth[:, None], int(TokenSource.ACCEPTED), -1)
        source = source.scatter(1, depth[:, None], emitted[:, None])
        drafted = torch.full((batch,), tree.num_nodes - 1, dtype=torch.long)
        return Verdict(num_accepted=depth, tokens=tokens, source=source, num_drafted=drafted, accepted_path=path)
