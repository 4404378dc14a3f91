#include "torch_lean.h"
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

// One vector width: its register type, loads, fused multiply-add, fixed horizontal sum, and the number of weight
// rows (NB) a block of MB activation rows takes (as many accumulators as the registers hold without spilling).
struct Lanes8 {  // AVX2: 16 registers
  using V = __m256;
  static constexpr int W = 8;
  static inline V zero() { return _mm256_setzero_ps(); }
  static inline V load(const float* p) { return _mm256_loadu_ps(p); }
  static inline V load(const int8_t* p) { return widen(p); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline float sum(V v) { return hsum(v); }
  static constexpr int nb(int mb) { return mb == 1 ? 6 : mb == 2 ? 4 : mb == 3 ? 3 : 2; }
  static constexpr int ONE_PASS = 6;
};
#ifdef __AVX512F__
struct Lanes16 {  // AVX-512F: 32 registers
  using V = __m512;
  static constexpr int W = 16;
  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V load(const float* p) { return _mm512_loadu_ps(p); }
  static inline V load(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
  }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline float sum(V v) { return _mm512_reduce_add_ps(v); }
  // 7 and 8 rows in one pass take 2 weight rows (16 accumulators): a pass of 8 x 2 over Gemma 3's output layer cost
  // 15.5 ms where groups of 6 and 2 cost 25.6 (benchmarks/int8-kernel-latest.md)
  static constexpr int nb(int mb) { return mb == 1 ? 8 : mb == 2 ? 6 : mb <= 6 ? 4 : 2; }
  static constexpr int ONE_PASS = 8;  // the most rows one pass over the weights takes
};
static const bool kHave512 = true;
#else
static const bool kHave512 = false;
#endif

// MB activation rows against NB weight rows at a time. Each output (m, n) has one accumulator fed k = 0, W, 2W, ...
// in order and one fixed horizontal sum, whatever MB and NB are: blocking changes speed, never the result. The
// 16-lane sums differ from the 8-lane ones, so a layer always takes one width (K % 16 == 0 with AVX-512).
static const int PREFETCH_BLOCKS = 16;  // prefetching changes the speed only: no arithmetic depends on it

template <typename L, int MB, int NB>
static void block(const float* x, const int8_t* w, const float* scales, float* out, int64_t n0, int64_t n1, int64_t K,
                  int64_t ldo) {
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    // the int8 rows stream from memory: ask for the block PREFETCH_BLOCKS ahead now
    const char* ahead = (const char*)(w + (n + PREFETCH_BLOCKS * NB) * K);
    const char* end = (const char*)(w + n1 * K);
    for (int64_t b = 0; b < NB * K; b += 64) if (ahead + b < end) _mm_prefetch(ahead + b, _MM_HINT_T0);
    typename L::V acc[MB][NB];
    for (int m = 0; m < MB; ++m) for (int j = 0; j < NB; ++j) acc[m][j] = L::zero();
    for (int64_t k = 0; k < K; k += L::W) {
      typename L::V wv[NB];
      for (int j = 0; j < NB; ++j) wv[j] = L::load(w + (n + j) * K + k);
      for (int m = 0; m < MB; ++m) {
        typename L::V xv = L::load(x + m * K + k);
        for (int j = 0; j < NB; ++j) acc[m][j] = L::fma(xv, wv[j], acc[m][j]);
      }
    }
    for (int m = 0; m < MB; ++m) for (int j = 0; j < NB; ++j) out[m * ldo + n + j] = L::sum(acc[m][j]) * scales[n + j];
  }
  if (NB > 1 && n < n1) block<L, MB, 1>(x, w, scales, out, n, n1, K, ldo);
}

// One pass over all N weight rows for `rows` (1 to 8) activation rows.
template <typename L>
static void pass(const float* x, const int8_t* w, const float* s, float* o, int rows, int64_t N, int64_t K,
                 int64_t ldo) {
  switch (rows) {
    case 1: block<L, 1, L::nb(1)>(x, w, s, o, 0, N, K, ldo); break;
    case 2: block<L, 2, L::nb(2)>(x, w, s, o, 0, N, K, ldo); break;
    case 3: block<L, 3, L::nb(3)>(x, w, s, o, 0, N, K, ldo); break;
    case 4: block<L, 4, L::nb(4)>(x, w, s, o, 0, N, K, ldo); break;
    case 5: block<L, 5, L::nb(5)>(x, w, s, o, 0, N, K, ldo); break;
    case 6: block<L, 6, L::nb(6)>(x, w, s, o, 0, N, K, ldo); break;
    case 7: if constexpr (L::ONE_PASS >= 7) block<L, 7, L::nb(7)>(x, w, s, o, 0, N, K, ldo); break;
    case 8: if constexpr (L::ONE_PASS >= 8) block<L, 8, L::nb(8)>(x, w, s, o, 0, N, K, ldo); break;
    default: break;
  }
}

// Up to ONE_PASS rows: one pass over the weights (they stream from memory once). More rows: as few groups of at most
// 6 rows as cover them, of balanced sizes (13 rows: 5, 4, 4), each its own pass. On one core the products are bound
// by arithmetic from about 4 rows on, and a 6 x 4 block does the most multiply-adds per widened weight; reading the
// weights again per group cost less than the slices kept in cache and the weights widened to float once that this
// replaced (Gemma 3's output layer at 16 rows 28 against 46 ms, its MLP products over a 924-token prompt a quarter to
// a third faster). No grouping changes an accumulator, so every result is the same bit for bit.
static const int64_t GROUP_ROWS = 6;  // the most rows of a group past one pass

template <typename L>
static void all_rows(const float* x, const int8_t* w, const float* s, float* o, int64_t M, int64_t N, int64_t K) {
  if (M <= L::ONE_PASS) { pass<L>(x, w, s, o, (int)M, N, K, N); return; }
  const int64_t groups = (M + GROUP_ROWS - 1) / GROUP_ROWS;
  for (int64_t g = 0, m = 0; g < groups; ++g) {
    const int64_t rows = (M - m) / (groups - g);  // balanced: the sizes differ by at most one
    pass<L>(x + m * K, w, s, o + m * N, (int)rows, N, K, N);
    m += rows;
  }
}

bool has_wide() { return kHave512; }

// out [M, N] = x [M, K] . w [N, K]^T * scales: the product every caller gets (the compiled Gemma layer glue calls it
// directly); `wide` allows the 16-lane path, which a layer takes whatever M
static void int8_rows_product(const float* xp, const int8_t* wp, const float* sp, float* op, int64_t M, int64_t N,
                              int64_t K, bool wide) {
#ifdef __AVX512F__
  if (wide && K % 16 == 0) { all_rows<Lanes16>(xp, wp, sp, op, M, N, K); return; }
#endif
  all_rows<Lanes8>(xp, wp, sp, op, M, N, K);
}

torch::Tensor int8_rows_mm(torch::Tensor x, torch::Tensor w, torch::Tensor scales, bool wide) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && w.dtype() == torch::kInt8 && scales.dtype() == torch::kFloat32);
  x = x.contiguous(); w = w.contiguous(); scales = scales.contiguous();
  int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % 8 == 0, "K must be a multiple of 8");
  auto out = torch::empty({M, N}, x.options());
  int8_rows_product(x.data_ptr<float>(), w.data_ptr<int8_t>(), scales.data_ptr<float>(), out.data_ptr<float>(), M, N,
                    K, wide);
  return out;
}
