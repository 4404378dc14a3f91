"""The torch implementation of every verification op: the specification that Triton kernels must match.

Vocabulary (one glossary for code, metrics and UI):
  drafted   tokens proposed by the draft for one row in one step
  accepted  the longest prefix of drafted tokens that passes verification
  recovered the token sampled from the normalised residual relu(target - draft) at the first rejection
  bonus     the token sampled from the target at the slot after the last drafted token, when all are accepted
  committed accepted + (recovered | bonus): num_accepted + 1 tokens per row and step

Randomness enters as data (float64 uniforms in (0, 1)), so a kernel and this reference agree exactly.
Probabilities are compared in float64: a draft token is accepted iff `u < target_prob / draft_prob`.
"""

from __future__ import annotations

import torch

PLACEHOLDER = -1  # pads ragged rows of [batch, k + 1] outputs


def accept_probability(target_prob: torch.Tensor, draft_prob: torch.Tensor) -> torch.Tensor:
    """min(1, target/draft) in float64; 0 where the draft could not have produced the token."""
    target_prob, draft_prob = target_prob.double(), draft_prob.double()
    ratio = target_prob / torch.where(draft_prob > 0, draft_prob, torch.ones_like(draft_prob))
    return torch.where(draft_prob > 0, ratio.clamp(max=1.0), torch.zeros_like(ratio))


def residual_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(relu(target - draft)) over the last axis, in float64.

    Where target == draft exactly the residual is empty; rejection then has probability 0, and we fall back
    to the target so the result is still a distribution.
    """
    weights = (target_probs.double() - draft_probs.double()).clamp(min=0.0)
    total = weights.sum(-1, keepdim=True)
    return torch.where(total > 0, weights / torch.where(total > 0, total, 1.0), target_probs.double())


def sample_categorical(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample of index ~ probs (last axis) with one uniform per row; no host sync.

    probs: [..., vocab] non-negative weights (normalised here in float64); uniform: [...] in (0, 1).
    Zero-weight indices are never returned: searchsorted(right=True) skips empty CDF steps, and rounding
    at the top end is clamped to the last index with positive weight.
    """
    cdf = probs.double().cumsum(-1)  # [..., vocab]
    target = (uniform.double() * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    vocab = probs.shape[-1]
    last_positive = vocab - 1 - (probs > 0).flip(-1).int().argmax(-1)
    return torch.minimum(index, last_positive)


def greedy_verify(draft_tokens: torch.Tensor, target_argmax: torch.Tensor, num_drafted: torch.Tensor):
    """Greedy chain verification: accept the longest prefix equal to the target's argmax, then commit the
    target's argmax at the first mismatch (recovered) or after the last drafted token (bonus).

    draft_tokens: [batch, k] int64; target_argmax: [batch, k + 1] int64; num_drafted: [batch] int64.
    Returns (output_tokens [batch, k + 1] PLACEHOLDER-padded, num_accepted [batch]).
    """
    batch, k = draft_tokens.shape
    slots = torch.arange(k, device=draft_tokens.device)
    match = (draft_tokens == target_argmax[:, :k]) & (slots < num_drafted[:, None])  # [batch, k]
    num_accepted = match.long().cumprod(-1).sum(-1)  # [batch]
    output = _commit_layout(draft_tokens, num_accepted, target_argmax.gather(1, num_accepted[:, None]).squeeze(1))
    return output, num_accepted


def rejection_sample(
    draft_tokens: torch.Tensor,  # [batch, k] int64
    draft_probs: torch.Tensor | None,  # [batch, k, vocab]; None = point-mass (deterministic) drafts
    target_probs: torch.Tensor,  # [batch, k + 1, vocab] processed target distributions
    num_drafted: torch.Tensor,  # [batch] int64, <= k (ragged rows)
    accept_uniform: torch.Tensor,  # [batch, k] float64 in (0, 1)
    emit_uniform: torch.Tensor,  # [batch, k + 1] float64 in (0, 1)
):
    """Exact speculative sampling on a chain (Leviathan et al. 2023, Chen et al. 2023).

    Returns (output_tokens [batch, k + 1] PLACEHOLDER-padded, num_accepted [batch]).
    """
    batch, k = draft_tokens.shape
    slots = torch.arange(k, device=draft_tokens.device)
    target_at_draft = target_probs[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [batch, k]
    if draft_probs is None:
        draft_at_draft = torch.ones_like(target_at_draft)
    else:
        draft_at_draft = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    accept = (accept_uniform.double() < accept_probability(target_at_draft, draft_at_draft)) & (slots < num_drafted[:, None])
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [batch]

    # The emitted token's law at slot j = num_accepted: the residual after a rejection, the target for a bonus.
    rows = torch.arange(batch, device=draft_tokens.device)
    target_at_stop = target_probs[rows, num_accepted]  # [batch, vocab]
    rejected = num_accepted < num_drafted
    if draft_probs is None:
        stop_slot = num_accepted.clamp(max=k - 1) if k else num_accepted
        point_mass = torch.zeros_like(target_at_stop)
        if k:
            point_mass.scatter_(-1, draft_tokens[rows, stop_slot][:, None], 1.0)
        draft_at_stop = point_mass
    else:
        draft_at_stop = draft_probs[rows, num_accepted.clamp(max=k - 1)] if k else torch.zeros_like(target_at_stop)
    emit_law = torch.where(rejected[:, None], residual_probs(target_at_stop, draft_at_stop), target_at_stop.double())
    emitted = sample_categorical(emit_law, emit_uniform.gather(1, num_accepted[:, None]).squeeze(1))
    return _commit_layout(draft_tokens, num_accepted, emitted), num_accepted


def _commit_layout(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, emitted: torch.Tensor) -> torch.Tensor:
    """[batch, k + 1]: accepted drafts, then the emitted token, then PLACEHOLDER."""
    batch, k = draft_tokens.shape
    slots = torch.arange(k + 1, device=draft_tokens.device)
    padded = torch.cat([draft_tokens, draft_tokens.new_full((batch, 1), PLACEHOLDER)], 1)
    output = torch.where(slots < num_accepted[:, None], padded, PLACEHOLDER)
    return output.scatter(1, num_accepted[:, None], emitted[:, None])


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """[batch, nodes] parent ids (topological order, parents[:, 0] == -1) -> [batch, nodes, nodes] bool,
    mask[b, i, j] = j is i or an ancestor of i (EAGLE's tree attention mask)."""
    batch, nodes = parents.shape
    mask = torch.eye(nodes, dtype=torch.bool, device=parents.device).repeat(batch, 1, 1)
    rows = torch.arange(batch, device=parents.device)
    for node in range(1, nodes):  # parents come first, so each parent's row is final when read
        mask[:, node] |= mask[rows, parents[:, node].clamp(min=0)]
    return mask
