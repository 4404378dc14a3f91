"""One Protocol per concept. Models, drafters and rules meet only through these and `samplers.types`."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from specgen.samplers.types import AcceptanceNoise, DecodeContext, Decisions, Draft, DraftTree, Verdict


@runtime_checkable
class TargetModel(Protocol):
    """A model whose processed distribution must be preserved, with a position-indexed cache per row.

    Convention: after `prefill`, each row's cache holds all prompt tokens but the last; that last committed
    token is *pending*. Every step scores [pending, drafted...] (or a tree rooted at the pending token), and
    `commit` keeps the slots of the pending token and the accepted drafts; the emitted token becomes pending.
    Targets that serve a request queue (`speculative_generate(queue=...)`) also have
    `prefill_rows(prompts, rows)`: the same for some rows only, replacing their contexts.
    """

    vocab_size: int

    def prefill(self, prompts: Sequence[torch.Tensor]) -> None: ...

    def score(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
              tree_mask: torch.Tensor | None = None,
              valid: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tokens, positions: [rows, n]; tree_mask: [rows, n, n] ancestor mask or None for a causal chain.
        valid: [rows] for ragged chains, the real slots of each row (the rest pad the window to n); a target may
        skip the padding, whose scores are never read. Returns logits [rows, n, vocab] (or (cond, uncond) for
        guided models); slot i predicts position i + 1."""
        ...

    def commit(self, kept: torch.Tensor, rows: torch.Tensor) -> None:
        """kept: [rows, n] bool over the last scored slots; their KV is kept, compacted in order."""
        ...


@runtime_checkable
class Drafter(Protocol):
    def propose(self, context: DecodeContext, budget: int) -> Draft | DraftTree: ...

    def observe(self, verdict: Verdict) -> None: ...


@runtime_checkable
class AcceptanceRule(Protocol):
    lossless: bool

    def __call__(self, draft: Draft | DraftTree, target_probs: torch.Tensor, noise: AcceptanceNoise) -> Verdict: ...

    def decision_probs(self, draft: Draft | DraftTree, target_probs: torch.Tensor) -> Decisions: ...


@runtime_checkable
class LengthPolicy(Protocol):
    def next_length(self) -> int: ...

    def observe(self, verdict: Verdict) -> None: ...
