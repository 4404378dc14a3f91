"""The per-query attention kernel: equal to its torch twin (one scaled_dot_product_attention per query) up to
float32 rounding, and window-invariant bit for bit — a query's output never depends on which other queries,
rows or masked keys share the call, which is what keeps the served Gemma's windows equal to plain decoding."""

import pytest
import torch

from specgen.kernels import cpu_build, int8_rows, query_attention

needs_kernel = pytest.mark.skipif(not cpu_build.buildable(), reason="no C++ compiler/ninja or no AVX2/FMA here")


@needs_kernel
def test_the_kernel_builds_where_it_can():
    assert query_attention.available()


def _inputs(rows, heads, kv_heads, n, width, dim, seed=0, capacity_extra=7):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, n, dim, generator=generator)
    # keys and values as the cache hands them over: a slice of a longer buffer (strided rows and heads)
    keys = torch.randn(rows, kv_heads, width + capacity_extra, dim, generator=generator)[:, :, :width]
    values = torch.randn(rows, kv_heads, width + capacity_extra, dim, generator=generator)[:, :, :width]
    return q, keys, values


@needs_kernel
@pytest.mark.parametrize("rows,heads,kv_heads,n,width,dim", [(1, 1, 1, 1, 1, 16), (2, 4, 1, 5, 37, 48),
                                                               (3, 6, 2, 8, 90, 20), (1, 4, 4, 3, 11, 256)])
def test_kernel_matches_its_torch_twin(rows, heads, kv_heads, n, width, dim):
    q, keys, values = _inputs(rows, heads, kv_heads, n, width, dim)
    for seen in (None, torch.rand(rows, n, width, generator=torch.Generator().manual_seed(2)) < 0.4):
        if seen is not None:
            seen[..., -1] = True  # every query sees at least one key
        got = query_attention.attend_queries(q, keys, values, seen, 0.125)
        want = query_attention.reference(q.double(), keys.double(), values.double(), seen, 0.125)
        assert got.shape == (rows, n, heads * dim) and got.dtype == torch.float32
        assert torch.allclose(got.double(), want, atol=2e-6)


@needs_kernel
def test_a_query_gets_the_same_bits_alone_as_in_a_window_batch_or_mask():
    q, keys, values = _inputs(3, 4, 1, 6, 40, 32, seed=3)
    window = query_attention.attend_queries(q, keys, values, None, 0.2)  # slot j sees the first 35 + j keys
    for row in range(3):
        for slot in range(6):
            seen = 40 - 6 + slot + 1
            alone = query_attention.attend_queries(q[row:row + 1, :, slot:slot + 1], keys[row:row + 1, :, :seen],
                                                   values[row:row + 1, :, :seen], None, 0.2)
            assert torch.equal(alone[0, 0], window[row, slot])
    # the same visibility as an explicit mask over a wider cache: identical bits
    wider_q, wider_keys, wider_values = q, torch.cat([keys, keys[:, :, :5]], 2), torch.cat([values, values[:, :, :5]], 2)
    mask = torch.zeros(3, 6, 45, dtype=torch.bool)
    for slot in range(6):
        mask[:, slot, : 35 + slot] = True
    assert torch.equal(query_attention.attend_queries(wider_q, wider_keys, wider_values, mask, 0.2), window)


@needs_kernel
def test_negative_control_the_twin_is_not_bitwise_window_invariant_for_free():
    """Guards the test above: a batched attention over the window (one call, causal mask) is close to the
    per-query result but not equal bit for bit on these shapes — the invariance is the kernel's doing."""
    q, keys, values = _inputs(1, 4, 1, 8, 64, 64, seed=5)
    per_query = query_attention.attend_queries(q, keys, values, None, 0.125)
    causal = torch.ones(8, 64, dtype=torch.bool).tril(56)
    batched = torch.nn.functional.scaled_dot_product_attention(
        q.reshape(1, 1, 4, 8, 64).flatten(1, 2), keys.expand(1, 4, 64, 64), values.expand(1, 4, 64, 64),
        attn_mask=causal, scale=0.125).transpose(1, 2).reshape(1, 8, 4 * 64)
    assert torch.allclose(batched, per_query, atol=1e-5)
    assert not torch.equal(batched, per_query)
