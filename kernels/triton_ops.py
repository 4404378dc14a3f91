"""Triton kernels for verification ops, with the signatures of their torch twins in `kernels.reference`.

One program per batch row walks the ragged layout (vLLM's rejection sampler is the model). Randomness comes
in as data, so a kernel and the reference agree token for token. On a CPU the kernels run only under
`TRITON_INTERPRET=1` (set before this module is imported); tests use that.

Sampling is inverse-CDF with one uniform per row, over unnormalised weights (the threshold is u * total):
two sweeps over the vocabulary in BLOCK-sized tiles, no normalisation pass, no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specgen.kernels.reference import PLACEHOLDER

BLOCK = 1024
_UNWRITTEN = -7  # outputs start poisoned: a slot a kernel fails to write shows up in the tests


@triton.jit
def _rejection_kernel(draft_tokens, draft_probs, target_probs, num_drafted, accept_uniform, emit_uniform,
                      output, num_accepted_out, K: tl.constexpr, V: tl.constexpr,
                      HAS_DRAFT_PROBS: tl.constexpr, BLOCK_V: tl.constexpr):
    # K and V are compile-time constants: one compilation per draft length and vocabulary (and the
    # interpreter needs Python ints for loop bounds)
    # draft_tokens [B, K] int64; draft_probs [B, K, V]; target_probs [B, K+1, V]; output [B, K+1] int64
    row = tl.program_id(0).to(tl.int64)
    drafted = tl.load(num_drafted + row)
    accepted = tl.zeros((), dtype=tl.int64)
    alive = tl.full((), 1, tl.int1)
    for i in range(0, K):
        token = tl.load(draft_tokens + row * K + i)
        target_p = tl.load(target_probs + (row * (K + 1) + i) * V + token).to(tl.float64)
        if HAS_DRAFT_PROBS:
            draft_p = tl.load(draft_probs + (row * K + i) * V + token).to(tl.float64)
        else:
            draft_p = tl.full((), 1.0, tl.float64)
        u = tl.load(accept_uniform + row * K + i)
        ok = alive & (i < drafted) & (draft_p > 0) & (u < target_p / tl.where(draft_p > 0, draft_p, 1.0))
        accepted += ok.to(tl.int64)
        alive = ok
        tl.store(output + row * (K + 1) + i, tl.where(ok, token, PLACEHOLDER))
    tl.store(output + row * (K + 1) + K, PLACEHOLDER)  # overwritten below when every draft was accepted

    # the emitted token at slot `accepted`: residual after a rejection, target for the bonus
    rejected = accepted < drafted
    stop = tl.minimum(accepted, K - 1)
    stop_token = tl.load(draft_tokens + row * K + stop, mask=K > 0, other=0)
    target_row = target_probs + (row * (K + 1) + accepted) * V
    draft_row = draft_probs + (row * K + stop) * V
    residual_total = tl.zeros((), dtype=tl.float64)
    target_total = tl.zeros((), dtype=tl.float64)
    for start in range(0, V, BLOCK_V):  # sweep 1: totals
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < V
        p = tl.load(target_row + offs, mask=inside, other=0.0).to(tl.float64)
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_row + offs, mask=inside & rejected, other=0.0).to(tl.float64)
        else:
            q = tl.where(offs == stop_token, 1.0, 0.0).to(tl.float64)
        residual_total += tl.sum(tl.maximum(p - q, 0.0), axis=0)
        target_total += tl.sum(p, axis=0)
    use_residual = rejected & (residual_total > 0)  # p == q exactly: the residual is empty, use the target
    total = tl.where(use_residual, residual_total, target_total)
    threshold = tl.load(emit_uniform + row * (K + 1) + accepted) * total
    running = tl.zeros((), dtype=tl.float64)
    found = tl.full((), V, tl.int64)
    last_positive = tl.full((), -1, tl.int64)
    for start in range(0, V, BLOCK_V):  # sweep 2: first index whose cumulative weight passes the threshold
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < V
        p = tl.load(target_row + offs, mask=inside, other=0.0).to(tl.float64)
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_row + offs, mask=inside & use_residual, other=0.0).to(tl.float64)
        else:
            q = tl.where((offs == stop_token) & use_residual, 1.0, 0.0).to(tl.float64)
        weight = tl.where(inside, tl.maximum(p - q, 0.0), 0.0)
        cdf = running + tl.cumsum(weight, axis=0)
        hit = tl.min(tl.where((cdf > threshold) & inside, offs, V), axis=0).to(tl.int64)
        found = tl.minimum(found, hit)
        last_positive = tl.maximum(last_positive, tl.max(tl.where(weight > 0, offs, -1), axis=0).to(tl.int64))
        running += tl.sum(weight, axis=0)
    tl.store(output + row * (K + 1) + accepted, tl.minimum(found, last_positive))
    tl.store(num_accepted_out + row, accepted)


def rejection_sample(draft_tokens, draft_probs, target_probs, num_drafted, accept_uniform, emit_uniform):
    """Triton twin of `reference.rejection_sample`."""
    batch, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    output = torch.full((batch, k + 1), _UNWRITTEN, dtype=torch.long, device=draft_tokens.device)
    num_accepted = torch.empty(batch, dtype=torch.long, device=draft_tokens.device)
    has_draft = draft_probs is not None
    _rejection_kernel[(batch,)](
        draft_tokens.clamp(min=0).contiguous(), draft_probs.contiguous() if has_draft else target_probs,
        target_probs.contiguous(), num_drafted.contiguous(), accept_uniform.double().contiguous(),
        emit_uniform.double().contiguous(), output, num_accepted, k, vocab,
        HAS_DRAFT_PROBS=has_draft, BLOCK_V=min(BLOCK, triton.next_power_of_2(vocab)))
    return output, num_accepted


@triton.jit
def _greedy_kernel(draft_tokens, target_argmax, num_drafted, output, num_accepted_out, K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    drafted = tl.load(num_drafted + row)
    accepted = tl.zeros((), dtype=tl.int64)
    alive = tl.full((), 1, tl.int1)
    for i in range(0, K):
        token = tl.load(draft_tokens + row * K + i)
        ok = alive & (i < drafted) & (token == tl.load(target_argmax + row * (K + 1) + i))
        accepted += ok.to(tl.int64)
        alive = ok
        tl.store(output + row * (K + 1) + i, tl.where(ok, token, PLACEHOLDER))
    tl.store(output + row * (K + 1) + K, PLACEHOLDER)  # overwritten below when every draft was accepted
    tl.store(output + row * (K + 1) + accepted, tl.load(target_argmax + row * (K + 1) + accepted))
    tl.store(num_accepted_out + row, accepted)


def greedy_verify(draft_tokens, target_argmax, num_drafted):
    """Triton twin of `reference.greedy_verify`."""
    batch, k = draft_tokens.shape
    output = torch.full((batch, k + 1), _UNWRITTEN, dtype=torch.long, device=draft_tokens.device)
    num_accepted = torch.empty(batch, dtype=torch.long, device=draft_tokens.device)
    _greedy_kernel[(batch,)](draft_tokens.contiguous(), target_argmax.contiguous(), num_drafted.contiguous(),
                             output, num_accepted, k)
    return output, num_accepted


@triton.jit
def _ancestor_kernel(parents, mask, N: tl.constexpr):
    # one program per (row, node): walk to the root marking ancestors
    row = tl.program_id(0).to(tl.int64)
    node = tl.program_id(1).to(tl.int64)
    current = node
    while current >= 0:
        tl.store(mask + (row * N + node) * N + current, 1)
        current = tl.load(parents + row * N + current)


def ancestor_mask(parents):
    """Triton twin of `reference.ancestor_mask`."""
    batch, nodes = parents.shape
    mask = torch.zeros(batch, nodes, nodes, dtype=torch.int8, device=parents.device)
    _ancestor_kernel[(batch, nodes)](parents.contiguous(), mask, nodes)
    return mask.bool()


@triton.jit
def _normalise(row_ptr, V: tl.constexpr, BLOCK_V: tl.constexpr):
    """Divide a float64 row by its sum in place (the caller checked the sum is positive)."""
    total = tl.zeros((), dtype=tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        total += tl.sum(tl.load(row_ptr + offs, mask=offs < V, other=0.0), axis=0)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < V
        tl.store(row_ptr + offs, tl.load(row_ptr + offs, mask=inside, other=0.0) / total, mask=inside)


@triton.jit
def _drop_token(row_ptr, token, V: tl.constexpr, BLOCK_V: tl.constexpr):
    """Zero one entry and renormalise, unless nothing else has mass (then the row stays as it was)."""
    rest = tl.zeros((), dtype=tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        rest += tl.sum(tl.load(row_ptr + offs, mask=(offs < V) & (offs != token), other=0.0), axis=0)
    if rest > 0:
        tl.store(row_ptr + token, 0.0)
        _normalise(row_ptr, V, BLOCK_V)


@triton.jit
def _tree_kernel(tokens, children, draft_probs, target_probs, accept_uniform, emit_uniform,
                 residual_buf, draft_buf, path_out, output, num_accepted_out, rejected_out,
                 N: tl.constexpr, W: tl.constexpr, V: tl.constexpr, DEPTH: tl.constexpr,
                 HAS_DRAFT_PROBS: tl.constexpr, WITHOUT_REPLACEMENT: tl.constexpr, BLOCK_V: tl.constexpr):
    # tokens [B, N]; children [B, N, W] (-1 padded); draft/target probs [B, N, V]; uniforms [B, N] float64;
    # residual_buf/draft_buf [B, V] float64 scratch; path_out/output [B, DEPTH + 1]
    row = tl.program_id(0).to(tl.int64)
    residual_row = residual_buf + row * V
    draft_row = draft_buf + row * V
    node = tl.zeros((), dtype=tl.int64)
    depth = tl.zeros((), dtype=tl.int64)
    done = tl.zeros((), dtype=tl.int1)
    rejected = tl.zeros((), dtype=tl.int1)
    for slot in range(0, DEPTH + 1):
        tl.store(path_out + row * (DEPTH + 1) + slot, -1)
        tl.store(output + row * (DEPTH + 1) + slot, PLACEHOLDER)
    tl.store(path_out + row * (DEPTH + 1), 0)
    for level in range(0, DEPTH + 1):
        if not done:
            for start in range(0, V, BLOCK_V):  # the residual and draft laws start at the node's own
                offs = start + tl.arange(0, BLOCK_V)
                inside = offs < V
                p = tl.load(target_probs + (row * N + node) * V + offs, mask=inside, other=0.0)
                tl.store(residual_row + offs, p.to(tl.float64), mask=inside)
                if HAS_DRAFT_PROBS:
                    q = tl.load(draft_probs + (row * N + node) * V + offs, mask=inside, other=0.0)
                    tl.store(draft_row + offs, q.to(tl.float64), mask=inside)
            chosen = tl.full((), -1, tl.int64)
            tested = tl.zeros((), dtype=tl.int1)
            for rank in range(0, W):
                kid = tl.load(children + (row * N + node) * W + rank)
                if (kid >= 0) & (chosen < 0):
                    token = tl.load(tokens + row * N + kid)
                    target_p = tl.load(residual_row + token)
                    if HAS_DRAFT_PROBS:
                        draft_p = tl.load(draft_row + token)
                    else:
                        draft_p = tl.full((), 1.0, tl.float64)
                    u = tl.load(accept_uniform + row * N + kid)
                    if (draft_p > 0) & (u < target_p / tl.where(draft_p > 0, draft_p, 1.0)):
                        chosen = kid
                    else:
                        tested = True
                        if HAS_DRAFT_PROBS:
                            if draft_p > 0:  # a zero-probability child was never drawn: no update
                                weight_total = tl.zeros((), dtype=tl.float64)
                                for start in range(0, V, BLOCK_V):
                                    offs = start + tl.arange(0, BLOCK_V)
                                    inside = offs < V
                                    p = tl.load(residual_row + offs, mask=inside, other=0.0)
                                    q = tl.load(draft_row + offs, mask=inside, other=0.0)
                                    weight_total += tl.sum(tl.maximum(p - q, 0.0), axis=0)
                                if weight_total > 0:
                                    for start in range(0, V, BLOCK_V):
                                        offs = start + tl.arange(0, BLOCK_V)
                                        inside = offs < V
                                        p = tl.load(residual_row + offs, mask=inside, other=0.0)
                                        q = tl.load(draft_row + offs, mask=inside, other=0.0)
                                        tl.store(residual_row + offs, tl.maximum(p - q, 0.0), mask=inside)
                                    _normalise(residual_row, V, BLOCK_V)
                                if WITHOUT_REPLACEMENT:
                                    _drop_token(draft_row, token, V, BLOCK_V)
                        else:
                            _drop_token(residual_row, token, V, BLOCK_V)  # p minus the point mass
            if chosen < 0:  # stop here: recovered token from the residual, or a bonus token at a leaf
                total = tl.zeros((), dtype=tl.float64)
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    total += tl.sum(tl.load(residual_row + offs, mask=offs < V, other=0.0), axis=0)
                threshold = tl.load(emit_uniform + row * N + node) * total
                running = tl.zeros((), dtype=tl.float64)
                found = tl.full((), V, tl.int64)
                last_positive = tl.full((), -1, tl.int64)
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    inside = offs < V
                    weight = tl.load(residual_row + offs, mask=inside, other=0.0)
                    cdf = running + tl.cumsum(weight, axis=0)
                    found = tl.minimum(found, tl.min(tl.where((cdf > threshold) & inside, offs, V), axis=0).to(tl.int64))
                    last_positive = tl.maximum(last_positive,
                                               tl.max(tl.where(weight > 0, offs, -1), axis=0).to(tl.int64))
                    running += tl.sum(weight, axis=0)
                tl.store(output + row * (DEPTH + 1) + depth, tl.minimum(found, last_positive))
                rejected = tested
                done = True
            else:
                tl.store(output + row * (DEPTH + 1) + depth, tl.load(tokens + row * N + chosen))
                depth += 1
                node = chosen
                tl.store(path_out + row * (DEPTH + 1) + depth, chosen)
    tl.store(num_accepted_out + row, depth)
    tl.store(rejected_out + row, rejected.to(tl.int8))


def tree_rejection_sample(tokens, parents, draft_probs, target_probs, accept_uniform, emit_uniform,
                          without_replacement):
    """Triton twin of `reference.tree_rejection_sample`."""
    from specgen.kernels.reference import tree_children

    batch, nodes = tokens.shape
    vocab = target_probs.shape[-1]
    children = tree_children(parents).contiguous()
    depth_bound = nodes - 1  # a path never has more accepted nodes than drafted ones
    device = tokens.device
    path = torch.full((batch, depth_bound + 1), _UNWRITTEN, dtype=torch.long, device=device)
    output = torch.full((batch, depth_bound + 1), _UNWRITTEN, dtype=torch.long, device=device)
    num_accepted = torch.empty(batch, dtype=torch.long, device=device)
    rejected = torch.empty(batch, dtype=torch.int8, device=device)
    residual = torch.empty(batch, vocab, dtype=torch.float64, device=device)
    draft = torch.empty(batch, vocab, dtype=torch.float64, device=device)
    has_draft = draft_probs is not None
    _tree_kernel[(batch,)](
        tokens.contiguous(), children, draft_probs.contiguous() if has_draft else target_probs,
        target_probs.contiguous(), accept_uniform.double().contiguous(), emit_uniform.double().contiguous(),
        residual, draft, path, output, num_accepted, rejected,
        N=nodes, W=children.shape[-1], V=vocab, DEPTH=depth_bound, HAS_DRAFT_PROBS=has_draft,
        WITHOUT_REPLACEMENT=bool(without_replacement), BLOCK_V=min(BLOCK, triton.next_power_of_2(vocab)))
    width = int(num_accepted.max()) + 1
    return path[:, :width], output[:, :width], num_accepted, rejected.bool()
