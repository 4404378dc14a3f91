"""Divergences between the target's and the draft's next-token distributions, per token, for distillation.

The target side arrives compact: its top-k log-probabilities plus the log of the mass outside them (the tail).
Both distributions are compared on the same k + 1 buckets (the top-k tokens and "everything else"), which by the
data-processing inequality never overstates a divergence and is exact when k covers the vocabulary (then there
is no tail bucket). DistillSpec's menu (arXiv 2310.08461): forward KL, reverse KL, JSD(β) and total variation,
whose complement is the acceptance rate itself. AdaSPEC (arXiv 2510.19779) trains only on the tokens where the
draft trails a reference draft the most.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DIVERGENCES = ("fkl", "rkl", "jsd", "tvd")
LOG_FLOOR = -80.0  # exp(-80) ~ 1e-35: a teacher bucket this small counts as empty, without inf * 0


@dataclass(frozen=True)
class TeacherTopK:
    """The target's processed next-token law at n positions, compactly."""

    top_ids: torch.Tensor  # [n, k] int64 token indices (in the draft's vocabulary for a reduced draft)
    top_logp: torch.Tensor  # [n, k] float32 log-probabilities of those tokens
    tail_logp: torch.Tensor  # [n] float32 log of the remaining mass (-inf when k covers the vocabulary)

    def rows(self, keep: torch.Tensor) -> "TeacherTopK":
        """The positions where `keep` [n] (bool) is set."""
        return TeacherTopK(self.top_ids[keep], self.top_logp[keep], self.tail_logp[keep])

    @staticmethod
    def cat(parts: list["TeacherTopK"]) -> "TeacherTopK":
        return TeacherTopK(*(torch.cat([getattr(p, name) for p in parts]) for name in ("top_ids", "top_logp",
                                                                                        "tail_logp")))

    def buckets(self) -> torch.Tensor:
        """[n, k + 1] log-probabilities of the buckets (top-k, tail); [n, k] when there is no tail."""
        if bool(torch.isinf(self.tail_logp).all()):
            return self.top_logp.float()
        return torch.cat([self.top_logp.float(), self.tail_logp.float()[:, None]], 1)


def teacher_top_k(logits: torch.Tensor, k: int, temperature: float = 1.0) -> TeacherTopK:
    """Compress target logits [n, vocab] at `temperature` to top-k log-probabilities and the exact tail mass."""
    logp = torch.log_softmax(logits.float() / temperature, -1)  # [n, vocab]
    k = min(k, logp.shape[-1])
    top_logp, top_ids = logp.topk(k, -1)
    if k == logp.shape[-1]:
        tail = torch.full(top_logp.shape[:1], float("-inf"))
    else:
        tail = logp.scatter(-1, top_ids, float("-inf")).logsumexp(-1)  # from the logits, not 1 - sum(top)
    return TeacherTopK(top_ids, top_logp, tail)


def draft_buckets(draft_logits: torch.Tensor, teacher: TeacherTopK, temperature: float = 1.0) -> torch.Tensor:
    """[n, k (+1)] the draft's log-probabilities on the teacher's buckets (differentiable)."""
    logq = torch.log_softmax(draft_logits.float() / temperature, -1)  # [n, vocab]
    top = logq.gather(-1, teacher.top_ids)
    if bool(torch.isinf(teacher.tail_logp).all()):
        return top
    tail = logq.scatter(-1, teacher.top_ids, float("-inf")).logsumexp(-1)
    return torch.cat([top, tail[:, None]], 1)


def token_divergence(kind: str, target_logp: torch.Tensor, draft_logp: torch.Tensor,
                     beta: float = 0.5) -> torch.Tensor:
    """[n] divergence of each row of bucket log-probabilities [n, b]; the target side carries no gradient."""
    target_logp = target_logp.detach().clamp(min=LOG_FLOOR)
    target, draft = target_logp.exp(), draft_logp.exp()
    if kind == "fkl":  # KL(target || draft): mass-covering, the DistillSpec / AdaSPEC default
        return (target * (target_logp - draft_logp)).sum(-1)
    if kind == "rkl":  # KL(draft || target): mode-seeking
        return (draft * (draft_logp - target_logp)).sum(-1)
    if kind == "jsd":  # beta KL(target || m) + (1 - beta) KL(draft || m), m = beta target + (1 - beta) draft
        if not 0.0 < beta < 1.0:
            raise ValueError(f"JSD needs 0 < beta < 1, got {beta}")
        mix = torch.logaddexp(target_logp + torch.log(torch.tensor(beta)),
                              draft_logp + torch.log(torch.tensor(1.0 - beta)))
        return beta * (target * (target_logp - mix)).sum(-1) + (1 - beta) * (draft * (draft_logp - mix)).sum(-1)
    if kind == "tvd":  # 1 - acceptance rate of this token under exact speculative sampling
        return 0.5 * (target - draft).abs().sum(-1)
    raise ValueError(f"unknown divergence {kind!r}; choose from {', '.join(DIVERGENCES)}")


def adaspec_keep(draft_divergence: torch.Tensor, reference_divergence: torch.Tensor,
                 keep_fraction: float) -> torch.Tensor:
    """[n] bool: the `keep_fraction` of tokens with the largest draft - reference gap (AdaSPEC's filter).

    Tokens the reference fits but the draft does not yet are learnable; tokens both miss (hard) or both fit
    (done) are skipped. Recomputed on every batch with the current draft."""
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    gap = draft_divergence.detach() - reference_divergence.detach()
    if keep_fraction == 1.0 or gap.numel() == 0:
        return torch.ones_like(gap, dtype=torch.bool)
    return gap >= torch.quantile(gap.float(), 1.0 - keep_fraction)
