"""The one processed distribution. Verification, residuals, bonus tokens and plain decoding all call
`Processing.__call__`, so the target side of speculative decoding matches plain decoding exactly.

Order: guidance (l = uncond + s * (cond - uncond)) -> hooks (position constraints, ...) -> prefix constraint ->
temperature -> top-k -> top-p -> softmax. Temperature 0 means greedy: a one-hot on the first maximal index.

A prefix constraint decides, from the tokens before a slot, where each token's probability goes (a grammar, a
forced order): to the token itself, to another token (merging), or nowhere (masked). The caller that knows each
slot's prefix computes these routes with `prefix_routes` and passes them on: the draft-verify loop for every scored
slot (the committed context plus the drafted tokens before the slot) and `ModelDrafter` for each drafted token.
Draft and target then sample from laws transformed alike, and the target's law is the transformed one, so
speculative decoding stays exact with respect to constrained plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from specgen.errors import InvalidRequest

# hook(logits [batch, n, vocab], positions [batch, n]) -> logits; e.g. an allowed-token mask per position.
LogitsHook = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class PrefixConstraint(Protocol):
    def routes(self, context: torch.Tensor, continuation: Sequence[int]) -> torch.Tensor:
        """[len(continuation) + 1, vocab] int64: row i says, for the slot after context + continuation[:i], where
        each token's probability goes: a token id (itself, or another token it is merged into) or -1 (masked).
        Every row must keep some token."""


@dataclass(frozen=True)
class Processing:
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    guidance_scale: float | None = None  # classifier-free guidance; needs uncond logits
    hooks: tuple[LogitsHook, ...] = ()
    constraint: PrefixConstraint | None = None  # needs `routes` from the caller (module docstring)

    def __post_init__(self):
        if not self.temperature >= 0:
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def logits(self, logits: torch.Tensor, positions: torch.Tensor | None = None,
               uncond_logits: torch.Tensor | None = None, routes: torch.Tensor | None = None) -> torch.Tensor:
        """Guided, hooked and constrained logits, before temperature (what greedy takes the argmax of).
        routes: [..., vocab] int64, the prefix constraint's routes for these slots."""
        if self.guidance_scale is not None:
            if uncond_logits is None:
                raise InvalidRequest("guidance_scale is set but the model gave no unconditional logits")
            logits = uncond_logits + self.guidance_scale * (logits - uncond_logits)
        for hook in self.hooks:
            logits = hook(logits, positions)
        if routes is not None:
            logits = route_logits(logits, routes)
        elif self.constraint is not None:
            raise InvalidRequest("this processing has a prefix constraint, which only chain drafts and plain "
                                 "decoding support (they pass each slot's routes)")
        return logits

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor | None = None,
                 uncond_logits: torch.Tensor | None = None, routes: torch.Tensor | None = None) -> torch.Tensor:
        """[..., vocab] logits -> [..., vocab] probabilities (float32 at least; float64 stays float64)."""
        logits = self.logits(logits, positions, uncond_logits, routes)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        logits = logits.to(dtype)
        if self.greedy:
            return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        if self.temperature != 1.0:  # dividing by 1 changes no bit: skip the op
            logits = logits / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))  # ties at the k-th value are kept (as HF)
        probs = logits.softmax(-1)
        if self.top_p < 1:
            probs = _top_p(probs, self.top_p)
        return probs


def prefix_routes(constraint: PrefixConstraint, contexts: Sequence[torch.Tensor],
                  continuations: Sequence[Sequence[int]]) -> torch.Tensor:
    """[rows, n + 1, vocab] int64: per row, the routes after its context and each prefix of its continuation (all
    continuations have length n)."""
    return torch.stack([constraint.routes(c, list(t)) for c, t in zip(contexts, continuations)])


def route_logits(logits: torch.Tensor, routes: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax moves each token's probability to routes[token] (-1: dropped). Decided per slot: a slot
    whose routes are a pure mask (every token to itself or dropped) keeps its other logits bit for bit, whatever the
    other slots need, so a slot gets the same law alone and in a window; merges sum probabilities in logit space
    (at least float32), scaled by the largest kept logit so the kept mass cannot underflow."""
    dropped = routes < 0
    masked = logits.masked_fill(dropped, float("-inf"))
    pure = (routes == torch.arange(logits.shape[-1])) | dropped  # [..., vocab]
    if bool(pure.all()):
        return masked
    wide = masked.to(torch.promote_types(logits.dtype, torch.float32))
    top = wide.max(-1, keepdim=True).values  # over kept tokens only
    kept = (wide - top).exp()  # [..., vocab], 0 where dropped
    merged = torch.zeros_like(kept).scatter_add_(-1, routes.clamp(min=0), kept).log() + top
    return torch.where(pure.all(-1, keepdim=True), masked.to(merged.dtype), merged)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of tokens (by descending probability) whose mass reaches top_p."""
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    keep_sorted = mass_before < top_p  # the first token always has mass_before == 0
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)
