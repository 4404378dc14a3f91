#include "torch_lean.h"
#include <immintrin.h>
#include <cmath>
#include <vector>

typedef float v16 __attribute__((vector_size(64)));  // one zmm with AVX-512, two ymm otherwise: same lanes
static const int64_t MAX_BLOCKS = 16;  // head dimensions up to 256 keep their weighted sums in registers

static inline float dot(const float* a, const float* b, int64_t d) {
  v16 acc = {0};
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    v16 x, y;
    __builtin_memcpy(&x, a + i, 64);
    __builtin_memcpy(&y, b + i, 64);
    acc += x * y;
  }
  float lanes[16];
  __builtin_memcpy(lanes, &acc, 64);
  float s = 0.f;
  for (int l = 0; l < 16; ++l) s += lanes[l];  // one fixed horizontal order
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}

typedef int v16i __attribute__((vector_size(64)));

// Sixteen keys' dot products with one query at once (d a multiple of 16): per key, the products summed block by
// block in its 16 lanes as in dot(), then the lanes of all sixteen folded pairwise in four shuffle-and-add rounds.
// Every key's sum takes the same tree whatever its place in the block, so it depends only on the key and the query.
static inline v16 dot16(const float* a, const float* const* b, int64_t d) {
#ifdef __AVX512F__
  v16 acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = (v16){0};
  for (int64_t i = 0; i < d; i += 16) {
    v16 x;
    __builtin_memcpy(&x, a + i, 64);
    for (int k = 0; k < 16; ++k) {
      v16 y;
      __builtin_memcpy(&y, b[k] + i, 64);
      acc[k] += x * y;
    }
  }
  const v16i lo1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const v16i hi1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const v16i lo2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const v16i hi2 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  const v16i lo3 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const v16i hi3 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  const v16i lo4 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const v16i hi4 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  v16 c[8], e[4], f[2];
  for (int m = 0; m < 8; ++m)  // keys 2m, 2m+1: 8 partial sums each
    c[m] = __builtin_shuffle(acc[2 * m], acc[2 * m + 1], lo1) + __builtin_shuffle(acc[2 * m], acc[2 * m + 1], hi1);
  for (int m = 0; m < 4; ++m)  // keys 4m..4m+3: 4 each
    e[m] = __builtin_shuffle(c[2 * m], c[2 * m + 1], lo2) + __builtin_shuffle(c[2 * m], c[2 * m + 1], hi2);
  for (int m = 0; m < 2; ++m)  // keys 8m..8m+7: 2 each
    f[m] = __builtin_shuffle(e[2 * m], e[2 * m + 1], lo3) + __builtin_shuffle(e[2 * m], e[2 * m + 1], hi3);
  return __builtin_shuffle(f[0], f[1], lo4) + __builtin_shuffle(f[0], f[1], hi4);  // lane k: key k
#else
  // AVX2 holds a 16-lane accumulator in two of its 16 registers: four keys at a time stay in registers (sixteen
  // spilled to the stack on every product). Each key's lanes still take fma(q, k, .) block by block in order.
  // The lanes of the sixteen keys are then folded by the AVX-512 build's tree, on the halves: the same adds, the
  // lanes moved between them.
  __m256 lo[16], hi[16];
  for (int g = 0; g < 16; g += 4) {
    for (int k = g; k < g + 4; ++k) lo[k] = hi[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      const __m256 xlo = _mm256_loadu_ps(a + i), xhi = _mm256_loadu_ps(a + i + 8);
      for (int k = g; k < g + 4; ++k) {
        lo[k] = _mm256_fmadd_ps(xlo, _mm256_loadu_ps(b[k] + i), lo[k]);
        hi[k] = _mm256_fmadd_ps(xhi, _mm256_loadu_ps(b[k] + i + 8), hi[k]);
      }
    }
  }
  // c[m]: key 2m's lanes j + (j + 8) in its low half, key 2m + 1's in its high half
  __m256 c[16];
  for (int m = 0; m < 8; ++m) {
    c[2 * m] = _mm256_add_ps(lo[2 * m], hi[2 * m]);
    c[2 * m + 1] = _mm256_add_ps(lo[2 * m + 1], hi[2 * m + 1]);
  }
  // e[m] (keys 4m..4m+3, 4 partial sums each): lanes j + (j + 4) within each key's 8
  __m256 e[8];
  for (int m = 0; m < 4; ++m)
    for (int h = 0; h < 2; ++h) {
      const __m256 x = c[4 * m + 2 * h], y = c[4 * m + 2 * h + 1];  // the halves of c[2m + h]
      e[2 * m + h] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
    }
  // f[m] (keys 8m..8m+7, 2 each): lanes (0, 1) + (2, 3) of each 4, back in key order
  __m256 f[4];
  for (int m = 0; m < 2; ++m)
    for (int h = 0; h < 2; ++h) {
      const __m256 x = e[4 * m + 2 * h], y = e[4 * m + 2 * h + 1];  // the halves of e[2m + h]
      const __m256 sum = _mm256_add_ps(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
      f[2 * m + h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(sum), _MM_SHUFFLE(3, 1, 2, 0)));
    }
  // lane k: key k, the pairs of f's lanes added
  v16 out;
  for (int h = 0; h < 2; ++h) {
    const __m256 sum = _mm256_hadd_ps(f[2 * h], f[2 * h + 1]);
    const __m256 keys = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(sum), _MM_SHUFFLE(3, 1, 2, 0)));
    __builtin_memcpy(reinterpret_cast<char*>(&out) + 32 * h, &keys, 32);
  }
  return out;
#endif
}

// exp(x) for x <= 0, sixteen at a time: 2^(x log2 e) as 2^n times a degree-7 polynomial on [-1/2, 1/2] (relative
// error ~1e-7); below about -87 the result is 0, as the weights of keys that far under the maximum are.
static inline v16 exp16(v16 x) {
  const v16 t = x * 1.4426950408889634f;
  const v16 clamped = t < -126.f ? (v16){0} - 126.f : t;
  const v16 n = (clamped + 12582912.f) - 12582912.f;  // round to nearest (|t| < 2^22)
  const v16 f = clamped - n;
  v16 p = f * 1.5252733804059841e-05f + 1.5403530393381606e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.6181291076284772e-03f;
  p = p * f + 5.5504108664821580e-02f;
  p = p * f + 2.4022650695910071e-01f;
  p = p * f + 6.9314718055994531e-01f;
  p = p * f + 1.f;
  const v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
  v16 scale;
  __builtin_memcpy(&scale, &bits, 64);
  v16 out = p * scale;
  return t < -126.f ? (v16){0} : out;
}

#ifndef __AVX512F__
// The weighted values of one query, as the AVX-512 path computes them (per lane: the even keys' fma chain in key
// order, the odd keys' likewise, their sum times 1 / (the even weights' sum, then + the odd weights' sum)), one
// 16-lane block of the head at a time so the four accumulators stay in registers.
static void weighted_values_avx2(const float* weights, const int64_t* cols, int64_t count, const float* vb,
                                 int64_t vs, int64_t blocks, float* o) {
  float total = 0.f, total_odd = 0.f;
  int64_t c = 0;
  for (; c + 2 <= count; c += 2) {
    total += weights[c];
    total_odd += weights[c + 1];
  }
  if (c < count) total += weights[c];
  total += total_odd;
  const float inv = count ? 1.f / total : 0.f;
  const __m256 scale = _mm256_set1_ps(inv);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 elo = _mm256_setzero_ps(), ehi = elo, olo = elo, ohi = elo;
    int64_t k = 0;
    for (; k + 2 <= count; k += 2) {
      const float* v0 = vb + cols[k] * vs + 16 * b;
      const float* v1 = vb + cols[k + 1] * vs + 16 * b;
      const __m256 w0 = _mm256_set1_ps(weights[k]), w1 = _mm256_set1_ps(weights[k + 1]);
      elo = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0), elo);
      ehi = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 8), ehi);
      olo = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1), olo);
      ohi = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + 8), ohi);
    }
    if (k < count) {
      const float* v0 = vb + cols[k] * vs + 16 * b;
      const __m256 w0 = _mm256_set1_ps(weights[k]);
      elo = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0), elo);
      ehi = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 8), ehi);
    }
    _mm256_storeu_ps(o + 16 * b, _mm256_mul_ps(_mm256_add_ps(elo, olo), scale));
    _mm256_storeu_ps(o + 16 * b + 8, _mm256_mul_ps(_mm256_add_ps(ehi, ohi), scale));
  }
}
#endif

// q [rows, heads, n, d]; keys/values [rows, kv_heads, width, d] (last dim contiguous, any other strides);
// seen: empty (prefix rule) or [rows, n, width] bool. Returns [rows, n, heads * d].
torch::Tensor attend_queries(torch::Tensor q, torch::Tensor keys, torch::Tensor values, torch::Tensor seen,
                             double scaling) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && keys.scalar_type() == torch::kFloat32 &&
              values.scalar_type() == torch::kFloat32, "float32 only");
  TORCH_CHECK(q.stride(3) == 1 && keys.stride(3) == 1 && values.stride(3) == 1, "last dim must be contiguous");
  const int64_t rows = q.size(0), heads = q.size(1), n = q.size(2), d = q.size(3);
  const int64_t kv_heads = keys.size(1), width = keys.size(2), group = heads / kv_heads;
  const bool prefix = seen.numel() == 0;
  torch::Tensor seen_c = prefix ? seen : seen.to(torch::kBool).contiguous();
  const bool* seen_p = prefix ? nullptr : seen_c.data_ptr<bool>();
  auto out = torch::empty({rows, n, heads * d}, q.options());
  float* out_p = out.data_ptr<float>();
  const float* q_p = q.data_ptr<float>();
  const float* k_p = keys.data_ptr<float>();
  const float* v_p = values.data_ptr<float>();
  const float scale = (float)scaling;
  std::vector<float> scores(width + 16), weights(width + 16), acc(d), zeros(d, 0.f);
  std::vector<int64_t> cols(width);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < n; ++s) {
      int64_t count = 0;
      if (prefix) {
        for (int64_t j = 0; j < width - n + s + 1; ++j) cols[count++] = j;
      } else {
        const bool* m = seen_p + (r * n + s) * width;
        for (int64_t j = 0; j < width; ++j) if (m[j]) cols[count++] = j;
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kh = h / group;
        const float* qv = q_p + r * q.stride(0) + h * q.stride(1) + s * q.stride(2);
        const float* kb = k_p + r * keys.stride(0) + kh * keys.stride(1);
        const float* vb = v_p + r * values.stride(0) + kh * values.stride(1);
        float top = -INFINITY;
        float total = 0.f;
        float* o = out_p + (r * n + s) * heads * d + h * d;
        if (d % 16 == 0 && d <= 16 * MAX_BLOCKS) {
          // sixteen keys at a time (the last block padded with a zero key), then weights sixteen at a time
          const int64_t ks = keys.stride(2);
          for (int64_t c = 0; c < count; c += 16) {
            const float* ptrs[16];
            for (int k = 0; k < 16; ++k) ptrs[k] = c + k < count ? kb + cols[c + k] * ks : zeros.data();
            v16 block = dot16(qv, ptrs, d) * scale;
            __builtin_memcpy(&scores[c], &block, 64);
          }
          for (int64_t c = 0; c < count; ++c) top = scores[c] > top ? scores[c] : top;
          for (int64_t c = 0; c < count; c += 16) {
            v16 block;
            __builtin_memcpy(&block, &scores[c], 64);
            block = exp16(block - top);
            __builtin_memcpy(&weights[c], &block, 64);
          }
          // even and odd keys in two sets of accumulators (two independent chains), added at the end
          const int64_t blocks = d / 16;
#ifndef __AVX512F__
          weighted_values_avx2(weights.data(), cols.data(), count, vb, values.stride(2), blocks, o);
          continue;
#endif
          v16 even[MAX_BLOCKS], odd[MAX_BLOCKS];
          for (int64_t b = 0; b < blocks; ++b) even[b] = odd[b] = (v16){0};
          float total_odd = 0.f;
          const int64_t vs = values.stride(2);
          int64_t c = 0;
          for (; c + 2 <= count; c += 2) {
            const float w0 = weights[c], w1 = weights[c + 1];
            total += w0;
            total_odd += w1;
            const float* v0 = vb + cols[c] * vs;
            const float* v1 = vb + cols[c + 1] * vs;
            for (int64_t b = 0; b < blocks; ++b) {
              v16 x0, x1;
              __builtin_memcpy(&x0, v0 + 16 * b, 64);
              __builtin_memcpy(&x1, v1 + 16 * b, 64);
              even[b] += w0 * x0;
              odd[b] += w1 * x1;
            }
          }
          if (c < count) {
            const float w0 = weights[c];
            total += w0;
            const float* v0 = vb + cols[c] * vs;
            for (int64_t b = 0; b < blocks; ++b) {
              v16 x0;
              __builtin_memcpy(&x0, v0 + 16 * b, 64);
              even[b] += w0 * x0;
            }
          }
          total += total_odd;
          const float inv = count ? 1.f / total : 0.f;
          for (int64_t b = 0; b < blocks; ++b) {
            v16 y = (even[b] + odd[b]) * inv;
            __builtin_memcpy(o + 16 * b, &y, 64);
          }
          continue;
        }
        for (int64_t c = 0; c < count; ++c) {
          scores[c] = scale * dot(qv, kb + cols[c] * keys.stride(2), d);
          top = scores[c] > top ? scores[c] : top;
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t c = 0; c < count; ++c) {
          const float w = std::exp(scores[c] - top);
          total += w;
          const float* vv = vb + cols[c] * values.stride(2);
          for (int64_t i = 0; i < d; ++i) acc[i] += w * vv[i];
        }
        const float inv = count ? 1.f / total : 0.f;
        for (int64_t i = 0; i < d; ++i) o[i] = acc[i] * inv;
      }
    }
  }
  return out;
}
