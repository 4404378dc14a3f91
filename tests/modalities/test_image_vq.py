"""The VQ image tokenizer helpers, on a tiny random VQModel and (when shipped) on assets/image/vq."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specgen.modalities.image.training import images as image_data
from specgen.modalities.image.models import default_paths
from specgen.modalities.image.vq import build_vq, decode, encode, load_vq, psnr, save_vq

from specgen.errors import InvalidRequest, ModelNotFound

# The shipped VQ measured 24.9 dB over these 32 held-out glyphs (assets/image/README.md); 2 dB of margin.
SHIPPED_GLYPH_PSNR_MIN = 23.0

TINY = dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            block_out_channels=(8, 8), norm_num_groups=4, latent_channels=4, vq_embed_dim=4,
            num_vq_embeddings=16, sample_size=16)


@pytest.fixture(scope="module")
def tiny_vq():
    torch.manual_seed(0)
    return build_vq(**TINY).eval()


def test_encode_decode_shapes(tiny_vq):
    images = image_data.make_dataset(3, seed=1).images[:, :16, :16]
    codes = encode(tiny_vq, images)
    assert codes.shape == (3, 8, 8) and codes.dtype == torch.int64
    assert codes.min() >= 0 and codes.max() < 16
    out = decode(tiny_vq, codes)
    assert out.shape == (3, 16, 16, 3) and out.dtype == np.uint8
    assert np.array_equal(decode(tiny_vq, codes), out)  # deterministic


def test_bad_inputs(tiny_vq):
    with pytest.raises(InvalidRequest, match="uint8"):
        encode(tiny_vq, np.zeros((1, 16, 16, 3), np.float32))
    with pytest.raises(InvalidRequest, match="0..15"):
        decode(tiny_vq, torch.full((1, 2, 2), 16))
    with pytest.raises(InvalidRequest, match=r"\[B, H, W\]"):
        decode(tiny_vq, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ModelNotFound, match="no VQ model"):
        load_vq("/nonexistent/vq")


def test_psnr():
    a = np.zeros((2, 4, 4, 3), np.uint8)
    assert psnr(a, a) == float("inf")
    assert psnr(a, a + 255) == pytest.approx(0.0)
    assert psnr(a, a + 1) == pytest.approx(48.13, abs=0.01)
    with pytest.raises(InvalidRequest):
        psnr(a, a[:1])


def test_save_load_round_trip(tiny_vq, tmp_path):
    save_vq(tiny_vq, tmp_path / "vq")
    loaded = load_vq(tmp_path / "vq")
    assert next(loaded.parameters()).dtype == torch.float32  # shipped fp16, run in fp32
    images = image_data.make_dataset(2, seed=2).images[:, :16, :16]
    assert (encode(loaded, images) == encode(tiny_vq, images)).float().mean() > 0.9


def test_shipped_vq_reconstructs_glyphs():
    path = default_paths()["vq"]
    if not (path / "config.json").exists():
        pytest.skip("assets/image/vq is not shipped")
    vq = load_vq(path)
    glyphs = image_data.source_items("glyph", 32, seed=0, split="val").images
    codes = encode(vq, glyphs)
    assert codes.shape == (32, 16, 16)
    assert psnr(decode(vq, codes), glyphs) >= SHIPPED_GLYPH_PSNR_MIN
