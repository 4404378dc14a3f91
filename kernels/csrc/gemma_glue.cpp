// Gemma 3's per-layer glue; built after int8_rows.cpp, whose row products it calls.
#include <cmath>
#include <cstring>

#include "row_norm.h"  // dot, rms_norm

// out[i] = x[i] * cs[i] + x[(i + hd/2) % hd] * sn[i], sn being sin with its first half negated: rotate_half's
// rotary, two roundings then one add exactly as torch does it (no fused multiply-add)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static void rope_rolled(const float* x, const float* cs, const float* sn, float* out, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < hd; ++i) {
    const float direct = x[i] * cs[i];
    const float rolled = x[i < half ? i + half : i - half] * sn[i];
    out[i] = direct + rolled;
  }
}
#pragma GCC pop_options

static void check_f32(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dtype() == torch::kFloat32 && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous float32 CPU tensor");
}

static void product(const float* x, const torch::Tensor& w, const torch::Tensor& s, float* out, int64_t M) {
  TORCH_CHECK(w.dtype() == torch::kInt8 && w.is_contiguous() && s.numel() == w.size(0), "int8 rows and their scales");
  int8_rows_product(x, w.data_ptr<int8_t>(), s.data_ptr<float>(), out, M, w.size(0), w.size(1), true);
}

// hidden [R, n, d] -> q [R, heads, n, hd], k and v [R, kv_heads, n, hd]; cos, sn [R, n, hd] (sn sign-folded)
std::vector<torch::Tensor> attention_in(torch::Tensor hidden, torch::Tensor norm_in, double eps, torch::Tensor w_qkv,
                                        torch::Tensor s_qkv, torch::Tensor q_norm, double q_eps, torch::Tensor k_norm,
                                        double k_eps, torch::Tensor cos, torch::Tensor sn, int64_t heads,
                                        int64_t kv_heads) {
  for (auto* t : {&hidden, &norm_in, &q_norm, &k_norm, &cos, &sn}) check_f32(*t, "every float input");
  TORCH_CHECK(hidden.dim() == 3 && cos.dim() == 3 && cos.sizes() == sn.sizes(), "hidden [R, n, d], cos/sin [R, n, hd]");
  const int64_t R = hidden.size(0), n = hidden.size(1), d = hidden.size(2), T = R * n, hd = cos.size(2);
  const int64_t qs = heads * hd, kvs = kv_heads * hd, width = qs + 2 * kvs;
  TORCH_CHECK(cos.size(0) == R && cos.size(1) == n && hd % 2 == 0, "cos/sin [R, n, hd], hd even");
  TORCH_CHECK(w_qkv.size(0) == width && w_qkv.size(1) == d && d % 8 == 0, "w_qkv [(heads + 2 kv_heads) hd, d]");
  TORCH_CHECK(norm_in.numel() == d && q_norm.numel() == hd && k_norm.numel() == hd, "norm sizes");
  const auto options = hidden.options();
  auto x = torch::empty({T, d}, options), qkv = torch::empty({T, width}, options);
  rms_norm(hidden.data_ptr<float>(), norm_in.data_ptr<float>(), x.data_ptr<float>(), T, d, (float)eps);
  product(x.data_ptr<float>(), w_qkv, s_qkv, qkv.data_ptr<float>(), T);
  auto q = torch::empty({R, heads, n, hd}, options), k = torch::empty({R, kv_heads, n, hd}, options);
  auto v = torch::empty({R, kv_heads, n, hd}, options);
  float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *qn = q_norm.data_ptr<float>(), *kn = k_norm.data_ptr<float>();
  std::vector<float> normed(hd);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = t / n, j = t % n;
    const float* src = qkv.data_ptr<float>() + t * width;
    const float* c = cos.data_ptr<float>() + t * hd;
    const float* s = sn.data_ptr<float>() + t * hd;
    for (int64_t a = 0; a < heads; ++a) {
      rms_norm(src + a * hd, qn, normed.data(), 1, hd, (float)q_eps);
      rope_rolled(normed.data(), c, s, qp + ((r * heads + a) * n + j) * hd, hd);
    }
    for (int64_t g = 0; g < kv_heads; ++g) {
      rms_norm(src + qs + g * hd, kn, normed.data(), 1, hd, (float)k_eps);
      rope_rolled(normed.data(), c, s, kp + ((r * kv_heads + g) * n + j) * hd, hd);
      std::memcpy(vp + ((r * kv_heads + g) * n + j) * hd, src + qs + kvs + g * hd, hd * sizeof(float));
    }
  }
  return {q, k, v};
}

// hidden [R, n, d], attended [R, n, heads * hd] -> the hidden state after the layer's attention and MLP halves
torch::Tensor attention_out_mlp(torch::Tensor hidden, torch::Tensor attended, torch::Tensor w_out, torch::Tensor s_out,
                                torch::Tensor post_attention, torch::Tensor pre_mlp, torch::Tensor w_gate_up,
                                torch::Tensor s_gate_up, torch::Tensor w_down, torch::Tensor s_down,
                                torch::Tensor post_mlp, std::vector<double> eps) {
  for (auto* t : {&hidden, &attended, &post_attention, &pre_mlp, &post_mlp}) check_f32(*t, "every float input");
  const int64_t d = hidden.size(-1), T = hidden.numel() / d, inter = w_down.size(1);
  TORCH_CHECK(eps.size() == 3 && attended.numel() / attended.size(-1) == T, "three eps; one attended row per token");
  TORCH_CHECK(w_out.size(0) == d && w_out.size(1) == attended.size(-1) && w_gate_up.size(0) == 2 * inter
              && w_gate_up.size(1) == d && w_down.size(0) == d && inter % 8 == 0, "layer shapes");
  const auto options = hidden.options();
  auto out = torch::empty_like(hidden), projected = torch::empty({T, d}, options), normed = torch::empty({T, d}, options);
  const float* h = hidden.data_ptr<float>();
  float *o = out.data_ptr<float>(), *pj = projected.data_ptr<float>(), *nm = normed.data_ptr<float>();
  product(attended.data_ptr<float>(), w_out, s_out, pj, T);
  rms_norm(pj, post_attention.data_ptr<float>(), nm, T, d, (float)eps[0]);
  for (int64_t i = 0; i < T * d; ++i) o[i] = h[i] + nm[i];
  rms_norm(o, pre_mlp.data_ptr<float>(), nm, T, d, (float)eps[1]);
  auto gate_up = torch::empty({T, 2 * inter}, options);
  product(nm, w_gate_up, s_gate_up, gate_up.data_ptr<float>(), T);
  auto mixed = at::gelu(gate_up.narrow(1, 0, inter), "tanh").mul_(gate_up.narrow(1, inter, inter)).contiguous();
  product(mixed.data_ptr<float>(), w_down, s_down, pj, T);
  rms_norm(pj, post_mlp.data_ptr<float>(), nm, T, d, (float)eps[2]);
  for (int64_t i = 0; i < T * d; ++i) o[i] += nm[i];
  return out;
}
