"""ImageGenerator on tiny random models: Jacobi decoding equals plain greedy decoding token for token, sampling
matches the exact guided target (chi-square), and bad requests get clear errors."""

import pytest
import torch
from tiny_models import GuidedTransformers, save_tiny_image_model

from specgen.errors import InvalidRequest
from specgen.modalities.image.generator import CodesOnly, ImageGenerator
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers.processing import Processing


@pytest.fixture(scope="module")
def grid4(tmp_path_factory):
    return save_tiny_image_model(tmp_path_factory.mktemp("image4"), num_codes=16, grid=4)


@pytest.fixture(scope="module")
def grid2(tmp_path_factory):
    return save_tiny_image_model(tmp_path_factory.mktemp("image2"), num_codes=4, grid=2, seed=3)


@pytest.mark.parametrize("method", ["sjd", "mc-sjd", "gumbel-sjd"])
def test_greedy_jacobi_equals_greedy_decoding(grid4, method):
    model, vq = grid4
    generator = ImageGenerator(model, vq)
    plain = generator.generate("red K on blue", method="ar", temperature=0, num_samples=2)
    jacobi = generator.generate("red K on blue", method=method, temperature=0, num_samples=2, window=6)
    assert jacobi.tokens == plain.tokens
    assert all(len(t) == 16 and max(t) < 16 for t in jacobi.tokens)
    assert jacobi.stats["steps"] <= plain.stats["steps"] and jacobi.image.size == (16, 16)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "sjd", "mc-sjd", "gumbel-sjd"])
def test_sampling_matches_the_guided_target(grid2, method):
    model, vq = grid2
    generator = ImageGenerator(model, vq, dtype=torch.float64)
    prompt, scale = "blue 3", 2.0
    oracle = GuidedTransformers(generator.model, generator.vocab, prompt, scale)
    expected = target_joint(oracle, Processing(top_k=3, hooks=(CodesOnly(4),)), oracle.prompt, 4)
    result = generator.generate(prompt, method=method, top_k=3, guidance_scale=scale, num_samples=3000, seed=5,
                                **({} if method == "ar" else {"window": 4}))
    fit = goodness_of_fit([tuple(t) for t in result.tokens], expected)
    assert fit.p_value > 1e-4, fit
    assert method == "ar" or result.stats["tau"] > 1.1


def test_bad_requests_get_clear_errors(grid4):
    model, vq = grid4
    generator = ImageGenerator(model, vq)
    with pytest.raises(InvalidRequest, match="unknown word"):
        generator.generate("purple Q", method="ar")
    with pytest.raises(InvalidRequest, match="unknown image method"):
        generator.generate("red K", method="medusa")
    with pytest.raises(InvalidRequest, match="window"):
        generator.generate("red K", method="mc-sjd", window=1)
    with pytest.raises(InvalidRequest, match="init must be one of random, left"):
        generator.generate("red K", method="mc-sjd", init="zeros")


def test_guidance_defaults_to_the_models_own(grid4, tmp_path):
    """A model whose generation_config.json names `guidance_scale` decodes with it by default (1: one row, no
    unconditioned twin); one that names none keeps the recipe's 3; an explicit scale wins over both."""
    import json
    import shutil

    model, vq = grid4
    own = shutil.copytree(model, tmp_path / "model")
    config = own / "generation_config.json"
    config.write_text(json.dumps({**(json.loads(config.read_text()) if config.exists() else {}),
                                  "guidance_scale": 1.0}))
    plain, unguided = ImageGenerator(model, vq), ImageGenerator(own, vq)
    assert plain.processing().guidance_scale == 3.0 and unguided.processing().guidance_scale is None
    assert unguided.processing(guidance_scale=2.0).guidance_scale == 2.0
    by_default = unguided.generate("red K on blue", method="ar", temperature=0)
    assert by_default.tokens == plain.generate("red K on blue", method="ar", temperature=0, guidance_scale=1.0).tokens
