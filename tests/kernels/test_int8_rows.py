"""The int8 CPU kernel: equal to its torch twin up to float32 summation order, and row-invariant bit for bit
(a row's result never depends on how many rows are multiplied with it) — for the kernel and for the
`torch._weight_int8pack_mm` fallback that `Int8Linear` uses where the kernel cannot be built."""

import pytest
import torch

from specgen.kernels import cpu_build, int8_rows
from specgen.modalities.runtime import int8_linear as int8_linear
from specgen.modalities.runtime.int8_linear import Int8Linear, quantize_rows

needs_kernel = pytest.mark.skipif(not cpu_build.buildable(), reason="no C++ compiler/ninja or no AVX2/FMA here")


@needs_kernel
def test_the_kernel_builds_where_it_can():
    assert int8_rows.available()  # a broken build must fail here, not skip the kernel's tests


def random_layer(out_features, in_features, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return quantize_rows(torch.randn(out_features, in_features, generator=generator))


# wide: the 16-lane AVX-512 path where it is built (K % 16 == 0), else the 8-lane AVX2 path it falls back to
PATHS = pytest.mark.parametrize("wide", [True, False], ids=["wide", "avx2"])


@needs_kernel
@PATHS
@pytest.mark.parametrize("out_features,in_features", [(1, 8), (7, 16), (37, 40), (130, 264), (4099, 64)])
def test_kernel_matches_its_torch_twin(out_features, in_features, wide):
    weight, scales = random_layer(out_features, in_features)
    x = torch.randn(40, in_features, generator=torch.Generator().manual_seed(1))
    for rows in (1, 2, 3, 5, 6, 7, 13, 40):
        got = int8_rows.int8_rows_mm(x[:rows], weight, scales, wide)
        want = int8_rows.reference(x[:rows], weight, scales)
        assert got.dtype == torch.float32 and got.shape == (rows, out_features)
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4 * want.abs().max().item())


@needs_kernel
@PATHS
@pytest.mark.parametrize("in_features", [96, 104])  # 104: not a multiple of 16, the AVX2 path even when wide
def test_kernel_rows_are_invariant_to_the_number_of_rows(in_features, wide):
    weight, scales = random_layer(301, in_features)
    x = torch.randn(30, in_features, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([int8_rows.int8_rows_mm(x[i:i + 1], weight, scales, wide) for i in range(30)])
    for rows in range(1, 31):  # past one pass (6 or 8 rows) the kernel runs groups of rows: same bits
        assert torch.equal(int8_rows.int8_rows_mm(x[:rows], weight, scales, wide), alone[:rows]), rows


@needs_kernel
def test_the_wide_path_is_built_where_the_cpu_has_avx512():
    assert int8_rows.wide() == ("avx512f" in cpu_build.cpu_flags())
    if int8_rows.wide():  # a different summation order than the AVX2 path: never mixed within one layer
        weight, scales = random_layer(64, 96)
        x = torch.randn(3, 96, generator=torch.Generator().manual_seed(5))
        assert not torch.equal(int8_rows.int8_rows_mm(x, weight, scales, True),
                               int8_rows.int8_rows_mm(x, weight, scales, False))


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "fallback"])
def test_int8_linear_is_row_invariant_on_either_kernel(kernel, monkeypatch):
    if kernel and not cpu_build.buildable():
        pytest.skip("no C++ compiler/ninja or no AVX2/FMA here")
    monkeypatch.setattr(int8_rows, "available", lambda: kernel)
    layer = Int8Linear(*random_layer(64, 48, seed=3))
    x = torch.randn(1, 11, 48, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([layer(x[:, i:i + 1]) for i in range(11)], 1)
    for rows in range(1, 12):
        assert torch.equal(layer(x[:, :rows]), alone[:, :rows])
    assert ("bf16" in int8_linear.backend()) != kernel
