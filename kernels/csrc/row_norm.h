// Row-wise norm and dot product in a fixed summation order, shared by decode_step.cpp and gemma_glue.cpp.
#pragma once
#include <immintrin.h>
#include <cmath>
#include <cstdint>

// One dot product (a norm's sum of squares, an attention score): two 8-lane FMA chains over 16-wide blocks, a last
// 8-wide block into the first chain, one fixed lane sum, then a scalar FMA tail; the same order in every call.
static inline float dot(const float* a, const float* b, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
  float l[8];
  _mm256_storeu_ps(l, _mm256_add_ps(a0, a1));
  float s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  for (int64_t j = i; j < n; ++j) s = std::fma(a[j], b[j], s);
  return s;
}

// x [rows, d] -> w * (x / sqrt(mean(x^2) + eps)), row by row
static void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t d, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float ss = dot(xr, xr, d);
    const float inv = 1.f / std::sqrt(ss / d + eps);
    for (int64_t i = 0; i < d; ++i) out[r * d + i] = w[i] * (xr[i] * inv);
  }
}

