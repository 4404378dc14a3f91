#include "torch_lean.h"
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <vector>

#include "row_norm.h"  // dot, rms_norm

// out[r, o] = W[o] . x[r], tiled: up to ROW_TILE input rows x OUT_TILE weight rows per pass, every (row, output) pair
// one 16-lane FMA chain over the inputs (a zero-padded last block), reduced by one fixed shuffle tree. A tile's
// size changes only which pairs run side by side, never a pair's arithmetic, so a row gets the same bits alone
// as in any batch. The weight tile stays in L1 while every row group passes over it.
typedef float v16 __attribute__((vector_size(64)));
typedef int v16i __attribute__((vector_size(64)));
#ifdef __AVX512F__
constexpr int OUT_TILE = 4;  // 16 accumulators + 4 weight blocks fit the 32 vector registers
constexpr int ROW_TILE = 4;
#else
// AVX2 holds a v16 in two of its 16 registers: 2 rows x 2 outputs (8 registers of accumulators, 4 of weights, 2 of
// input) fit (the AVX2 `tile` below)
constexpr int OUT_TILE = 2;
constexpr int ROW_TILE = 2;
#endif
static_assert(OUT_TILE <= 4, "one fold4 reduces a row's whole output tile");

static const int64_t PREFETCH_TILES = 8;

static inline v16 load16(const float* p, int64_t left) {  // 16 floats, or the `left` < 16 remaining then zeros
  v16 v = {0};
  if (left >= 16) __builtin_memcpy(&v, p, 64);
  else __builtin_memcpy(&v, p, left * sizeof(float));
  return v;
}

// lanes 4k..4k+3 of the result hold four partial sums of acc[k] (missing accumulators count as zero)
static inline v16 fold4(const v16* acc, int count) {
  const v16i lo1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const v16i hi1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const v16i lo2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const v16i hi2 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  v16 a[4];
  for (int k = 0; k < 4; ++k) a[k] = k < count ? acc[k] : (v16){0};
  const v16 c0 = __builtin_shuffle(a[0], a[1], lo1) + __builtin_shuffle(a[0], a[1], hi1);
  const v16 c1 = __builtin_shuffle(a[2], a[3], lo1) + __builtin_shuffle(a[2], a[3], hi1);
  return __builtin_shuffle(c0, c1, lo2) + __builtin_shuffle(c0, c1, hi2);
}

#ifdef __AVX512F__
template <int R>
static inline void tile(const float* w, int64_t outs_here, const float* const* x, int64_t n, float* out,
                        int64_t out_stride, const float* ahead) {
  v16 acc[R][OUT_TILE];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < OUT_TILE; ++k) acc[r][k] = (v16){0};
  auto block = [&](int64_t i, int64_t left) {  // inputs i .. i + 15 (the last block: `left` of them)
    v16 wk[OUT_TILE];
    for (int k = 0; k < OUT_TILE; ++k) wk[k] = k < outs_here ? load16(w + k * n + i, left) : (v16){0};
    if (ahead) for (int k = 0; k < OUT_TILE; ++k) _mm_prefetch((const char*)(ahead + k * n + i), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const v16 xr = load16(x[r] + i, left);
      for (int k = 0; k < OUT_TILE; ++k) acc[r][k] += wk[k] * xr;
    }
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) block(i, 16);
  if (i < n) block(i, n - i);
  for (int r = 0; r < R; ++r) {
    float l[16];
    const v16 folded = fold4(acc[r], OUT_TILE);
    __builtin_memcpy(l, &folded, sizeof(l));
    for (int k = 0; k < outs_here; ++k) out[r * out_stride + k] = (l[4 * k] + l[4 * k + 1]) + (l[4 * k + 2] + l[4 * k + 3]);
  }
}
#else
// The same 16-lane chains as two 8-lane halves in AVX2 registers: GCC lowers the generic 16-lane vectors to stack
// loads and stores without AVX-512 (a 13-slot window cost 7x a one-slot one). Lane j of a pair still accumulates
// fma(w[j + 16b], x[j + 16b], .) over the blocks b in order and folds by the same tree, so every pair gets the
// bits the AVX-512 build gives it.

// One 16-input block of a row against the tile's two weight rows: lane j of each pair accumulates fma(w, x, .).
static inline void pair_block(const float* w0, const float* w1, const float* xr, __m256& lo0, __m256& hi0,
                              __m256& lo1, __m256& hi1) {
  const __m256 xlo = _mm256_loadu_ps(xr), xhi = _mm256_loadu_ps(xr + 8);
  lo0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0), xlo, lo0);
  hi0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + 8), xhi, hi0);
  lo1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1), xlo, lo1);
  hi1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + 8), xhi, hi1);
}

static inline float fold_halves(__m256 lo, __m256 hi) {  // `fold4`'s tree: j + (j + 8), j + (j + 4), (0 + 1) + (2 + 3)
  const __m256 pairs = _mm256_add_ps(lo, hi);
  const __m128 quads = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
  const __m128 halves = _mm_hadd_ps(quads, quads);  // [q0 + q1, q2 + q3, ...]
  return _mm_cvtss_f32(_mm_add_ss(halves, _mm_movehdup_ps(halves)));
}

// Accumulators in named registers and no branch in the loop (a tile of one output reads its row twice, a group
// of one row reads it twice; the copies are never stored), so GCC keeps them out of memory.
template <int R>
static inline void tile(const float* w, int64_t outs_here, const float* const* x, int64_t n, float* out,
                        int64_t out_stride, const float* ahead) {
  static_assert(R >= 1 && R <= 2 && OUT_TILE == 2, "the AVX2 tile is up to 2 rows x 2 outputs");
  const float* w0 = w;
  const float* w1 = outs_here > 1 ? w + n : w;
  const float* x0 = x[0];
  const float* x1 = R > 1 ? x[1] : x[0];
  const float* pre0 = ahead ? ahead : w0;
  const float* pre1 = ahead ? ahead + n : w1;
  const __m256 zero = _mm256_setzero_ps();
  __m256 l00 = zero, h00 = zero, l01 = zero, h01 = zero, l10 = zero, h10 = zero, l11 = zero, h11 = zero;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch((const char*)(pre0 + i), _MM_HINT_T0);
    _mm_prefetch((const char*)(pre1 + i), _MM_HINT_T0);
    pair_block(w0 + i, w1 + i, x0 + i, l00, h00, l01, h01);
    if (R > 1) pair_block(w0 + i, w1 + i, x1 + i, l10, h10, l11, h11);
  }
  if (i < n) {  // the zero-padded last block
    float wb0[16] = {0}, wb1[16] = {0}, xb0[16] = {0}, xb1[16] = {0};
    __builtin_memcpy(wb0, w0 + i, (n - i) * sizeof(float));
    __builtin_memcpy(wb1, w1 + i, (n - i) * sizeof(float));
    __builtin_memcpy(xb0, x0 + i, (n - i) * sizeof(float));
    __builtin_memcpy(xb1, x1 + i, (n - i) * sizeof(float));
    pair_block(wb0, wb1, xb0, l00, h00, l01, h01);
    if (R > 1) pair_block(wb0, wb1, xb1, l10, h10, l11, h11);
  }
  out[0] = fold_halves(l00, h00);
  if (outs_here > 1) out[1] = fold_halves(l01, h01);
  if (R > 1) {
    out[out_stride] = fold_halves(l10, h10);
    if (outs_here > 1) out[out_stride + 1] = fold_halves(l11, h11);
  }
}
#endif

static void matvec(const float* w, const float* x, float* out, int64_t rows, int64_t outs, int64_t ins) {
  std::vector<const float*> xs(rows);
  for (int64_t r = 0; r < rows; ++r) xs[r] = x + r * ins;
  for (int64_t o = 0; o < outs; o += OUT_TILE) {
    const int64_t here = outs - o < OUT_TILE ? outs - o : OUT_TILE;
    const float* wo = w + o * ins;
    // the weights stream from memory once per forward: the first row group's pass over a tile also asks for the
    // tile PREFETCH_TILES ahead, a line per weight row and block, spread over the pass (speed only)
    const float* ahead = o + (PREFETCH_TILES + 1) * OUT_TILE <= outs ? wo + PREFETCH_TILES * OUT_TILE * ins : nullptr;
    int64_t r = 0;
    for (; r + ROW_TILE <= rows; r += ROW_TILE, ahead = nullptr)
      tile<ROW_TILE>(wo, here, xs.data() + r, ins, out + r * outs + o, outs, ahead);
    switch (rows - r) {  // fewer than ROW_TILE left
#ifdef __AVX512F__
      case 3: tile<3>(wo, here, xs.data() + r, ins, out + r * outs + o, outs, ahead); break;
      case 2: tile<2>(wo, here, xs.data() + r, ins, out + r * outs + o, outs, ahead); break;
#endif
      case 1: tile<1>(wo, here, xs.data() + r, ins, out + r * outs + o, outs, ahead); break;
    }
  }
}

// x[i] * cos[i] + rotate_half(x)[i] * sin[i] in place, rotate_half(x) = [-x[h:], x[:h]]
static void rope(float* x, const float* cs, const float* sn, int64_t hd) {
  const int64_t h = hd / 2;
  float tmp[512];
  for (int64_t i = 0; i < h; ++i) tmp[i] = std::fma(x[i], cs[i], -(x[i + h] * sn[i]));
  for (int64_t i = h; i < hd; ++i) tmp[i] = std::fma(x[i], cs[i], x[i - h] * sn[i]);
  std::memcpy(x, tmp, hd * sizeof(float));
}

// e^x in 8 lanes for x <= 0 (scores less their maximum): x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' expf
// polynomial, 2^n put into the exponent bits; x below -87.3 counts as -87.3 (e^x ~ 1e-38, not 0). About 1 ulp.
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts: r stays exact
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(two_n));
}

// One query's attention over `count` keys (cache slots seen[c] of one row and head): softmax(scale q.k) v into
// out[hd]. Keys are scored eight at a time, each by one FMA chain over the head and one fixed reduction tree;
// weights come from `exp8`; weighted values are summed in key order. A key's arithmetic is the same wherever it
// sits in the list, so a token gets the same bits alone, in a window or in a batch. `scores` holds count
// rounded up to 8 floats. B = hd / 8 (0: read hd at run time, hd a multiple of 8 up to 512).
template <int B>
static void attend(const float* q, const float* kbase, const float* vbase, const int64_t* seen, int64_t count,
                   int64_t ksl, int64_t vsl, int64_t hd, float scale, float* scores, float* out) {
  const int64_t blocks = B ? B : hd / 8;
  for (int64_t c0 = 0; c0 < count; c0 += 8) {
    const float* k[8];  // past the end: the last key again, its score discarded
    for (int j = 0; j < 8; ++j) k[j] = kbase + seen[c0 + j < count ? c0 + j : count - 1] * ksl;
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const __m256 qb = _mm256_loadu_ps(q + 8 * b);
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k[j] + 8 * b), acc[j]);
    }
    // key j: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) of acc[j], the same tree for every j
    const __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
    const __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
    const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                                     _mm256_permute2f128_ps(s0123, s4567, 0x31));
    _mm256_storeu_ps(scores + c0, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
  }
  float top = -INFINITY;
  for (int64_t c = 0; c < count; ++c) top = scores[c] > top ? scores[c] : top;
  __m256 total8 = _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t c0 = 0; c0 < count; c0 += 8) {  // the weights replace the scores
    __m256 w = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + c0), _mm256_set1_ps(top)));
    const __m256i here = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(count - c0)), lane);
    w = _mm256_and_ps(w, _mm256_castsi256_ps(here));
    _mm256_storeu_ps(scores + c0, w);
    total8 = _mm256_add_ps(total8, w);
  }
  float l[8];
  _mm256_storeu_ps(l, total8);
  const float total = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  __m256 acc[B ? B : 64];
  for (int64_t b = 0; b < blocks; ++b) acc[b] = _mm256_setzero_ps();
  for (int64_t c = 0; c < count; ++c) {
    const __m256 w = _mm256_set1_ps(scores[c]);
    const float* v = vbase + seen[c] * vsl;
    for (int64_t b = 0; b < blocks; ++b) acc[b] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * b), acc[b]);
  }
  const __m256 divisor = _mm256_set1_ps(total);
  for (int64_t b = 0; b < blocks; ++b) _mm256_storeu_ps(out + 8 * b, _mm256_div_ps(acc[b], divisor));
}

// The same for any head size, one key at a time with libm's exp
static void attend_scalar(const float* q, const float* kbase, const float* vbase, const int64_t* seen,
                          int64_t count, int64_t ksl, int64_t vsl, int64_t hd, float scale, float* scores,
                          float* out) {
  float top = -INFINITY;
  for (int64_t c = 0; c < count; ++c) {
    scores[c] = scale * dot(q, kbase + seen[c] * ksl, hd);
    top = scores[c] > top ? scores[c] : top;
  }
  float total = 0.f;
  std::vector<float> acc(hd, 0.f);
  for (int64_t c = 0; c < count; ++c) {
    const float wgt = std::exp(scores[c] - top);
    total += wgt;
    const float* vv = vbase + seen[c] * vsl;
    for (int64_t i = 0; i < hd; ++i) acc[i] = std::fma(wgt, vv[i], acc[i]);
  }
  for (int64_t i = 0; i < hd; ++i) out[i] = acc[i] / total;
}

// x [R, d] -> scale * x / sqrt(mean(x^2) + eps), row by row (a Gemma norm's (1 + w) scale, or a Llama norm's w)
torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor scale, double eps) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && scale.dtype() == torch::kFloat32 && x.is_contiguous()
              && scale.is_contiguous() && x.dim() == 2 && x.size(1) == scale.numel(), "x [R, d], scale [d], float32");
  auto out = torch::empty_like(x);
  rms_norm(x.data_ptr<float>(), scale.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), (float)eps);
  return out;
}

torch::Tensor linear_rows(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && w.dtype() == torch::kFloat32 && x.is_contiguous() && w.is_contiguous()
              && x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [R, in], w [out, in], float32");
  auto out = torch::empty({x.size(0), w.size(0)}, x.options());
  matvec(w.data_ptr<float>(), x.data_ptr<float>(), out.data_ptr<float>(), x.size(0), w.size(0), x.size(1));
  return out;
}

// State copying (an early exit's, modalities/text/early_exit.py): every given layer's keys and values of the slots
// computed from the same hidden [R, n, d] (norm_in, the k and v rows of the fused projection, rotary on the keys),
// written as decode_layers writes them; the hidden states themselves are left as they are
void copy_states(torch::Tensor hidden, torch::Tensor positions, torch::Tensor inv_freq, double rope_scaling,
                 std::vector<torch::Tensor> weights, std::vector<torch::Tensor> keys, std::vector<torch::Tensor> values,
                 torch::Tensor rows, torch::Tensor slots, int64_t heads, int64_t kv_heads, int64_t head_dim,
                 std::vector<double> eps) {
  TORCH_CHECK(hidden.dtype() == torch::kFloat32 && hidden.is_contiguous() && hidden.dim() == 3, "hidden: [R, n, d] f32");
  TORCH_CHECK(head_dim <= 512 && head_dim % 2 == 0, "head_dim must be even and at most 512");
  const int64_t n = hidden.size(1), T = hidden.size(0) * n, d = hidden.size(2), layers = (int64_t)keys.size();
  TORCH_CHECK(positions.numel() == T && rows.numel() == hidden.size(0) && slots.numel() == hidden.size(0), "shapes");
  TORCH_CHECK((int64_t)weights.size() == 2 * layers && (int64_t)eps.size() == layers, "norm and qkv per layer");
  const int64_t qs = heads * head_dim, kvs = kv_heads * head_dim;
  const float* h = hidden.data_ptr<float>();
  const float* freq = inv_freq.data_ptr<float>();
  const int64_t* pos = positions.data_ptr<int64_t>();
  std::vector<float> cs(T * head_dim), sn(T * head_dim), x(T * d), kv(T * 2 * kvs);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < head_dim; ++i) {
      const float angle = (float)pos[t] * freq[i % (head_dim / 2)];
      cs[t * head_dim + i] = std::cos(angle) * (float)rope_scaling;
      sn[t * head_dim + i] = std::sin(angle) * (float)rope_scaling;
    }
  for (int64_t l = 0; l < layers; ++l) {
    float* kc = keys[l].data_ptr<float>();
    float* vc = values[l].data_ptr<float>();
    const int64_t kb = keys[l].stride(0), kh = keys[l].stride(1), ksl = keys[l].stride(2);
    const int64_t vb = values[l].stride(0), vh = values[l].stride(1), vsl = values[l].stride(2);
    rms_norm(h, weights[2 * l].data_ptr<float>(), x.data(), T, d, (float)eps[l]);
    matvec(weights[2 * l + 1].data_ptr<float>() + qs * d, x.data(), kv.data(), T, 2 * kvs, d);  // k, v rows only
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = rows.data_ptr<int64_t>()[t / n], slot = slots.data_ptr<int64_t>()[t / n] + t % n;
      float* k = kv.data() + t * 2 * kvs;
      for (int64_t g = 0; g < kv_heads; ++g) {
        rope(k + g * head_dim, cs.data() + t * head_dim, sn.data() + t * head_dim, head_dim);
        std::memcpy(kc + row * kb + g * kh + slot * ksl, k + g * head_dim, head_dim * sizeof(float));
        std::memcpy(vc + row * vb + g * vh + slot * vsl, k + kvs + g * head_dim, head_dim * sizeof(float));
      }
    }
  }
}

// A small classifier over rows (early exit's controllers, modalities/text/early_exit.py):
// softmax(w2 gelu(w1 rmsnorm(x) + b1) + b2), the norm without a scale, GELU the exact (erf) one; [R, k] laws
torch::Tensor classify_rows(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, torch::Tensor b2,
                            double eps) {
  for (const auto& t : {x, w1, b1, w2, b2})
    TORCH_CHECK(t.dtype() == torch::kFloat32 && t.is_contiguous(), "classify_rows: contiguous float32 tensors");
  TORCH_CHECK(x.dim() == 2 && w1.dim() == 2 && w2.dim() == 2 && w1.size(1) == x.size(1) && b1.numel() == w1.size(0)
              && w2.size(1) == w1.size(0) && b2.numel() == w2.size(0), "x [R, d], w1 [c, d], b1 [c], w2 [k, c], b2 [k]");
  const int64_t R = x.size(0), d = x.size(1), c = w1.size(0), k = w2.size(0);
  std::vector<float> ones(d, 1.f), normed(R * d), inner(R * c);
  rms_norm(x.data_ptr<float>(), ones.data(), normed.data(), R, d, (float)eps);
  matvec(w1.data_ptr<float>(), normed.data(), inner.data(), R, c, d);
  const float* bias1 = b1.data_ptr<float>();
  for (int64_t i = 0; i < R * c; ++i) {
    const float v = inner[i] + bias1[i % c];
    inner[i] = 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
  }
  auto out = torch::empty({R, k}, x.options());
  float* o = out.data_ptr<float>();
  matvec(w2.data_ptr<float>(), inner.data(), o, R, k, c);
  const float* bias2 = b2.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    float* row = o + r * k;
    float top = -INFINITY, total = 0.f;
    for (int64_t j = 0; j < k; ++j) top = std::max(top, row[j] += bias2[j]);
    for (int64_t j = 0; j < k; ++j) total += (row[j] = std::exp(row[j] - top));
    for (int64_t j = 0; j < k; ++j) row[j] /= total;
  }
  return out;
}

// hidden [R, n, d]: n new slots per row, written at slots[r] .. slots[r] + n - 1 of cache row rows[r]. Slot j of a
// row attends to every cached slot, then to the window's slots k it sees: k <= j (causal), or window_mask[r][j][k]
// (a tree's ancestors and itself) when a [R, n, n] bool mask is given. Returns the final-normed [R, n, d].
torch::Tensor decode_layers(torch::Tensor hidden, torch::Tensor positions, torch::Tensor inv_freq,
                            double rope_scaling, std::vector<torch::Tensor> weights, torch::Tensor final_norm,
                            std::vector<torch::Tensor> keys, std::vector<torch::Tensor> values,
                            torch::Tensor rows, torch::Tensor slots, torch::Tensor window_mask, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, std::vector<double> eps, std::vector<double> scales) {
  TORCH_CHECK(hidden.dtype() == torch::kFloat32 && hidden.is_contiguous() && hidden.dim() == 3, "hidden: [R, n, d] f32");
  TORCH_CHECK(head_dim <= 512 && head_dim % 2 == 0, "head_dim must be even and at most 512");
  const int64_t n = hidden.size(1), T = hidden.size(0) * n, d = hidden.size(2), layers = (int64_t)keys.size();
  TORCH_CHECK(positions.numel() == T && rows.numel() == hidden.size(0) && slots.numel() == hidden.size(0), "shapes");
  TORCH_CHECK((int64_t)weights.size() == 6 * layers && (int64_t)eps.size() == 2 * layers + 1, "weights per layer");
  const bool masked = window_mask.numel() > 0;
  TORCH_CHECK(!masked || (window_mask.dtype() == torch::kBool && window_mask.is_contiguous()
                          && window_mask.numel() == T * n), "window_mask: [R, n, n] bool");
  const bool* visible = masked ? window_mask.data_ptr<bool>() : nullptr;
  const int64_t qs = heads * head_dim, kvs = kv_heads * head_dim, group = heads / kv_heads;
  // MLP widths may differ by layer; width 0 is a layer without an MLP (a Kangaroo adapter), which adds nothing
  int64_t widest = 0;
  for (int64_t l = 0; l < layers; ++l) widest = std::max(widest, weights[6 * l + 5].size(1));
  const int64_t width = qs + 2 * kvs;
  auto out = hidden.clone();
  float* h = out.data_ptr<float>();
  // token t = row t / n, window slot t % n: its cache row, its cache slot, the slots it attends to, and the rotary
  // tables as the model's rotary module makes them (angle = position * inv_freq in float32, the halves repeated)
  std::vector<int64_t> row_of(T), slot_of(T);
  std::vector<std::vector<int64_t>> cols(T);
  std::vector<float> cs(T * head_dim), sn(T * head_dim);
  const float* freq = inv_freq.data_ptr<float>();
  const int64_t* pos = positions.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = t / n, j = t % n, base = slots.data_ptr<int64_t>()[r];
    row_of[t] = rows.data_ptr<int64_t>()[r];
    slot_of[t] = base + j;
    for (int64_t c = 0; c < base; ++c) cols[t].push_back(c);
    for (int64_t k = 0; k < n; ++k)
      if (masked ? visible[(r * n + j) * n + k] : k <= j) cols[t].push_back(base + k);
    longest = (int64_t)cols[t].size() > longest ? (int64_t)cols[t].size() : longest;
    for (int64_t i = 0; i < head_dim; ++i) {
      const float angle = (float)pos[t] * freq[i % (head_dim / 2)];
      cs[t * head_dim + i] = std::cos(angle) * (float)rope_scaling;
      sn[t * head_dim + i] = std::sin(angle) * (float)rope_scaling;
    }
  }
  std::vector<float> x(T * d), qkv(T * width), att(T * qs), proj(T * d), gu(T * 2 * widest), act(T * widest);
  std::vector<float> scores(longest + 8);
  for (int64_t l = 0; l < layers; ++l) {
    const float* norm_in = weights[6 * l].data_ptr<float>();
    const float* w_qkv = weights[6 * l + 1].data_ptr<float>();
    const float* w_out = weights[6 * l + 2].data_ptr<float>();
    const float* norm_post = weights[6 * l + 3].data_ptr<float>();
    const float* w_gu = weights[6 * l + 4].data_ptr<float>();
    const float* w_down = weights[6 * l + 5].data_ptr<float>();
    float* kc = keys[l].data_ptr<float>();
    float* vc = values[l].data_ptr<float>();
    const int64_t kb = keys[l].stride(0), kh = keys[l].stride(1), ksl = keys[l].stride(2);
    const int64_t vb = values[l].stride(0), vh = values[l].stride(1), vsl = values[l].stride(2);
    const float scale = (float)scales[l];
    rms_norm(h, norm_in, x.data(), T, d, (float)eps[2 * l]);
    matvec(w_qkv, x.data(), qkv.data(), T, width, d);
    for (int64_t t = 0; t < T; ++t) {  // rotary on q and k, then every window slot's key and value into the cache
      float* q = qkv.data() + t * width;
      for (int64_t a = 0; a < heads + kv_heads; ++a)
        rope(q + a * head_dim, cs.data() + t * head_dim, sn.data() + t * head_dim, head_dim);
      for (int64_t g = 0; g < kv_heads; ++g) {
        std::memcpy(kc + row_of[t] * kb + g * kh + slot_of[t] * ksl, q + qs + g * head_dim, head_dim * sizeof(float));
        std::memcpy(vc + row_of[t] * vb + g * vh + slot_of[t] * vsl, q + qs + kvs + g * head_dim,
                    head_dim * sizeof(float));
      }
    }
    auto attend_head = head_dim == 64 ? attend<8> : head_dim == 32 ? attend<4> : head_dim == 128 ? attend<16>
                     : head_dim % 8 == 0 ? attend<0> : attend_scalar;
    // heads outside, tokens inside: a row's window slots are consecutive tokens, so one head's keys and values
    // of the row are read from memory once and stay in cache for the row's other slots (a wide window or a tree
    // would otherwise stream the row's whole cache once per slot)
    for (int64_t a = 0; a < heads; ++a) {
      const int64_t g = a / group;
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<int64_t>& seen = cols[t];  // in slot order: the cache, then the window
        attend_head(qkv.data() + t * width + a * head_dim, kc + row_of[t] * kb + g * kh, vc + row_of[t] * vb + g * vh,
                    seen.data(), (int64_t)seen.size(), ksl, vsl, head_dim, scale, scores.data(),
                    att.data() + t * qs + a * head_dim);
      }
    }
    matvec(w_out, att.data(), proj.data(), T, d, qs);
    for (int64_t i = 0; i < T * d; ++i) h[i] += proj[i];
    const int64_t inter = weights[6 * l + 5].size(1);
    if (inter == 0) continue;
    rms_norm(h, norm_post, x.data(), T, d, (float)eps[2 * l + 1]);
    matvec(w_gu, x.data(), gu.data(), T, 2 * inter, d);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < inter; ++i) {
        const float gate = gu[t * 2 * inter + i], up = gu[t * 2 * inter + inter + i];
        act[t * inter + i] = gate / (1.f + std::exp(-gate)) * up;
      }
    }
    matvec(w_down, act.data(), proj.data(), T, d, inter);
    for (int64_t i = 0; i < T * d; ++i) h[i] += proj[i];
  }
  if (final_norm.numel() == 0) return out;  // a stack cut after these layers: the residual stream, not normed
  auto normed = torch::empty_like(out);
  rms_norm(h, final_norm.data_ptr<float>(), normed.data_ptr<float>(), T, d, (float)eps[2 * layers]);
  return normed;
}
