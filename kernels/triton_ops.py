"""Triton kernels for verification ops, with the signatures of their torch twins in `kernels.reference`.

One program per batch row walks the ragged layout (vLLM's rejection sampler is the model); the Jacobi ops
(`coupled_resample`, `gumbel_argmax`) have no chain to walk and run one program per (row, slot), and
`group_mass` one program per (row, listed group), gathering that group's CSR members in blocks. Randomness
comes in as data, so a kernel and the reference agree token for token. On a CPU the kernels run only under
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
    # One program walks one row's tree from the root, so the walk is one function: a Triton kernel cannot return
    # the per-node state a split would hand between helpers (its twin is reference.tree_rejection_sample).
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


@triton.jit
def _sample_residual(target_row, draft_row, uniform, V: tl.constexpr, BLOCK_V: tl.constexpr):
    """Inverse-CDF draw from relu(target - draft) (the target where that is empty) with one float64 uniform,
    as `reference.sample_categorical`: the first index whose cumulative weight exceeds u * total, clamped to
    the last positive-weight index (V - 1 when no weight is positive)."""
    residual_total = tl.zeros((), dtype=tl.float64)
    for start in range(0, V, BLOCK_V):  # sweep 1: is the residual empty, and the total
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < V
        p = tl.load(target_row + offs, mask=inside, other=0.0).to(tl.float64)
        q = tl.load(draft_row + offs, mask=inside, other=0.0).to(tl.float64)
        residual_total += tl.sum(tl.maximum(p - q, 0.0), axis=0)
    use_residual = residual_total > 0
    total = residual_total
    if not use_residual:  # p == q: any draw will do, the reference draws from the target
        total = tl.zeros((), dtype=tl.float64)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            total += tl.sum(tl.load(target_row + offs, mask=offs < V, other=0.0).to(tl.float64), axis=0)
    threshold = uniform * total
    running = tl.zeros((), dtype=tl.float64)
    found = tl.full((), V, tl.int64)
    last_positive = tl.full((), -1, tl.int64)
    for start in range(0, V, BLOCK_V):  # sweep 2: first index whose cumulative weight passes the threshold
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < V
        p = tl.load(target_row + offs, mask=inside, other=0.0).to(tl.float64)
        q = tl.load(draft_row + offs, mask=inside, other=0.0).to(tl.float64)
        # (a where, not a load mask: the interpreter cannot splat a scalar float comparison into a mask)
        weight = tl.where(inside, tl.maximum(p - tl.where(use_residual, q, 0.0), 0.0), 0.0)
        cdf = running + tl.cumsum(weight, axis=0)
        found = tl.minimum(found, tl.min(tl.where((cdf > threshold) & inside, offs, V), axis=0).to(tl.int64))
        last_positive = tl.maximum(last_positive, tl.max(tl.where(weight > 0, offs, -1), axis=0).to(tl.int64))
        running += tl.sum(weight, axis=0)
    return tl.minimum(found, tl.where(last_positive >= 0, last_positive, V - 1))


@triton.jit
def _coupled_kernel(draft_tokens, draft_probs, target_probs, keep_uniform, draw_uniform, tokens_out, kept_out,
                    V: tl.constexpr, BLOCK_V: tl.constexpr):
    # one program per (row, slot), flattened: draft_tokens [B*K] int64; draft/target probs [B*K, V];
    # uniforms [B*K] float64; tokens_out [B*K] int64; kept_out [B*K] int8
    slot = tl.program_id(0).to(tl.int64)
    token = tl.load(draft_tokens + slot)
    at = tl.maximum(token, 0)  # PLACEHOLDER drafts are read at token 0, as the reference gathers them
    target_row = target_probs + slot * V
    draft_row = draft_probs + slot * V
    target_p = tl.load(target_row + at).to(tl.float64)
    draft_p = tl.load(draft_row + at).to(tl.float64)
    keep_p = tl.where(draft_p > 0, tl.minimum(target_p / tl.where(draft_p > 0, draft_p, 1.0), 1.0), 0.0)
    kept = tl.load(keep_uniform + slot) < keep_p
    result = token
    if not kept:  # only rejected slots sweep the vocabulary
        result = _sample_residual(target_row, draft_row, tl.load(draw_uniform + slot), V, BLOCK_V)
    tl.store(tokens_out + slot, result)
    tl.store(kept_out + slot, kept.to(tl.int8))


def coupled_resample(draft_tokens, draft_probs, target_probs, keep_uniform, draw_uniform):
    """Triton twin of `reference.coupled_resample`."""
    batch, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    device = draft_tokens.device
    tokens = torch.full((batch, k), _UNWRITTEN, dtype=torch.long, device=device)
    kept = torch.full((batch, k), _UNWRITTEN, dtype=torch.int8, device=device)
    if batch * k:
        _coupled_kernel[(batch * k,)](
            draft_tokens.contiguous(), draft_probs.contiguous(), target_probs.contiguous(),
            keep_uniform.double().contiguous(), draw_uniform.double().contiguous(), tokens, kept,
            V=vocab, BLOCK_V=min(BLOCK, triton.next_power_of_2(vocab)))
    return tokens, kept.bool()


@triton.jit
def _gumbel_kernel(target_probs, exponential, out, V: tl.constexpr, BLOCK_V: tl.constexpr):
    # one program per row of [R, V]: argmax of target / exponential in float64, the first maximal index on
    # ties and the first NaN if there is one (torch.argmax's rules)
    row = tl.program_id(0).to(tl.int64)
    best = tl.full((), float("-inf"), tl.float64)
    best_index = tl.zeros((), dtype=tl.int64)
    first_nan = tl.full((), V, tl.int64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < V
        p = tl.load(target_probs + row * V + offs, mask=inside, other=0.0).to(tl.float64)
        e = tl.load(exponential + row * V + offs, mask=inside, other=1.0).to(tl.float64)
        score = p / e
        nan = (score != score) & inside  # noqa: PLR0124  (NaN test)
        first_nan = tl.minimum(first_nan, tl.min(tl.where(nan, offs, V), axis=0).to(tl.int64))
        score = tl.where(inside & ~nan, score, float("-inf"))
        block_best = tl.max(score, axis=0)
        block_index = tl.min(tl.where(score == block_best, offs, V), axis=0).to(tl.int64)
        better = block_best > best  # strict: an equal maximum in a later block loses to the earlier one
        best_index = tl.where(better, block_index, best_index)
        best = tl.where(better, block_best, best)
    tl.store(out + row, tl.where(first_nan < V, first_nan, best_index))


def gumbel_argmax(target_probs, exponential):
    """Triton twin of `reference.gumbel_argmax` (leading axes broadcast as in torch)."""
    target_probs, exponential = torch.broadcast_tensors(target_probs, exponential)
    shape = target_probs.shape
    vocab = shape[-1]
    out = torch.full(shape[:-1], _UNWRITTEN, dtype=torch.long, device=target_probs.device)
    rows = out.numel()
    if rows:
        _gumbel_kernel[(rows,)](target_probs.reshape(rows, vocab).contiguous(),
                                exponential.reshape(rows, vocab).contiguous(), out,
                                V=vocab, BLOCK_V=min(BLOCK, triton.next_power_of_2(vocab)))
    return out


@triton.jit
def _group_mass_kernel(probs, group_ids, indptr, member_ids, member_weights, out, M, V,
                       HAS_WEIGHTS: tl.constexpr, MAX_MEMBERS: tl.constexpr, BLOCK_G: tl.constexpr):
    # one program per (row, listed group), flattened: probs [R, V]; group_ids [R*M] int64; out [R*M] float64
    slot = tl.program_id(0).to(tl.int64)
    row = slot // M
    group = tl.load(group_ids + slot)
    listed = group >= 0
    at = tl.maximum(group, 0)
    start = tl.load(indptr + at).to(tl.int64)
    end = tl.where(listed, tl.load(indptr + at + 1).to(tl.int64), start)  # an unlisted group weighs nothing
    total = tl.zeros((), dtype=tl.float64)
    for offset in range(0, MAX_MEMBERS, BLOCK_G):  # a compile-time bound: the interpreter needs Python ints
        entries = start + offset + tl.arange(0, BLOCK_G)
        inside = entries < end
        tokens = tl.load(member_ids + entries, mask=inside, other=0).to(tl.int64)
        mass = tl.load(probs + row * V + tokens, mask=inside, other=0.0).to(tl.float64)
        if HAS_WEIGHTS:
            mass = mass * tl.load(member_weights + entries, mask=inside, other=0.0).to(tl.float64)
        total += tl.sum(tl.where(inside, mass, 0.0), axis=0)
    tl.store(out + slot, total)


def group_mass(probs, group_ids, indptr, member_ids, member_weights, max_members):
    """Triton twin of `reference.group_mass`."""
    rows, m = group_ids.shape
    out = torch.full((rows, m), float("nan"), dtype=torch.float64, device=probs.device)  # unwritten slots show
    if rows * m == 0:
        return out
    if member_ids.numel() == 0:
        return out.zero_()
    has_weights = member_weights is not None
    block = min(BLOCK, triton.next_power_of_2(max(max_members, 1)))
    _group_mass_kernel[(rows * m,)](
        probs.contiguous(), group_ids.long().contiguous(), indptr.contiguous(), member_ids.contiguous(),
        member_weights.contiguous() if has_weights else probs, out, m, probs.shape[-1],
        HAS_WEIGHTS=has_weights, MAX_MEMBERS=max(max_members, 1), BLOCK_G=block)
    return out
