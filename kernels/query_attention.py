"""Attention one query at a time, for every query of a forward in one call (the served Gemma's attention).

out[row, slot, head] = softmax_j(scale * q . k_j) v_j over exactly the keys that query sees, in position order.
The arithmetic of one query depends only on its own vector and the keys and values it sees: dot products in
16-lane vector accumulators over the head dimension with one fixed horizontal sum, a max, exponentials, and the
weighted values summed key by key. A drafted token scored in a window of 8 therefore gets the very bits it gets
scored alone, as with a `scaled_dot_product_attention` call per query (`reference`), without that loop's dozen
small torch calls per query and layer (about 1,000 per 4-slot Gemma forward).

`seen` chooses the keys: None means slot j of n sees the first width - n + j + 1 columns (a chain after its
cached context); otherwise a [rows, n, width] bool mask (tree slots, sliding windows, padded prompt rows).
Float32 only; the C++ extension builds on first use beside the int8 kernel (same compiler requirements). Where
it cannot build, or for other dtypes, `reference` is the path.
"""

from __future__ import annotations

import hashlib
import logging
import os

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

SOURCE = r"""
#include <torch/extension.h>
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
  std::vector<float> scores(width), acc(d);
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
        for (int64_t c = 0; c < count; ++c) {
          scores[c] = scale * dot(qv, kb + cols[c] * keys.stride(2), d);
          top = scores[c] > top ? scores[c] : top;
        }
        float total = 0.f;
        float* o = out_p + (r * n + s) * heads * d + h * d;
        if (d % 16 == 0 && d <= 16 * MAX_BLOCKS) {
          // the weighted values summed key by key in vector registers (each lane one output element, the
          // same key order as the scalar loop below)
          const int64_t blocks = d / 16;
          v16 accv[MAX_BLOCKS];
          for (int64_t b = 0; b < blocks; ++b) accv[b] = (v16){0};
          for (int64_t c = 0; c < count; ++c) {
            const float w = std::exp(scores[c] - top);
            total += w;
            const float* vv = vb + cols[c] * values.stride(2);
            for (int64_t b = 0; b < blocks; ++b) {
              v16 x;
              __builtin_memcpy(&x, vv + 16 * b, 64);
              accv[b] += w * x;
            }
          }
          const float inv = count ? 1.f / total : 0.f;
          for (int64_t b = 0; b < blocks; ++b) {
            v16 y = accv[b] * inv;
            __builtin_memcpy(o + 16 * b, &y, 64);
          }
          continue;
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
"""

_module = None
_tried = False


def load():
    """The compiled module, or None where it cannot be built (callers keep the per-query loop)."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    from specgen.kernels import int8_rows

    if os.environ.get("SPECGEN_ATTENTION_KERNEL", "auto") == "off" or not int8_rows.buildable():
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        flags = int8_rows._compile_flags()
        name = "specgen_query_attention_" + hashlib.sha256((SOURCE + " ".join(flags)).encode()).hexdigest()[:12]
        log.info("building the attention CPU kernel once (about 30 s)")
        _module = load_inline(name, cpp_sources=SOURCE, functions=["attend_queries"], extra_cflags=flags,
                              verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure means: keep the per-query loop
        log.warning("attention CPU kernel unavailable (%s); attending query by query", str(exc).splitlines()[0])
        _module = None
    return _module


def available() -> bool:
    return load() is not None


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seen: torch.Tensor | None, scaling: float,
           use_kernel: bool = True) -> torch.Tensor:
    """One query at a time, the same arithmetic for every window: the compiled kernel in float32 where it builds
    (and `use_kernel`), else `reference`. Shapes as `attend_queries`."""
    if use_kernel and q.dtype == torch.float32 and available():
        return attend_queries(q if q.stride(-1) == 1 else q.contiguous(), keys, values, seen, scaling)
    return reference(q, keys, values, seen, scaling)


def attend_queries(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seen: torch.Tensor | None,
                   scaling: float) -> torch.Tensor:
    """q [rows, heads, n, d]; keys, values [rows, kv_heads, width, d]; seen None or [rows, n, width] bool.
    Returns [rows, n, heads * d] (float32)."""
    empty = torch.empty(0, dtype=torch.bool)
    return load().attend_queries(q, keys, values, empty if seen is None else seen, float(scaling))


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seen: torch.Tensor | None,
              scaling: float) -> torch.Tensor:
    """The torch twin, and the path where the kernel cannot run: one `scaled_dot_product_attention` call per
    query over the keys it sees (read in place where they form one run, gathered otherwise); a query's heads
    attend together as the rows of one call. Shapes, and so sums, depend only on what the query sees."""
    rows, heads, n, d = q.shape
    kv_heads, width = keys.shape[1], keys.shape[2]
    out = q.new_empty(rows, n, heads * d)
    for row, slot, columns in _visible_columns(seen, rows, n, width):
        query = q[row, :, slot].reshape(1, kv_heads, heads // kv_heads, d)
        if isinstance(columns, slice):  # a chain slot sees one run of keys
            seen_keys, seen_values = keys[row, :, columns], values[row, :, columns]
        else:
            seen_keys, seen_values = keys[row].index_select(1, columns), values[row].index_select(1, columns)
        attended = F.scaled_dot_product_attention(query, seen_keys[None], seen_values[None], scale=scaling)
        out[row, slot] = attended.reshape(-1)
    return out


def _visible_columns(seen, rows: int, n: int, width: int) -> list[tuple[int, int, slice | torch.Tensor]]:
    """(row, slot, key columns) for every query: a slice where they form one run (every chain slot, cached
    keys in a sliding window included), else indices. Without a mask slot j sees the first width - n + j + 1."""
    if seen is None:
        return [(row, slot, slice(0, width - n + slot + 1)) for row in range(rows) for slot in range(n)]
    count = seen.sum(-1)
    first = seen.int().argmax(-1)
    last = width - 1 - seen.flip(-1).int().argmax(-1)
    runs = (last - first + 1 == count).tolist()
    first, last = first.tolist(), last.tolist()
    return [(row, slot, slice(first[row][slot], last[row][slot] + 1) if runs[row][slot]
             else seen[row, slot].nonzero().flatten()) for row in range(rows) for slot in range(n)]
