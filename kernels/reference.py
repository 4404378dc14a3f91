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
    draft_tokens = draft_tokens.clamp(min=0)  # slots past num_drafted may hold PLACEHOLDER; they are masked below
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
    # Unnormalised weights: sample_categorical scales its uniform by their total.
    residual = (target_at_stop.double() - draft_at_stop.double()).clamp(min=0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, target_at_stop.double())  # p == q: any
    emit_weights = torch.where(rejected[:, None], residual, target_at_stop.double())
    emitted = sample_categorical(emit_weights, emit_uniform.gather(1, num_accepted[:, None]).squeeze(1))
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


def sibling_step(residual: torch.Tensor, draft: torch.Tensor | None, token: torch.Tensor, without_replacement: bool):
    """Test one child `token` against the current residual target law at its parent node.

    residual: [batch, vocab] float64 target law left after earlier siblings were rejected; draft: [batch, vocab]
    draft law the child was drawn from, or None for point-mass (deterministic) candidates; token: [batch].
    Returns (accept_prob [batch], residual_if_rejected, draft_if_rejected): on rejection the residual becomes
    norm(relu(residual - draft)) (the point mass at `token` when draft is None), and sampling without
    replacement also removes `token` from the draft law and renormalises it.
    """
    tried = torch.zeros_like(residual).scatter_(-1, token[:, None], 1.0)  # [batch, vocab]
    at_token = residual.gather(-1, token[:, None]).squeeze(-1)
    if draft is None:
        return accept_probability(at_token, torch.ones_like(at_token)), residual_probs(residual, tried), None
    draft_at_token = draft.gather(-1, token[:, None]).squeeze(-1)
    accept = accept_probability(at_token, draft_at_token)
    # A child the draft gave probability 0 was never really drawn (e.g. padding after sampling without
    # replacement exhausted the draft's support): it is rejected and leaves the state unchanged.
    drawn = (draft_at_token > 0)[:, None]
    next_residual = torch.where(drawn, residual_probs(residual, draft), residual)
    if without_replacement:
        remaining = draft * (1 - tried)
        total = remaining.sum(-1, keepdim=True)
        draft = torch.where(drawn & (total > 0), remaining / torch.where(total > 0, total, 1.0), draft)
    return accept, next_residual, draft


def tree_children(parents: torch.Tensor) -> torch.Tensor:
    """[batch, nodes] parents -> [batch, nodes, max_children] child ids in sibling order, -1 padded."""
    batch, nodes = parents.shape
    earlier = torch.ones(nodes, nodes, dtype=torch.bool, device=parents.device).tril(-1)  # [n, m]: m < n
    rank = ((parents[:, :, None] == parents[:, None, :]) & earlier).sum(-1)  # [batch, nodes]
    width = int(rank[:, 1:].max()) + 1 if nodes > 1 else 1
    children = parents.new_full((batch, nodes, width), -1)
    b, n = torch.nonzero(parents >= 0, as_tuple=True)
    children[b, parents[b, n], rank[b, n]] = n
    return children


def tree_rejection_sample(
    tokens: torch.Tensor,  # [batch, nodes] int64; node 0 = root
    parents: torch.Tensor,  # [batch, nodes] int64; topological order
    draft_probs: torch.Tensor | None,  # [batch, nodes, vocab]: law of each node's children; None = point masses
    target_probs: torch.Tensor,  # [batch, nodes, vocab]: processed target law after each node
    accept_uniform: torch.Tensor,  # [batch, nodes] float64: the test of node n uses accept_uniform[:, n]
    emit_uniform: torch.Tensor,  # [batch, nodes] float64: the token emitted after node n uses emit_uniform[:, n]
    without_replacement: bool,
):
    """Multi-candidate tree verification walking from the root, all rows at once (SpecInfer, Sequoia/MCSD,
    EAGLE-style deterministic candidates). At each node the children are tried in order with `sibling_step`;
    the first accepted child is descended into; when all are rejected a recovered token is drawn from the
    residual, and at a leaf a bonus token from the target.

    Returns (path [batch, max_depth + 1] accepted node ids from the root, -1 padded;
             output_tokens [batch, max_depth + 1] accepted tokens then the emitted one, PLACEHOLDER-padded;
             num_accepted [batch]; emitted_after_rejection [batch] bool).
    """
    batch, nodes = tokens.shape
    rows = torch.arange(batch, device=tokens.device)
    children = tree_children(parents)  # [batch, nodes, width]
    max_depth = int(children.gt(-1).any(-1).sum(-1).max()) if nodes > 1 else 0  # loose bound: inner nodes
    path = tokens.new_full((batch, max_depth + 2), -1)
    output = tokens.new_full((batch, max_depth + 2), PLACEHOLDER)
    path[:, 0] = 0
    node = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    depth = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    done = torch.zeros(batch, dtype=torch.bool, device=tokens.device)
    rejected = torch.zeros(batch, dtype=torch.bool, device=tokens.device)
    while not bool(done.all()):
        residual = target_probs[rows, node].double()
        draft = None if draft_probs is None else draft_probs[rows, node].double()
        chosen = torch.full_like(node, -1)
        tested = torch.zeros_like(done)
        for rank in range(children.shape[-1]):
            kid = children[rows, node, rank]
            live = (kid >= 0) & (chosen < 0) & ~done
            kid_token = tokens[rows, kid.clamp(min=0)]
            accept, next_residual, next_draft = sibling_step(residual, draft, kid_token, without_replacement)
            accepted = live & (accept_uniform[rows, kid.clamp(min=0)].double() < accept)
            chosen = torch.where(accepted, kid, chosen)
            moved_on = live & ~accepted
            tested |= moved_on
            residual = torch.where(moved_on[:, None], next_residual, residual)
            if draft is not None:
                draft = torch.where(moved_on[:, None], next_draft, draft)
        stopping = ~done & (chosen < 0)
        emitted = sample_categorical(residual, emit_uniform[rows, node])
        output[rows, depth] = torch.where(stopping, emitted, torch.where(done, output[rows, depth], tokens[rows, chosen.clamp(min=0)]))
        rejected |= stopping & tested
        advancing = ~done & (chosen >= 0)
        depth = depth + advancing.long()
        node = torch.where(advancing, chosen, node)
        path[rows, depth] = torch.where(advancing, chosen, path[rows, depth])
        done |= stopping
    width = int(depth.max()) + 1
    return path[:, :width], output[:, :width], depth, rejected


def coupled_resample(
    draft_tokens: torch.Tensor,  # [batch, k] int64: each slot's current draft
    draft_probs: torch.Tensor,  # [batch, k, vocab]: the law each current draft was drawn from
    target_probs: torch.Tensor,  # [batch, k, vocab]: this iteration's target law at each slot
    keep_uniform: torch.Tensor,  # [batch, k] float64 in (0, 1)
    draw_uniform: torch.Tensor,  # [batch, k] float64 in (0, 1)
):
    """Maximal coupling of consecutive Jacobi iterations (MC-SJD): every slot independently, with no break,
    keeps its draft with probability min(1, target/draft) and otherwise draws from norm(relu(target - draft)).
    The result is distributed as target_probs at every slot, and equals the old draft with the largest
    possible probability, 1 - TV(target, draft).

    Returns (tokens [batch, k] int64, kept [batch, k] bool)."""
    tokens = draft_tokens.clamp(min=0)[..., None]
    keep_prob = accept_probability(target_probs.gather(-1, tokens), draft_probs.gather(-1, tokens)).squeeze(-1)
    kept = keep_uniform.double() < keep_prob
    residual = (target_probs.double() - draft_probs.double()).clamp(min=0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, target_probs.double())  # p == q: any
    drawn = sample_categorical(residual, draw_uniform)
    return torch.where(kept, draft_tokens, drawn), kept


def gumbel_argmax(target_probs: torch.Tensor, exponential: torch.Tensor) -> torch.Tensor:
    """argmax_v target(v) / E_v (= argmax log target + Gumbel) per slot: a sample from target_probs that
    reuses the same noise [..., vocab] at a position in every Jacobi iteration (the Gumbel coupling).
    Zero-probability tokens are never chosen. Returns [...] int64."""
    return (target_probs.double() / exponential.double()).argmax(-1)


def group_mass(
    probs: torch.Tensor,  # [rows, vocab] a law per row
    group_ids: torch.Tensor,  # [rows, m] int64: groups to weigh in each row; -1 = none (mass 0)
    indptr: torch.Tensor,  # [groups + 1] int32/int64: members of group g are member_ids[indptr[g]:indptr[g + 1]]
    member_ids: torch.Tensor,  # [entries] int32/int64 token ids
    member_weights: torch.Tensor | None,  # [entries] weight of each member entry; None = all ones
    max_members: int,  # the largest group size (a Python int, so no host sync is needed)
) -> torch.Tensor:
    """The mass sum_u w[g, u] * probs[row, u] of each listed group g, over CSR group tables, in float64.

    PCG's coarse-grained laws P_c(g) = (W p)(g) use weights w[g, u] = 1 / |owners(u)|; without weights the
    same op gives the cumulative mass of a neighbour list (LANTERN++). Each listed group is gathered padded
    to `max_members` entries: the cost is rows * m * max_members, independent of the vocabulary.
    Returns [rows, m] float64.
    """
    rows, m = group_ids.shape
    if member_ids.numel() == 0:  # no group has a member
        return torch.zeros(rows, m, dtype=torch.float64, device=probs.device)
    listed = group_ids >= 0
    group = group_ids.clamp(min=0).long()
    indptr = indptr.long()
    starts = indptr[group]  # [rows, m]
    sizes = torch.where(listed, indptr[group + 1] - starts, 0)
    slots = torch.arange(max(max_members, 1), device=probs.device)
    inside = slots < sizes[..., None]  # [rows, m, max_members]
    entries = (starts[..., None] + slots).clamp(max=member_ids.numel() - 1)
    tokens = member_ids.long()[entries]  # [rows, m, max_members]
    mass = probs.double().gather(1, tokens.reshape(rows, m * slots.numel())).reshape(tokens.shape)
    if member_weights is not None:
        mass = mass * member_weights.double()[entries]
    return torch.where(inside, mass, 0.0).sum(-1)
