"""Acceptance rules: one object per algorithm. Each declares `lossless`, exposes `decision_probs` (the
probabilities it realises, which the exact oracle enumerates) and samples through `specgen.kernels`.

A rule is called with target_probs already processed by the same `Processing` as plain decoding.
"""

from __future__ import annotations

from typing import Literal

import torch

from specgen import kernels
from specgen.errors import InvalidRequest
from specgen.samplers.processing import Processing
from specgen.samplers.types import AcceptanceNoise, Decisions, Draft, DraftTree, TokenSource, Verdict

PLACEHOLDER = kernels.PLACEHOLDER


class GreedyMatch:
    """Temperature 0: accept the longest drafted prefix equal to the target's argmax, then commit the
    target's argmax (first index on ties). Output equals plain greedy decoding token for token."""

    lossless = True
    name = "greedy"
    uses_noise = False

    def decision_probs(self, draft: Draft, target_probs: torch.Tensor) -> Decisions:
        k = draft.length
        argmax = target_probs.argmax(-1)  # [batch, k + 1]
        within = torch.arange(k) < draft.drafted()[:, None]
        accept = ((draft.tokens == argmax[:, :k]) & within).double()
        emit = torch.zeros_like(target_probs, dtype=torch.float64).scatter_(-1, argmax[..., None], 1.0)
        return Decisions(accept, emit)

    def __call__(self, draft: Draft, target_probs: torch.Tensor, noise: AcceptanceNoise) -> Verdict:
        drafted = draft.drafted()
        tokens, num_accepted = kernels.greedy_verify(draft.tokens, target_probs.argmax(-1), drafted)
        return Verdict.from_chain(tokens, num_accepted, drafted)


class ChainRejection:
    """Exact speculative sampling on a chain: accept drafted token x with min(1, target(x)/draft(x)); at the
    first rejection emit a recovered token from norm(relu(target - draft)); if all are accepted emit a bonus
    token from the target at the next slot. Point-mass drafts (draft_probs None) accept with target(x) and
    recover from the target with x zeroed. Lossless for any draft whose draft_probs is the law it sampled."""

    lossless = True
    name = "rejection"

    def decision_probs(self, draft: Draft, target_probs: torch.Tensor) -> Decisions:
        batch, k = draft.tokens.shape
        drafted = draft.drafted()
        draft_probs = self._draft_probs(draft, target_probs)  # [batch, k, vocab]
        tokens = draft.tokens[..., None]
        accept = kernels.accept_probability(target_probs[:, :k].gather(-1, tokens), draft_probs.gather(-1, tokens))
        accept = accept.squeeze(-1) * (torch.arange(k) < drafted[:, None])
        residual = kernels.residual_probs(target_probs[:, :k], draft_probs)  # [batch, k, vocab]
        emit = target_probs.double().clone()
        recovers = (torch.arange(k) < drafted[:, None])[..., None]
        emit[:, :k] = torch.where(recovers, residual, emit[:, :k])
        return Decisions(accept, emit)

    def __call__(self, draft: Draft, target_probs: torch.Tensor, noise: AcceptanceNoise) -> Verdict:
        drafted = draft.drafted()
        draft_probs = None if draft.draft_probs is None else draft.dense_draft_probs(target_probs.shape[-1])
        tokens, num_accepted = kernels.rejection_sample(draft.tokens, draft_probs, target_probs, drafted,
                                                        noise.accept_uniform, noise.emit_uniform)
        return Verdict.from_chain(tokens, num_accepted, drafted)

    @staticmethod
    def _draft_probs(draft: Draft, target_probs: torch.Tensor) -> torch.Tensor:
        if draft.draft_probs is None:  # point masses
            return torch.zeros_like(target_probs[:, :draft.length]).scatter_(-1, draft.tokens[..., None], 1.0)
        return draft.dense_draft_probs(target_probs.shape[-1])


Siblings = Literal["with_replacement", "without_replacement", "deterministic"]


class TreeRejection:
    """Multi-candidate verification over a DraftTree, walking from the root; at each node the children are
    tried in order (core.md section 7):
      with_replacement (SpecInfer): children i.i.d. from q; accept c w.p. min(1, p(c)/q(c)); on rejection
          p <- norm(relu(p - q)), q unchanged.
      without_replacement (Sequoia, MCSD): children drawn without replacement from q; as above and also
          q <- norm(q with c zeroed).
      deterministic (EAGLE-style candidates, draft prob 1): accept c w.p. p(c); on rejection zero p(c).
    If every child is rejected the walk emits a recovered token from the residual p; at a node without
    children it emits a bonus token from the target. Lossless when the drafter sampled as the mode says."""

    lossless = True

    def __init__(self, siblings: Siblings = "without_replacement"):
        if siblings not in ("with_replacement", "without_replacement", "deterministic"):
            raise InvalidRequest(f"unknown sibling mode {siblings!r}")
        self.siblings = siblings
        self.name = f"tree-{siblings.replace('_', '-')}"

    def decision_probs(self, tree: DraftTree | Draft, target_probs: torch.Tensor) -> Decisions:
        tree = self._as_tree(tree, target_probs.shape[-1])
        batch, nodes = tree.tokens.shape
        rows = torch.arange(batch)
        children = kernels.tree_children(tree.verified_parents)  # [batch, nodes, width]
        accept = torch.zeros(batch, nodes, dtype=torch.float64)
        emit = torch.zeros(batch, nodes, target_probs.shape[-1], dtype=torch.float64)
        for node in range(nodes):  # every node's children, all rows at once, with the sampler's own step
            residual = target_probs[:, node].double()
            draft = self._draft_at(tree, node)
            for rank in range(children.shape[-1]):
                kid = children[:, node, rank]
                has_kid = kid >= 0
                prob, next_residual, next_draft = self.sibling_step(residual, draft, tree.tokens[rows, kid.clamp(min=0)])
                accept[rows[has_kid], kid[has_kid]] = prob[has_kid]
                residual = torch.where(has_kid[:, None], next_residual, residual)
                if draft is not None:
                    draft = torch.where(has_kid[:, None], next_draft, draft)
            emit[:, node] = residual
        return Decisions(accept, emit)

    def __call__(self, tree: DraftTree | Draft, target_probs: torch.Tensor, noise: AcceptanceNoise) -> Verdict:
        accept_uniform = noise.accept_uniform
        if isinstance(tree, Draft):  # chain noise is per drafted token; tree noise per node (node 0 is never tested)
            accept_uniform = torch.cat([accept_uniform.new_ones(accept_uniform.shape[0], 1), accept_uniform], 1)
        tree = self._as_tree(tree, target_probs.shape[-1])
        path, tokens, num_accepted, rejected = self.walk(tree, target_probs, accept_uniform, noise.emit_uniform)
        width = int(tree.depths.max()) + 1  # the same layout whatever was accepted ([batch, k + 1] for a chain)
        path = torch.nn.functional.pad(path, (0, width - path.shape[1]), value=-1)
        tokens = torch.nn.functional.pad(tokens, (0, width - tokens.shape[1]), value=PLACEHOLDER)
        slots = torch.arange(tokens.shape[1])
        emitted_source = torch.where(rejected, int(TokenSource.RECOVERED), int(TokenSource.BONUS))
        source = torch.where(slots < num_accepted[:, None], int(TokenSource.ACCEPTED), -1)
        source = source.scatter(1, num_accepted[:, None], emitted_source[:, None])
        drafted = torch.full((tree.batch_size,), tree.num_nodes - 1, dtype=torch.long)
        return Verdict(num_accepted=num_accepted, tokens=tokens, source=source, num_drafted=drafted,
                       accepted_path=path)

    def walk(self, tree: DraftTree, target_probs: torch.Tensor, accept_uniform: torch.Tensor,
             emit_uniform: torch.Tensor):
        """(path, tokens, num_accepted, rejected) of one verification walk (`kernels.tree_rejection_sample`)."""
        if tree.num_nodes > 1 and tree.is_chain:
            return self._walk_chain(tree, target_probs, accept_uniform, emit_uniform)
        draft_probs = None if self.siblings == "deterministic" else tree.draft_probs
        return kernels.tree_rejection_sample(tree.tokens, tree.verified_parents, draft_probs, target_probs,
                                             accept_uniform, emit_uniform, self.siblings == "without_replacement")

    def chain_accept(self, laws: torch.Tensor, drafts: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor:
        """[n] acceptance probabilities of `tokens` [n] under `laws` [n, vocab], drawn from `drafts` [n, vocab]
        (None: point masses): `sibling_step`'s test without its residual."""
        at_token = laws.gather(-1, tokens[:, None]).squeeze(-1)
        drafted = torch.ones_like(at_token) if drafts is None else drafts.gather(-1, tokens[:, None]).squeeze(-1)
        return kernels.accept_probability(at_token, drafted)

    def _chain_laws(self, tree: DraftTree, target_probs: torch.Tensor):
        """(laws [batch * depth, vocab] node n's child is tested under, their draft laws or None, the children
        [batch, depth]), row-major: node n of row b at b * depth + n."""
        batch, depth = tree.batch_size, tree.num_nodes - 1
        sampled = self.siblings != "deterministic" and tree.draft_probs is not None
        flat = lambda x: x[:, :depth].double().reshape(batch * depth, x.shape[-1])  # noqa: E731
        return flat(target_probs), flat(tree.draft_probs) if sampled else None, tree.tokens[:, 1:]

    def _walk_chain(self, tree: DraftTree, target_probs, accept_uniform, emit_uniform):
        """`walk` for a chain (node n's one child is n + 1): every node's test at once, the first failure per row,
        then one emission per row. The same tests, residual and uniforms as the node-by-node walk, no host loop
        (a chain is what drafting heads propose by default, and the generic walk costs ~0.6 ms a step here)."""
        laws, drafts, children = self._chain_laws(tree, target_probs)
        batch, depth = children.shape
        rows = torch.arange(batch, device=children.device)
        accept = self.chain_accept(laws, drafts, children.reshape(-1)).reshape(batch, depth)
        # nodes past a row's depth limit are cut off: never tested, and the last kept node emits a bonus token
        tested = torch.arange(depth, device=children.device) < (tree.verified_parents[:, 1:] >= 0).sum(-1, keepdim=True)
        num_accepted = ((accept_uniform[:, 1:] < accept) & tested).long().cumprod(-1).sum(-1)  # [batch]
        self._chain_walked(laws, drafts, children, accept_uniform, num_accepted)
        rejected = num_accepted < tested.sum(-1)
        at = rows * depth + num_accepted.clamp(max=depth - 1)  # the node whose child failed, when one did
        _, residual, _ = self.sibling_step(laws[at], None if drafts is None else drafts[at], children.reshape(-1)[at])
        law = torch.where(rejected[:, None], residual, target_probs[rows, num_accepted].double())
        emitted = kernels.sample_categorical(law, emit_uniform[rows, num_accepted])
        width = int(num_accepted.max()) + 1
        slots = torch.arange(width, device=children.device)
        path = torch.where(slots <= num_accepted[:, None], slots, -1)
        padded = torch.cat([children, children.new_full((batch, 1), PLACEHOLDER)], 1)[:, :width]
        tokens = torch.where(slots < num_accepted[:, None], padded, PLACEHOLDER).scatter(1, num_accepted[:, None],
                                                                                        emitted[:, None])
        return path, tokens, num_accepted, rejected

    def _chain_walked(self, laws, drafts, children, accept_uniform, num_accepted) -> None:
        """Called by `_walk_chain` with its flattened laws once every row's accepted count is known (a subclass
        counts what its test accepted)."""

    def sibling_step(self, residual: torch.Tensor, draft: torch.Tensor | None, token: torch.Tensor):
        """One child's test at its parent: (accept prob, residual if rejected, draft law if rejected)."""
        return kernels.sibling_step(residual, draft, token, self.siblings == "without_replacement")

    def _draft_at(self, tree: DraftTree, node: int) -> torch.Tensor | None:
        if tree.draft_probs is None or self.siblings == "deterministic":
            return None
        return tree.draft_probs[:, node].double()

    @staticmethod
    def _as_tree(proposal: DraftTree | Draft, vocab_size: int) -> DraftTree:
        # a chain is a tree with one child per node (the root token is not used by verification)
        if isinstance(proposal, Draft):
            return proposal.as_tree(torch.zeros(proposal.batch_size, dtype=torch.long), vocab_size)
        probs = proposal.draft_probs
        if probs is not None and probs.shape[-1] < vocab_size:  # a draft table over the leading ids only
            probs = torch.nn.functional.pad(probs, (0, vocab_size - probs.shape[-1]))
            return DraftTree(proposal.tokens, proposal.parents, probs, proposal.depth_limit)
        return proposal


def make_rule(key: str, processing: Processing, **options):
    """The rule object for a registry key (`MethodSpec.rule`) under the given processing."""
    if key == "chain" or key == "none":  # plain decoding is a chain with nothing drafted
        return GreedyMatch() if processing.greedy else ChainRejection()
    if key == "tree":
        if processing.greedy:  # the same decisions, without the residual arithmetic over the vocabulary
            from specgen.samplers.trees import GreedyTreeMatch

            return GreedyTreeMatch()
        return TreeRejection(options.get("siblings", "without_replacement"))
    if key == "lantern":  # relaxed (lossy) tree verification over latent neighbours
        from specgen.samplers.lantern import Relaxation, RelaxedTreeRejection

        if options.get("neighbours") is None:
            raise InvalidRequest("the lantern rule needs a latent neighbour table (neighbours=[vocab, K])")
        relaxation = Relaxation(options["neighbours"], options["k"], delta=options.get("delta"),
                                lam=options.get("lam"))
        return RelaxedTreeRejection(relaxation, options.get("siblings", "without_replacement"))
    if key in ("group", "tolerance"):  # relaxed (lossy) rules; at temperature 0 they relax greedy matching too
        from specgen.samplers.group_acceptance import GroupRejection, ToleranceRejection

        if key == "tolerance":
            return ToleranceRejection(options.get("beta", 0.1))
        if options.get("groups") is None:
            raise InvalidRequest("the group rule needs token groups (groups=TokenGroups)")
        return GroupRejection(options["groups"], options.get("residual", "explicit"),
                              options.get("thinning_rounds", 16))
    raise InvalidRequest(f"unknown acceptance rule {key!r}")
