"""The small frozen dataclasses that proposers, acceptance rules and the loop exchange."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property

import torch

from specgen.errors import InvalidRequest
from specgen.kernels import PLACEHOLDER, ancestor_mask
from specgen.samplers.noise import counter_uniform


class TokenSource(IntEnum):
    """Where a committed token came from (the UI colours by it)."""

    ACCEPTED = 0  # a drafted token that passed verification
    RECOVERED = 1  # sampled from the residual at the first rejection
    BONUS = 2  # sampled from the target after every drafted token was accepted


@dataclass(frozen=True)
class Draft:
    """A chain proposal: `tokens[b, i]` drawn from `draft_probs[b, i]`.

    draft_probs is the law each token was actually drawn from (after the draft's own processing). It is
    dense over the target vocabulary, or over a reduced draft vocabulary whose target ids are `vocab_ids`
    (tokens outside it have draft probability 0, so exactness holds), or None for point-mass drafts
    (n-gram, argmax, retrieval).
    """

    tokens: torch.Tensor  # [batch, k] int64, target ids
    draft_probs: torch.Tensor | None = None  # [batch, k, vocab] or [batch, k, draft_vocab]
    num_drafted: torch.Tensor | None = None  # [batch] int64 <= k for ragged rows; None = k everywhere
    vocab_ids: torch.Tensor | None = None  # [draft_vocab] int64 target ids of the draft vocabulary

    def __post_init__(self):
        if self.tokens.dim() != 2:
            raise InvalidRequest(f"Draft.tokens must be [batch, k], got shape {tuple(self.tokens.shape)}")
        if self.draft_probs is not None and self.draft_probs.shape[:2] != self.tokens.shape:
            raise InvalidRequest("Draft.draft_probs must be [batch, k, vocab] matching tokens")

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def drafted(self) -> torch.Tensor:
        """[batch] number of real drafted tokens per row."""
        if self.num_drafted is not None:
            return self.num_drafted
        return torch.full((self.batch_size,), self.length, dtype=torch.long, device=self.tokens.device)

    def dense_draft_probs(self, vocab_size: int) -> torch.Tensor | None:
        """draft_probs scattered into the target vocabulary: [batch, k, vocab_size]."""
        if self.draft_probs is None or self.vocab_ids is None:
            return self.draft_probs
        dense = self.draft_probs.new_zeros(*self.draft_probs.shape[:2], vocab_size)
        return dense.index_copy_(-1, self.vocab_ids, self.draft_probs)

    def as_tree(self, root_tokens: torch.Tensor, vocab_size: int | None = None) -> "DraftTree":
        """The same proposal as a chain-shaped DraftTree rooted at root_tokens [batch] (ragged rows must not
        occur here: every row keeps all k tokens). Node n + 1 is drafted token n, drawn from draft_probs[:, n]."""
        if self.num_drafted is not None and bool((self.num_drafted != self.length).any()):
            raise InvalidRequest("a ragged Draft cannot be turned into a tree")
        batch, k = self.tokens.shape
        tokens = torch.cat([root_tokens.reshape(batch, 1).long(), self.tokens], 1)
        parents = (torch.arange(k + 1) - 1).expand(batch, k + 1)
        probs = None
        if self.draft_probs is not None:
            size = vocab_size or (int(self.vocab_ids.max()) + 1 if self.vocab_ids is not None else None)
            dense = self.draft_probs if self.vocab_ids is None else self.dense_draft_probs(size)
            probs = torch.cat([dense, torch.zeros_like(dense[:, :1])], 1)  # the leaf has no children
        return DraftTree(tokens, parents, probs)

    @classmethod
    def empty(cls, batch_size: int, device=None) -> "Draft":
        return cls(torch.zeros(batch_size, 0, dtype=torch.long, device=device))


@dataclass(frozen=True)
class DraftTree:
    """A tree proposal per row. Node 0 is the root: the last committed (pending) token; parents come
    before children. `draft_probs[b, n]` is the law node n's children were drawn from (None: point masses).
    Siblings are tried in node order."""

    tokens: torch.Tensor  # [batch, nodes] int64
    parents: torch.Tensor  # [batch, nodes] int64; parents[:, 0] == -1
    draft_probs: torch.Tensor | None = None  # [batch, nodes, vocab]
    depth_limit: torch.Tensor | None = None  # [batch]: nodes deeper than this are scored but never tested

    def __post_init__(self):
        if self.tokens.shape != self.parents.shape or self.tokens.dim() != 2:
            raise InvalidRequest("DraftTree.tokens and parents must both be [batch, nodes]")
        if bool((self.parents[:, 0] != -1).any()):
            raise InvalidRequest("DraftTree node 0 must be the root (parent -1)")
        nodes = torch.arange(self.tokens.shape[1], device=self.parents.device)
        if bool(((self.parents[:, 1:] < 0) | (self.parents[:, 1:] >= nodes[1:])).any()):
            raise InvalidRequest("DraftTree parents must precede their children (topological order)")

    @classmethod
    def from_parents(cls, tokens, parents, draft_probs=None) -> "DraftTree":
        """Build from lists or 1-D tensors (one row) or 2-D tensors (a batch)."""
        tokens, parents = torch.as_tensor(tokens, dtype=torch.long), torch.as_tensor(parents, dtype=torch.long)
        if tokens.dim() == 1:
            tokens, parents = tokens[None], parents[None]
            draft_probs = None if draft_probs is None else draft_probs[None]
        return cls(tokens, parents, draft_probs)

    @classmethod
    def chain(cls, tokens: torch.Tensor, draft_probs: torch.Tensor | None = None) -> "DraftTree":
        """A chain as a tree (node n's parent is n - 1; node 0 the root), its mask, depths and ranks known
        without walking the parents."""
        batch, nodes = tokens.shape
        tree = cls(tokens, torch.arange(-1, nodes - 1).repeat(batch, 1), draft_probs)
        tree.__dict__.update(is_chain=True, depths=torch.arange(nodes).repeat(batch, 1),
                             ancestor_mask=torch.ones(nodes, nodes, dtype=torch.bool).tril().repeat(batch, 1, 1),
                             sibling_rank=torch.zeros_like(tokens))  # what the cached properties would compute
        return tree

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @cached_property
    def is_chain(self) -> bool:
        """Every node's parent is the node before it: the causal mask of a chain, no tree mask needed."""
        return bool((self.parents == torch.arange(-1, self.num_nodes - 1)).all())

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """[batch, nodes, nodes] bool: mask[b, i, j] = j is i or an ancestor of i (tree attention)."""
        return ancestor_mask(self.parents)

    @cached_property
    def depths(self) -> torch.Tensor:
        """[batch, nodes] int64: the root has depth 0; position of node n = root position + depth."""
        return self.ancestor_mask.sum(-1) - 1

    @cached_property
    def sibling_rank(self) -> torch.Tensor:
        """[batch, nodes] int64: how many earlier siblings each node has (0 for the root)."""
        rank = torch.zeros_like(self.tokens)
        for b, row in enumerate(self.children):
            for kids in row:
                for r, kid in enumerate(kids):
                    rank[b, kid] = r
        return rank

    @cached_property
    def children(self) -> list[list[list[int]]]:
        """children[b][n]: node ids of n's children in sibling order."""
        result = [[[] for _ in range(self.num_nodes)] for _ in range(self.batch_size)]
        for b, row in enumerate(self.parents.tolist()):
            for node, parent in enumerate(row[1:], start=1):
                result[b][parent].append(node)
        return result

    @cached_property
    def verified_parents(self) -> torch.Tensor:
        """parents, with nodes past `depth_limit` detached (parent -2) so verification never reaches them."""
        if self.depth_limit is None:
            return self.parents
        too_deep = self.depths > self.depth_limit[:, None]
        return torch.where(too_deep, -2, self.parents)

    @cached_property
    def leaf_paths(self) -> torch.Tensor:
        """[batch, leaves, max_depth + 1]: root-to-leaf node ids, -1 padded (EAGLE's retrieve_indices)."""
        mask, depths = self.ancestor_mask, self.depths
        is_leaf = torch.ones_like(self.tokens, dtype=torch.bool)
        for b in range(self.batch_size):
            is_leaf[b, self.parents[b, 1:]] = False
        max_leaves, max_depth = int(is_leaf.sum(-1).max()), int(depths.max())
        paths = torch.full((self.batch_size, max_leaves, max_depth + 1), -1, dtype=torch.long)
        for b in range(self.batch_size):
            for slot, leaf in enumerate(is_leaf[b].nonzero().flatten().tolist()):
                on_path = mask[b, leaf].nonzero().flatten()  # ancestors incl. the leaf
                paths[b, slot, depths[b, on_path]] = on_path
        return paths

    def kept_slots(self, accepted_path: torch.Tensor) -> torch.Tensor:
        """[batch, nodes] bool: the nodes whose KV stays after acceptance (the accepted path; compaction keeps
        them in node order, which is depth order along a path)."""
        kept = torch.zeros_like(self.tokens, dtype=torch.bool)
        valid = accepted_path >= 0
        rows = torch.arange(self.batch_size)[:, None].expand_as(accepted_path)
        kept[rows[valid], accepted_path[valid]] = True
        return kept


@dataclass(frozen=True)
class AcceptanceNoise:
    """The randomness of one verification, as data. For a chain, column i of accept_uniform tests drafted
    token i and column j of emit_uniform samples the token emitted at slot j. For a tree both are indexed by
    node: accept_uniform[b, n] tests node n, emit_uniform[b, n] samples the token emitted after node n.

    Rules that need more randomness (PCG's owner choice and residual) draw it with `uniform` at the same keys:
    `verify_step` sets seed, sample_ids and the absolute position of every emit slot; forced-noise tests may
    leave them None, and then only rules that draw nothing more can run."""

    accept_uniform: torch.Tensor  # [batch, k] or [batch, nodes], float64 in (0, 1)
    emit_uniform: torch.Tensor  # [batch, k + 1] or [batch, nodes], float64 in (0, 1)
    seed: int | None = None
    sample_ids: torch.Tensor | None = None  # [batch] int64
    positions: torch.Tensor | None = None  # [batch, k + 1] or [batch, nodes]: absolute position of each emit slot

    def uniform(self, purpose: int, lanes: int = 1) -> torch.Tensor:
        """[batch, slots, lanes] float64 uniforms keyed (seed, sample, position of the slot, purpose, lane)."""
        if self.seed is None or self.sample_ids is None or self.positions is None:
            raise InvalidRequest("this acceptance rule draws extra randomness: the noise needs seed, sample_ids and "
                                 "positions (verify_step sets them)")
        lane = torch.arange(lanes)
        return counter_uniform(self.seed, self.sample_ids[:, None, None], self.positions[..., None], purpose, lane)


@dataclass(frozen=True)
class Decisions:
    """The probabilities an acceptance rule realises (what the exact oracle enumerates).

    Chain: accept_probs[b, i] = P(drafted token i accepted | tokens < i accepted), emit_probs[b, j] = the law
    of the token emitted when the walk stops at slot j (residual after a rejection, target for the bonus).
    Tree: accept_probs[b, n] = P(node n accepted | its parent accepted and its earlier siblings rejected),
    emit_probs[b, n] = the law of the token emitted when the walk stops at node n."""

    accept_probs: torch.Tensor  # [batch, k] or [batch, nodes] float64
    emit_probs: torch.Tensor  # [batch, k + 1, vocab] or [batch, nodes, vocab] float64


@dataclass(frozen=True)
class Verdict:
    """The outcome of one verification for every row of the step."""

    num_accepted: torch.Tensor  # [batch] accepted drafted tokens
    tokens: torch.Tensor  # [batch, k + 1] committed: accepted + (recovered | bonus), PLACEHOLDER-padded
    source: torch.Tensor  # [batch, k + 1] TokenSource values, -1 padded
    num_drafted: torch.Tensor  # [batch] drafted tokens (chain) or drafted depth reachable (tree)
    accepted_path: torch.Tensor | None = None  # [batch, depth + 1] tree node ids from the root, -1 padded
    # [batch, n, vocab] the processed target law at every scored slot (set by `verify_step`): Jacobi drafters
    # re-draft their uncommitted slots from it and store it as those drafts' law.
    target_probs: torch.Tensor | None = None
    # [batch, k + 1] the group each committed token was emitted in (rules exact in groups, PCG), -1 padded
    groups: torch.Tensor | None = None
    # [batch] for relaxed rules: the drafted tokens exact token-level sampling would have accepted with the same
    # drafts and accept uniforms (the longest prefix with u < min(1, target/draft)): what the relaxation gained
    exact_accepted: torch.Tensor | None = None

    @property
    def num_committed(self) -> torch.Tensor:
        return (self.tokens != PLACEHOLDER).sum(-1)

    @property
    def num_rejections(self) -> torch.Tensor:
        """[batch] 1 where a drafted token was tested and rejected (then a recovered token follows)."""
        return (self.source == TokenSource.RECOVERED).sum(-1)

    @classmethod
    def from_chain(cls, tokens, num_accepted, num_drafted, **extra) -> "Verdict":
        slots = torch.arange(tokens.shape[1], device=tokens.device)
        emitted_source = torch.where(num_accepted < num_drafted, int(TokenSource.RECOVERED), int(TokenSource.BONUS))
        source = torch.where(slots < num_accepted[:, None], int(TokenSource.ACCEPTED), -1)
        source = source.scatter(1, num_accepted[:, None], emitted_source[:, None])
        return cls(num_accepted=num_accepted, tokens=tokens, source=source, num_drafted=num_drafted, **extra)


@dataclass(frozen=True)
class DecodeContext:
    """What a drafter sees: the committed tokens of the active rows (prompt + generated; the last one is the
    pending token the target has not cached yet) and the keys of their randomness."""

    tokens: list[torch.Tensor]  # per active row, 1-D int64
    rows: torch.Tensor  # [active] batch row index of each entry
    sample_ids: torch.Tensor  # [active] sample id (sample i of N is seeded (seed, i))
    seed: int = 0

    @property
    def next_positions(self) -> torch.Tensor:
        """[active] absolute position of the first token to draft."""
        return torch.tensor([len(t) for t in self.tokens], dtype=torch.long)


@dataclass(frozen=True)
class StepEvent:
    """One row's result of one step (a target forward pass), after stop/length truncation."""

    step: int
    row: int
    sample: int
    tokens: tuple[int, ...]  # committed this step
    sources: tuple[int, ...]  # TokenSource per committed token
    num_drafted: int
    num_accepted: int
    draft_s: float
    verify_s: float
    finished: bool
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        names = [TokenSource(s).name.lower() for s in self.sources]
        return {"step": self.step, "row": self.row, "sample": self.sample, "tokens": list(self.tokens),
                "sources": names, "drafted": self.num_drafted, "accepted": self.num_accepted,
                "draft_s": self.draft_s, "verify_s": self.verify_s, "finished": self.finished, **self.extra}
