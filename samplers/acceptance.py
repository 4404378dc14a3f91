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

    def node_decisions(self, target_probs: torch.Tensor, draft_probs: torch.Tensor | None, child_tokens: list[int]):
        """At one node: acceptance probability of each child in order (each given the earlier ones were
        rejected) and the law of the token emitted if all are rejected. target_probs/draft_probs: [vocab]."""
        residual = target_probs.double()
        draft = None if draft_probs is None or self.siblings == "deterministic" else draft_probs.double()
        accept = []
        for token in child_tokens:
            tried = torch.zeros_like(residual)
            tried[token] = 1.0
            if draft is None:
                accept.append(kernels.accept_probability(residual[token], torch.ones((), dtype=torch.float64)))
                residual = kernels.residual_probs(residual, tried)
                continue
            accept.append(kernels.accept_probability(residual[token], draft[token]))
            residual = kernels.residual_probs(residual, draft)
            if self.siblings == "without_replacement":
                remaining = draft * (1 - tried)
                if remaining.sum() > 0:  # otherwise no further child can have been drawn
                    draft = remaining / remaining.sum()
        return accept, residual

    def decision_probs(self, tree: DraftTree, target_probs: torch.Tensor) -> Decisions:
        batch, nodes = tree.tokens.shape
        accept = torch.zeros(batch, nodes, dtype=torch.float64)
        emit = torch.zeros(batch, nodes, target_probs.shape[-1], dtype=torch.float64)
        for b in range(batch):
            for node in range(nodes):
                kids = tree.children[b][node]
                probs, law = self.node_decisions(target_probs[b, node], self._at(tree.draft_probs, b, node),
                                                 tree.tokens[b, kids].tolist())
                for kid, prob in zip(kids, probs):
                    accept[b, kid] = prob
                emit[b, node] = law
        return Decisions(accept, emit)

    def __call__(self, tree: DraftTree | Draft, target_probs: torch.Tensor, noise: AcceptanceNoise) -> Verdict:
        if isinstance(tree, Draft):  # a chain is a tree with one child per node (the root token is unused here)
            tree = tree.as_tree(torch.zeros(tree.batch_size, dtype=torch.long))
        batch = tree.batch_size
        max_depth = int(tree.depths.max())
        tokens = torch.full((batch, max_depth + 1), PLACEHOLDER, dtype=torch.long)
        source = torch.full_like(tokens, -1)
        path = torch.full_like(tokens, -1)
        num_accepted = torch.zeros(batch, dtype=torch.long)
        for b in range(batch):
            node, depth = 0, 0
            path[b, 0] = 0
            while True:
                kids = tree.children[b][node]
                probs, law = self.node_decisions(target_probs[b, node], self._at(tree.draft_probs, b, node),
                                                 tree.tokens[b, kids].tolist())
                chosen = next((kid for kid, prob in zip(kids, probs) if noise.accept_uniform[b, kid] < prob), None)
                if chosen is None:
                    tokens[b, depth] = kernels.sample_categorical(law, noise.emit_uniform[b, node])
                    source[b, depth] = TokenSource.RECOVERED if kids else TokenSource.BONUS
                    break
                tokens[b, depth] = tree.tokens[b, chosen]
                source[b, depth] = TokenSource.ACCEPTED
                depth += 1
                path[b, depth] = node = chosen
            num_accepted[b] = depth
        drafted = torch.full((batch,), tree.num_nodes - 1, dtype=torch.long)
        return Verdict(num_accepted=num_accepted, tokens=tokens, source=source, num_drafted=drafted,
                       accepted_path=path)

    @staticmethod
    def _at(draft_probs, b, node):
        return None if draft_probs is None else draft_probs[b, node]


def make_rule(key: str, processing: Processing, **options):
    """The rule object for a registry key (`MethodSpec.rule`) under the given processing."""
    if key == "chain" or key == "none":  # plain decoding is a chain with nothing drafted
        return GreedyMatch() if processing.greedy else ChainRejection()
    if key == "tree":
        return TreeRejection(options.get("siblings", "without_replacement"))
    raise InvalidRequest(f"unknown acceptance rule {key!r}")
