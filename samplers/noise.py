"""Counter-based randomness keyed by (seed, sample, absolute position, purpose, lane).

The same key always gives the same number, whatever the batch, the draft length or the kernel backend, so
results are reproducible, sample i of N is seeded (seed, i) and independent of batching, and a Triton kernel
can be checked against the torch path exactly. Each decision uses its own key, so decisions at different
positions or purposes are independent.

Hash: Wellons' "lowbias32" 32-bit integer finaliser chained over the key words, computed in int64 with
products split into 16-bit halves so nothing overflows. Two hashes give 52 bits: u = (m + 0.5) / 2**52,
exactly representable and strictly inside (0, 1) (float32 `rand` returns exactly 0 far too often for `u < ratio` tests).
"""

from __future__ import annotations

from enum import IntEnum

import torch

_MASK32 = 0xFFFFFFFF


class Purpose(IntEnum):
    DRAFT = 1  # the draft's own sampling
    ACCEPT = 2  # accept/reject tests
    EMIT = 3  # recovered and bonus tokens (and plain decoding)
    DRAFT_GUMBEL = 4  # per-vocabulary noise for sampling without replacement


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seed: int, sample, position, purpose: int, lane=0) -> torch.Tensor:
    """float64 uniforms in (0, 1), one per broadcast element of (sample, position, lane)."""
    sample, position, lane = (torch.as_tensor(v, dtype=torch.long) & _MASK32 for v in (sample, position, lane))
    seed &= (1 << 64) - 1
    h = _mix32(torch.tensor(seed & _MASK32, dtype=torch.long) ^ 0x9E3779B9)
    h = _mix32(h ^ (seed >> 32))
    h = _mix32(h ^ sample)
    h = _mix32(h ^ position)
    h = _mix32(h ^ int(purpose))
    h = _mix32(h ^ lane)
    high = _mix32(h ^ 0x68E31DA4) >> 6  # 26 bits
    low = _mix32(h ^ 0xB5297A4D) >> 6  # 26 bits
    return ((high * (1 << 26) + low).double() + 0.5) / float(1 << 52)  # m + 0.5 is exact below 2**52


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


def tree_noise(seed: int, sample_ids: torch.Tensor, start: torch.Tensor, depths: torch.Tensor,
               sibling_rank: torch.Tensor):
    """Per-node noise: node n is tested at position start + depth[n] in lane = its rank among its siblings
    (only one node per (depth, rank) is ever tested along the walked path); the token after node n is emitted
    at start + depth[n] + 1. A chain tree gets exactly `chain_noise`. Returns (accept, emit), both [batch, nodes]."""
    positions = start[:, None] + depths
    accept = counter_uniform(seed, sample_ids[:, None], positions, Purpose.ACCEPT, sibling_rank)
    emit = counter_uniform(seed, sample_ids[:, None], positions + 1, Purpose.EMIT)
    return accept, emit
