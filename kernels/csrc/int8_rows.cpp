#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <vector>

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
  static constexpr int nb(int mb) { return mb == 1 ? 8 : mb == 2 ? 6 : mb <= 4 ? 4 : 3; }
};
static const bool kHave512 = true;
#else
static const bool kHave512 = false;
#endif

// MB activation rows against NB weight rows at a time. Each output (m, n) has one accumulator fed k = 0, W, 2W, ...
// in order and one fixed horizontal sum, whatever MB and NB are: blocking changes speed, never the result. The
// weights are int8 rows, or the same rows already widened to float (exactly: int8 -> float32 is lossless). The
// 16-lane sums differ from the 8-lane ones, so a layer always takes one width (K % 16 == 0 with AVX-512).
static const int PREFETCH_BLOCKS = 16;  // prefetching changes the speed only: no arithmetic depends on it

template <typename L, int MB, int NB, typename T>
static void block(const float* x, const T* w, const float* scales, float* out, int64_t n0, int64_t n1, int64_t K, int64_t ldo) {
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    if (sizeof(T) == 1) {  // int8 rows stream from memory: ask for the block PREFETCH_BLOCKS ahead now
      const char* ahead = (const char*)(w + (n + PREFETCH_BLOCKS * NB) * K);
      const char* end = (const char*)(w + n1 * K);
      for (int64_t b = 0; b < NB * K; b += 64) if (ahead + b < end) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
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
  if (NB > 1 && n < n1) block<L, MB, 1, T>(x, w, scales, out, n, n1, K, ldo);
}

// All M rows (6 per group, then the rest) against weight rows n0..n1 of w.
template <typename L, typename T>
static void row_groups(const float* x, const T* w, const float* s, float* o, int64_t M, int64_t n0, int64_t n1,
                       int64_t K, int64_t ldo) {
  int64_t m = 0;
  for (; m + 6 < M; m += 6) block<L, 6, L::nb(6), T>(x + m * K, w, s, o + m * ldo, n0, n1, K, ldo);
  const float* xr = x + m * K; float* orow = o + m * ldo;
  switch (M - m) {
    case 1: block<L, 1, L::nb(1), T>(xr, w, s, orow, n0, n1, K, ldo); break;
    case 2: block<L, 2, L::nb(2), T>(xr, w, s, orow, n0, n1, K, ldo); break;
    case 3: block<L, 3, L::nb(3), T>(xr, w, s, orow, n0, n1, K, ldo); break;
    case 4: block<L, 4, L::nb(4), T>(xr, w, s, orow, n0, n1, K, ldo); break;
    case 5: block<L, 5, L::nb(5), T>(xr, w, s, orow, n0, n1, K, ldo); break;
    case 6: block<L, 6, L::nb(6), T>(xr, w, s, orow, n0, n1, K, ldo); break;
    default: break;
  }
}

// More than one group of rows (7 to 12): a slice of SLICE_ROWS weight rows is read from memory once and every group
// runs against it while it sits in cache, instead of one pass over all the weights per group (the second pass cost
// as much as the first: the layers stream from memory). Slicing the outputs changes no accumulator, so every
// result is the same bit for bit as with one group or one row.
static const int64_t SLICE_ROWS = 48;  // a multiple of every NB; 48 x 2048 int8 stays within L2

template <typename L, typename T>
static void all_rows(const float* x, const T* w, const float* s, float* o, int64_t M, int64_t n0, int64_t n1,
                     int64_t K, int64_t ldo) {
  if (M <= 6 || sizeof(T) != 1) { row_groups<L, T>(x, w, s, o, M, n0, n1, K, ldo); return; }
  for (int64_t a = n0; a < n1; a += SLICE_ROWS) {
    const int64_t b = std::min(a + SLICE_ROWS, n1);
    const char* next = (const char*)(w + b * K);  // the next slice, while this one is computed
    const char* end = (const char*)(w + n1 * K);
    for (int64_t i = 0; i < SLICE_ROWS * K; i += 64) if (next + i < end) _mm_prefetch(next + i, _MM_HINT_T1);
    row_groups<L, T>(x, w, s, o, M, a, b, K, ldo);
  }
}

template <typename T>
static void rows_at_width(bool wide, const float* x, const T* w, const float* s, float* o, int64_t M, int64_t n0,
                          int64_t n1, int64_t K, int64_t ldo) {
#ifdef __AVX512F__
  if (wide) { all_rows<Lanes16, T>(x, w, s, o, M, n0, n1, K, ldo); return; }
#endif
  all_rows<Lanes8, T>(x, w, s, o, M, n0, n1, K, ldo);
}

bool has_wide() { return kHave512; }

// out [M, N] = x [M, K] . w [N, K]^T * scales: the product every caller gets (the compiled Gemma layer glue calls it
// directly); `wide` allows the 16-lane path, which a layer takes whatever M
static void int8_rows_product(const float* xp, const int8_t* wp, const float* sp, float* op, int64_t M, int64_t N,
                              int64_t K, bool wide) {
  wide = wide && kHave512 && K % 16 == 0;
  if (M <= 12) {  // decoding and verification windows: stream the int8 weights once per 6 rows
    rows_at_width<int8_t>(wide, xp, wp, sp, op, M, 0, N, K, N);
  } else {  // prompts and batches: widen a block of weight rows into cache once, then run every row against it
    const int64_t rows_per_block = std::max<int64_t>(6, 98304 / (K * 4));
    std::vector<float> widened(rows_per_block * K);
    for (int64_t n0 = 0; n0 < N; n0 += rows_per_block) {
      const int64_t count = std::min(rows_per_block, N - n0);
      for (int64_t i = 0; i < count; ++i)
        for (int64_t k = 0; k < K; k += 8) _mm256_storeu_ps(widened.data() + i * K + k, widen(wp + (n0 + i) * K + k));
      rows_at_width<float>(wide, xp, widened.data(), sp + n0, op + n0, M, 0, count, K, N);
    }
  }
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
