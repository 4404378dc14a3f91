"""Classifier-free guidance as a TargetModel: every row is scored twice in one batched forward pass, with its
conditioned prompt (row r) and its unconditioned prompt (row r + batch), and `score` returns (cond, uncond)
logits, which `Processing` combines as uncond + s * (cond - uncond). Both halves keep the same tokens, so a
rollback or a ragged commit treats them identically. (Hugging Face's unbatched CFG processor keeps its own
one-token-at-a-time cache, which cannot score a window or roll back; this can.)
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from specgen.errors import InvalidRequest
from specgen.samplers.protocols import TargetModel


class GuidedTarget:
    def __init__(self, inner: TargetModel, uncond_prompt: Callable[[torch.Tensor], torch.Tensor]):
        """uncond_prompt maps a conditioned prompt to its unconditioned twin of the same length (positions
        must line up so both halves score the same slots)."""
        self.inner, self.uncond_prompt = inner, uncond_prompt
        self.vocab_size = inner.vocab_size
        self.batch = 0

    @property
    def forward_calls(self) -> int:
        return getattr(self.inner, "forward_calls", 0)

    def prefill(self, prompts: Sequence[torch.Tensor]) -> None:
        uncond = self._uncond(prompts)
        self.batch = len(prompts)
        # until a row has generated a token, its pending (last prompt) token differs between the two halves
        self.uncond_last = torch.tensor([int(u[-1]) for u in uncond])
        self.last_prompt_position = torch.tensor([len(p) - 1 for p in prompts])
        self.inner.prefill(list(prompts) + uncond)

    def prefill_rows(self, prompts: Sequence[torch.Tensor], rows: torch.Tensor) -> None:
        uncond, rows = self._uncond(prompts), torch.as_tensor(rows)
        self.uncond_last[rows] = torch.tensor([int(u[-1]) for u in uncond])
        self.last_prompt_position[rows] = torch.tensor([len(p) - 1 for p in prompts])
        self.inner.prefill_rows(list(prompts) + uncond, torch.cat([rows, rows + self.batch]))

    def _uncond(self, prompts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        uncond = [torch.as_tensor(self.uncond_prompt(p), dtype=torch.long).flatten() for p in prompts]
        if any(len(u) != len(p) for u, p in zip(uncond, prompts)):
            raise InvalidRequest("a guided model's unconditioned prompt must have the conditioned prompt's length")
        return uncond

    def score(self, tokens, positions, rows, tree_mask=None, valid=None):
        both = lambda x: None if x is None else torch.cat([x, x])  # noqa: E731
        uncond_tokens = tokens.clone()
        first = positions[:, 0] == self.last_prompt_position[rows]  # [rows] slot 0 is still the prompt's last token
        uncond_tokens[first, 0] = self.uncond_last[rows][first]
        logits = self.inner.score(torch.cat([tokens, uncond_tokens]), both(positions),
                                  torch.cat([rows, rows + self.batch]), both(tree_mask), both(valid))
        cond, uncond = logits.split(len(rows))
        return cond, uncond

    def commit(self, kept, rows) -> None:
        self.inner.commit(torch.cat([kept, kept]), torch.cat([rows, rows + self.batch]))
