"""Counter-based randomness keyed by (seed, sample, absolute position, purpose, lane).

The same key always gives the same number, whatever the batch, the draft length or the kernel backend, so
results are reproducible, sample i of N is seeded (seed, i) and independent of batching, and a Triton kernel
can be checked against the torch path exactly. Each decision uses its own key, so decisions at different
positions or purposes are independent.

Hash: Wellons' "lowbias32" 32-bit integer finaliser chained over the key words, in uint64 arithmetic masked
to 32 bits (the Triton kernels can do the same in uint32). Two hashes give 52 bits: u = (m + 0.5) / 2**52,
exactly representable and strictly inside (0, 1) (float32 `rand` returns exactly 0 far too often for `u < ratio` tests).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF


class Purpose(IntEnum):
    DRAFT = 1  # the draft's own sampling
    ACCEPT = 2  # accept/reject tests
    EMIT = 3  # recovered and bonus tokens (and plain decoding)
    DRAFT_GUMBEL = 4  # per-vocabulary noise for sampling without replacement
    JACOBI_INIT = 5  # Jacobi drafts that fill an empty window slot
    JACOBI_DRAFT = 6  # Jacobi re-drafts of uncommitted slots (and the coupling's residual draws)
    JACOBI_COUPLE = 7  # the maximal coupling's keep-or-resample test
    JACOBI_GUMBEL = 8  # per-vocabulary Gumbel noise shared by every iteration at one position
    GROUP_OWNER = 9  # PCG: the owner group a drafted (or bonus) token is tested (or tagged) in
    GROUP_THIN = 10  # PCG: thinning rounds of the residual (lanes 3r, 3r+1, 3r+2: token, owner, keep of round r)
    GROUP_MEMBER = 11  # PCG: the token drawn inside the residual group (explicit residual)


def _mix32(x: np.ndarray) -> np.ndarray:
    # uint64 holds the product of two 32-bit numbers exactly; masking keeps the low 32 bits
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def _words(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.int64).astype(np.uint64) & np.uint64(_MASK32)


def counter_uniform(seed: int, sample, position, purpose: int, lane=0) -> torch.Tensor:
    """float64 uniforms in (0, 1), one per broadcast element of (sample, position, lane). Computed with numpy
    integer arithmetic on the host: a handful of vector ops instead of hundreds of tiny torch launches."""
    sample, position, lane = _words(sample), _words(position), _words(lane)
    seed &= (1 << 64) - 1
    h = _mix32(np.uint64(seed & _MASK32) ^ np.uint64(0x9E3779B9))
    h = _mix32(h ^ np.uint64(seed >> 32))
    h = _mix32(h ^ sample)
    h = _mix32(h ^ position)
    h = _mix32(h ^ np.uint64(int(purpose)))
    h = _mix32(h ^ lane)
    high = _mix32(h ^ np.uint64(0x68E31DA4)) >> np.uint64(6)  # 26 bits
    low = _mix32(h ^ np.uint64(0xB5297A4D)) >> np.uint64(6)  # 26 bits
    m = (high << np.uint64(26)) | low  # 52 bits; m + 0.5 is exact below 2**52
    return torch.from_numpy(np.asarray((m.astype(np.float64) + 0.5) / float(1 << 52), dtype=np.float64))


def counter_exponential(seed: int, sample, position, purpose: int, lane=0) -> torch.Tensor:
    """Exp(1) variates (for Gumbel-top-k / exponential races): -log(u), finite and > 0."""
    return -torch.log(counter_uniform(seed, sample, position, purpose, lane))


def chain_noise(seed: int, sample_ids: torch.Tensor, start: torch.Tensor, k: int):
    """Noise for verifying k drafted tokens at absolute positions start+1 .. start+k (start = the pending
    token's position) and for emitting at start+1 .. start+k+1. Returns (accept [batch, k], emit [batch, k+1])."""
    offsets = torch.arange(1, k + 2)
    positions = start[:, None] + offsets  # [batch, k + 1]
    accept = counter_uniform(seed, sample_ids[:, None], positions[:, :k], Purpose.ACCEPT)
    emit = counter_uniform(seed, sample_ids[:, None], positions, Purpose.EMIT)
    return accept, emit


def draft_uniforms(seed: int, sample_ids: torch.Tensor, first: torch.Tensor, k: int) -> torch.Tensor:
    """[batch, k] the draft's own uniforms for slots at absolute positions first .. first + k - 1, in one call (the
    values a call per slot would give: a call costs ~0.13 ms, a tenth of a small draft model's whole step)."""
    return counter_uniform(seed, sample_ids[:, None], first[:, None] + torch.arange(k), Purpose.DRAFT)


def tree_noise(seed: int, sample_ids: torch.Tensor, start: torch.Tensor, depths: torch.Tensor,
               sibling_rank: torch.Tensor):
    """Per-node noise: node n is tested at position start + depth[n] in lane = its rank among its siblings
    (only one node per (depth, rank) is ever tested along the walked path); the token after node n is emitted
    at start + depth[n] + 1. A chain tree gets exactly `chain_noise`. Returns (accept, emit), both [batch, nodes]."""
    positions = start[:, None] + depths
    accept = counter_uniform(seed, sample_ids[:, None], positions, Purpose.ACCEPT, sibling_rank)
    emit = counter_uniform(seed, sample_ids[:, None], positions + 1, Purpose.EMIT)
    return accept, emit
