"""Attention one query at a time, for every query of a forward in one call (the served Gemma's attention, and
the image target's under bfloat16 serving).

out[row, slot, head] = softmax_j(scale * q . k_j) v_j over exactly the keys that query sees, in position order.
The arithmetic of one query depends only on its own vector and the keys and values it sees. Where the head
dimension is a multiple of 16: the dot products of sixteen visible keys at a time (16-lane accumulators over the
head dimension, then one fixed shuffle tree across the lanes; a last short block padded with a zero key), a max,
the weights sixteen at a time by a vector exp (2^n times a degree-7 polynomial, ~1e-7 relative), and the weighted
values summed over even and odd keys in two register chains. Otherwise one key at a time with `std::exp`. A
drafted token scored in a window of 8 therefore gets the very bits it gets scored alone, as with a
`scaled_dot_product_attention` call per query (`reference`), without that loop's dozen small torch calls per
query and layer (about 1,000 per 4-slot Gemma forward). Without AVX-512 the same chains and tree run on 8-lane
halves held in registers (four keys' accumulators at a time, the values one 16-lane block at a time): the
generic 16-lane code spilled them to the stack there and ran 3x slower (benchmarks/query-attention-latest.md is
from such a machine; its results equal the generic code's bit for bit).

`seen` chooses the keys: None means slot j of n sees the first width - n + j + 1 columns (a chain after its
cached context); otherwise a [rows, n, width] bool mask (tree slots, sliding windows, padded prompt rows).
Float32 only; the C++ extension (csrc/query_attention.cpp) builds on first use beside the int8 kernel (same
compiler requirements). Where it cannot build, or for other dtypes, `reference` is the path.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specgen.kernels import cpu_build


@functools.cache
def load():
    """The compiled module, or None where it cannot be built (callers keep the per-query loop)."""
    return cpu_build.build("specgen_query_attention_", ("query_attention.cpp",), ["attend_queries"],
                           "SPECGEN_ATTENTION_KERNEL",
                           "attention", "attending query by query")


def available() -> bool:
    return load() is not None


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seen: torch.Tensor | None,
           scaling: float) -> torch.Tensor:
    """One query at a time, the same arithmetic for every window: the compiled kernel in float32 where it builds
    (`SPECGEN_ATTENTION_KERNEL=off` turns it off), else `reference`. Shapes as `attend_queries`."""
    if q.dtype == torch.float32 and available():
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
