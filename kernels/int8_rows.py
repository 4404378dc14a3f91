"""A row-invariant int8 x fp32 matrix product for CPUs (the served models' linear layers), built on first use.

out[m, n] = scales[n] * sum_k x[m, k] * w[n, k], with w int8 [N, K], x and scales float32. Every output has
one AVX2 accumulator fed k = 0, 8, 16, ... in order and one fixed horizontal sum, whatever the number of rows
M: blocking over rows and over outputs changes the speed, never a bit of the result. That is what makes
speculative verification of the served model exact: a token scored in a window of 6 gets the logits it gets alone.
Up to 6 rows (8 with AVX-512) one pass streams the int8 weights once, so on Gemma 3's 262,144 x 640 output layer
(1 thread, AVX2, on an earlier machine and before prefetching) 1, 4 and 6 rows cost about 31, 39 and 44 ms, against
31, 48 and 86 ms for `torch._weight_int8pack_mm`, whose 4-row blocks re-read the weights. More rows run in balanced
groups of at most 6, one pass each: from about 4 rows on one core is bound by arithmetic, not by reading the weights,
so a pass per group cost less than keeping slices of the weights in cache for every group or widening them to
float once (both tried before; benchmarks/int8-kernel-latest.md).

Where the CPU has AVX-512F the same scheme also runs 16 lanes wide (32 registers, so bigger blocks): a layer whose
K is a multiple of 16 always takes that path, whatever M, so row invariance holds within it (its sums differ
from the 8-lane path's, so the two are never mixed in one layer). On Gemma 3's output layer 4, 6 and 8 rows then
cost about 7, 11 and 15 ms, and its other layers about half of the AVX2 path's (benchmarks/int8-kernel-latest.md; one
row is bound by memory bandwidth either way).

Each block first prefetches the int8 rows PREFETCH_BLOCKS blocks ahead: on Gemma's 168 MB output layer the
hardware prefetcher alone read about 13 GB/s on one core here, and one row took 18 ms where it now takes about 7.5
(benchmarks/int8-kernel-latest.md). Prefetching changes no arithmetic.

The C++ source is csrc/int8_rows.cpp; `cpu_build` compiles it once with torch's `cpp_extension` (g++ and ninja;
about 40 s) into torch's extension cache, with AVX-512 code only where this CPU has it. Without a compiler or
without AVX2/FMA, `available()` is False and `Int8Linear` uses
`torch._weight_int8pack_mm` with bf16 activations, which is row-invariant too (with coarser logits).
`reference` is the torch twin the kernel is tested against.
"""

from __future__ import annotations

import torch

from specgen.kernels import cpu_build

_module = None
_tried = False


def load():
    """The compiled module, or None where it cannot be built (then callers fall back)."""
    global _module, _tried
    if not _tried:
        _tried = True
        _module = cpu_build.build("specgen_int8_rows_", ("int8_rows.cpp",), ["int8_rows_mm", "has_wide"],
                                  "SPECGEN_INT8_KERNEL", "int8", "using torch._weight_int8pack_mm")
    return _module


def available() -> bool:
    return load() is not None


def wide() -> bool:
    """Whether layers with K a multiple of 16 run the 16-lane AVX-512 path (else the 8-lane AVX2 one)."""
    return available() and bool(load().has_wide())


def int8_rows_mm(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, wide: bool = True) -> torch.Tensor:
    """x [M, K] float32, weight [N, K] int8, scales [N] float32 -> [M, N] float32 (K a multiple of 8). `wide`
    allows the AVX-512 path where it is built and K % 16 == 0; a layer's path never depends on M."""
    return load().int8_rows_mm(x, weight, scales, wide)


def reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The torch twin (same value up to float32 summation order): x @ (weight * scales)^T."""
    return x.double() @ (weight.double() * scales.double()[:, None]).T
