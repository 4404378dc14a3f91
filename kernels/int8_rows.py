"""A row-invariant int8 x fp32 matrix product for CPUs (the served models' linear layers), built on first use.

out[m, n] = scales[n] * sum_k x[m, k] * w[n, k], with w int8 [N, K], x and scales float32. Every output has
one AVX2 accumulator fed k = 0, 8, 16, ... in order and one fixed horizontal sum, whatever the number of rows
M: blocking over rows (up to 6 per pass over the weights) and over outputs changes the speed, never a bit of
the result. That is what makes speculative verification of the served model exact: a token scored in a
window of 6 gets the logits it gets alone. It also reads each weight once per 6 rows, so on Gemma 3's
262,144 x 640 output layer (1 thread, AVX2) 1, 4 and 6 rows cost about 31, 39 and 44 ms, against 31, 48 and
86 ms for `torch._weight_int8pack_mm`, whose 4-row blocks re-read the weights.

The extension compiles once with torch's `cpp_extension` (g++ and ninja; about 40 s) into torch's extension
cache. Without a compiler or without AVX2/FMA, `available()` is False and `Int8Linear` uses
`torch._weight_int8pack_mm` with bf16 activations, which is row-invariant too (with coarser logits).
`reference` is the torch twin the kernel is tested against.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform

import torch

log = logging.getLogger(__name__)

SOURCE = r"""
#include <torch/extension.h>
#include <immintrin.h>

static inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

static inline __m256 widen(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

// MB activation rows against NB weight rows at a time. Each output (m, n) has one accumulator fed k = 0, 8, 16, ...
// in order and one fixed horizontal sum, whatever MB and NB are: blocking changes speed, never the result.
template <int MB, int NB>
static void block(const float* x, const int8_t* w, const float* scales, float* out, int64_t n0, int64_t n1, int64_t K, int64_t ldo) {
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    __m256 acc[MB][NB];
    for (int m = 0; m < MB; ++m) for (int j = 0; j < NB; ++j) acc[m][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) {
      __m256 wv[NB];
      for (int j = 0; j < NB; ++j) wv[j] = widen(w + (n + j) * K + k);
      for (int m = 0; m < MB; ++m) {
        __m256 xv = _mm256_loadu_ps(x + m * K + k);
        for (int j = 0; j < NB; ++j) acc[m][j] = _mm256_fmadd_ps(xv, wv[j], acc[m][j]);
      }
    }
    for (int m = 0; m < MB; ++m) for (int j = 0; j < NB; ++j) out[m * ldo + n + j] = hsum(acc[m][j]) * scales[n + j];
  }
  if (NB > 1 && n < n1) block<MB, 1>(x, w, scales, out, n, n1, K, ldo);
}

template <int MB, int NB>
static void rows(const float* x, const int8_t* w, const float* s, float* o, int64_t N, int64_t K) { block<MB, NB>(x, w, s, o, 0, N, K, N); }

torch::Tensor int8_rows_mm(torch::Tensor x, torch::Tensor w, torch::Tensor scales) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && w.dtype() == torch::kInt8 && scales.dtype() == torch::kFloat32);
  x = x.contiguous(); w = w.contiguous(); scales = scales.contiguous();
  int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % 8 == 0, "K must be a multiple of 8");
  auto out = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>(); const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>(); float* op = out.data_ptr<float>();
  int64_t m = 0;
  for (; m + 6 < M; m += 6) rows<6, 2>(xp + m * K, wp, sp, op + m * N, N, K);  // 6 rows per pass over the weights
  const float* xr = xp + m * K; float* orow = op + m * N;
  switch (M - m) {
    case 1: rows<1, 6>(xr, wp, sp, orow, N, K); break;
    case 2: rows<2, 4>(xr, wp, sp, orow, N, K); break;
    case 3: rows<3, 3>(xr, wp, sp, orow, N, K); break;
    case 4: rows<4, 2>(xr, wp, sp, orow, N, K); break;
    case 5: rows<5, 2>(xr, wp, sp, orow, N, K); break;
    case 6: rows<6, 2>(xr, wp, sp, orow, N, K); break;
    default: break;
  }
  return out;
}
"""

_module = None
_tried = False


def _cpu_supported() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags


def load():
    """The compiled module, or None where it cannot be built (then callers fall back)."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("SPECGEN_INT8_KERNEL", "auto") == "off" or not _cpu_supported():
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        name = "specgen_int8_rows_" + hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
        log.info("building the int8 CPU kernel once (about 40 s)")
        _module = load_inline(name, cpp_sources=SOURCE, functions=["int8_rows_mm"],
                              extra_cflags=["-O3", "-mavx2", "-mfma"], verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the fallback
        log.warning("int8 CPU kernel unavailable (%s); using torch._weight_int8pack_mm", str(exc).splitlines()[0])
        _module = None
    return _module


def available() -> bool:
    return load() is not None


def int8_rows_mm(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32, weight [N, K] int8, scales [N] float32 -> [M, N] float32 (K a multiple of 8)."""
    return load().int8_rows_mm(x, weight, scales)


def reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The torch twin (same value up to float32 summation order): x @ (weight * scales)^T."""
    return x.double() @ (weight.double() * scales.double()[:, None]).T
