"""The EAGLE-style head's methods on tiny random image models: greedy `eagle` (and lantern at its identity
settings) equal plain greedy decoding token for token, sampled `eagle` matches the exact guided target
(chi-square) while a strongly relaxed lantern++ does not (negative control), lambda = 1 gives eagle's samples
exactly, bad requests get clear errors, and the head's trainer resumes and exports."""

import json

import pytest
import torch
from tiny_models import GuidedTransformers, save_tiny_image_head, save_tiny_image_model

from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.image.eagle_head.head import EagleHead
from specgen.modalities.image.generator import CodesOnly, ImageGenerator
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers.processing import Processing


def with_head(root, **options):
    model, vq = save_tiny_image_model(root, **options)
    return model, vq, save_tiny_image_head(root, model)


@pytest.fixture(scope="module")
def grid4(tmp_path_factory):
    return with_head(tmp_path_factory.mktemp("lantern4"), num_codes=16, grid=4)


@pytest.fixture(scope="module")
def grid2(tmp_path_factory):
    return with_head(tmp_path_factory.mktemp("lantern2"), num_codes=4, grid=2, seed=3)


@pytest.mark.parametrize("guidance", [None, 1.0])
@pytest.mark.parametrize("method,knobs", [("eagle", {}), ("eagle", {"shape": "chain-8"}), ("lantern++", {"lam": 1.0}),
                                          ("lantern", {"delta": 0.0, "shape": "k-ary-2x2"})])
def test_greedy_head_methods_equal_greedy_decoding(grid4, method, knobs, guidance):
    model, vq, head = grid4
    generator = ImageGenerator(model, vq, head=head)
    plain = generator.generate("red K on blue", method="ar", temperature=0, num_samples=2, guidance_scale=guidance)
    tree = generator.generate("red K on blue", method=method, temperature=0, num_samples=2, guidance_scale=guidance,
                              **knobs)
    assert tree.tokens == plain.tokens
    assert tree.stats["steps"] <= plain.stats["steps"]


def test_head_levels_run_as_compiled_float32_steps(grid4, monkeypatch):
    """Where the compiled decode step builds, every head level of a chain is one compiled call, whatever dtype the
    target is served in (a bfloat16 head would take torch's per-op path, several times slower a level)."""
    from specgen.kernels import decode_step

    if not decode_step.available():
        pytest.skip("the compiled decode step does not build here")
    from specgen.modalities.image.eagle_head import drafter

    # a CPU where bfloat16 linears are batch-invariant and faster (an AMD EPYC here), whatever this one does
    monkeypatch.setattr(drafter, "fast_matmul_dtype", lambda model, rows=32: torch.bfloat16)
    model, vq, head = grid4
    generator = ImageGenerator(model, vq, head=head)
    calls = []
    original = decode_step.decode
    monkeypatch.setattr(decode_step, "decode",
                        lambda runner, *a, **k: calls.append(runner) or original(runner, *a, **k))
    result = generator.generate("red K", method="eagle", shape="chain-3", seed=1)
    # only drafts opt in to the compiled step: every call is the head's
    assert calls and all(runner is calls[0] and runner.matmul_dtype is None for runner in calls)
    assert len(calls) >= 2 * result.stats["steps"]  # a catch-up forward and two chain levels a step, less the ends


def test_lambda_one_gives_eagles_samples_and_relaxing_accepts_more(grid4):
    model, vq, head = grid4
    generator = ImageGenerator(model, vq, head=head)
    eagle = generator.generate("red K", method="eagle", num_samples=6, seed=2)
    identity = generator.generate("red K", method="lantern++", lam=1.0, num_samples=6, seed=2)
    assert identity.tokens == eagle.tokens and identity.stats["relaxed_share"] == 0
    relaxed = generator.generate("red K", method="lantern++", lam=50.0, neighbours=8, num_samples=6, seed=2)
    assert relaxed.stats["relaxed_share"] > 0 and relaxed.stats["lossless"] is False


@pytest.mark.slow
# a tree (drafted node by node with an ancestor mask), and a chain (one new pair per level through the head's
# compiled float32 step, verified under the causal mask, walked by the batched chain walk)
@pytest.mark.parametrize("shape,dtype", [("k-ary-2x2", torch.float64), ("chain-3", torch.float32)])
def test_sampled_eagle_matches_the_guided_target_and_relaxed_lantern_does_not(grid2, shape, dtype):
    model, vq, head = grid2
    generator = ImageGenerator(model, vq, head=head, dtype=dtype)
    prompt, scale = "blue 3", 2.0
    oracle = GuidedTransformers(generator.model, generator.vocab, prompt, scale)
    expected = target_joint(oracle, Processing(top_k=3, hooks=(CodesOnly(4),)), oracle.prompt, 4)
    options = dict(top_k=3, guidance_scale=scale, num_samples=2000, seed=5, shape=shape)
    exact = generator.generate(prompt, method="eagle", **options)
    fit = goodness_of_fit([tuple(t) for t in exact.tokens], expected)
    assert fit.p_value > 1e-4, fit
    assert exact.stats["tau"] > 1.1
    relaxed = generator.generate(prompt, method="lantern++", lam=1000.0, neighbours=3, **options)
    assert goodness_of_fit([tuple(t) for t in relaxed.tokens], expected).p_value < 1e-6


def test_head_requests_get_clear_errors(grid4, tmp_path):
    model, vq, head = grid4
    generator = ImageGenerator(model, vq, head=head)
    with pytest.raises(InvalidRequest, match="lam"):
        generator.generate("red K", method="lantern++", lam=0.5)
    with pytest.raises(InvalidRequest, match="tree shape"):
        generator.generate("red K", method="eagle", shape="bushy")
    with pytest.raises(InvalidRequest, match="codebook size"):
        generator.generate("red K", method="lantern++", neighbours=16)
    with pytest.raises(InvalidRequest, match="no parameter"):
        generator.generate("red K", method="eagle", lam=2.0)
    with pytest.raises(ModelNotFound, match="train image-head"):
        ImageGenerator(model, vq, head=tmp_path / "nothing").generate("red K", method="eagle")


def test_head_training_resumes_and_exports(tmp_path):
    from specgen.modalities.image.training.eagle_head import HeadConfig, train_head

    options = dict(run_dir=str(tmp_path / "run"), chunks=2, chunk_size=2, batch_size=2, eval_every=1)
    train_head(HeadConfig(steps=2, **options))
    summary = train_head(HeadConfig(steps=3, out=str(tmp_path / "head"), **options))
    assert summary["resumed_from"] == [2] and summary["samples"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    head = EagleHead.load(tmp_path / "head")
    card = json.loads((tmp_path / "head" / "head.json").read_text())
    assert 0 <= card["after"]["acceptance"] <= 1 and head.fc.weight.dtype == torch.float32
