"""SpeechGenerator on tiny random speech models: speculative decoding equals plain greedy decoding token for token,
sampling matches the exact target (chi-square), and bad requests get clear errors."""

from pathlib import Path

import pytest
import torch
from tiny_models import save_tiny_speech_models

from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.speech.generator import AcousticOnly, SpeechGenerator
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers.processing import Processing


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_speech_models(tmp_path_factory.mktemp("speech"), num_tokens=64)


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    return save_tiny_speech_models(tmp_path_factory.mktemp("speech3"), num_tokens=3, seed=4)


def test_greedy_sd_equals_greedy_ar(tiny):
    target, draft, codec = tiny
    generator = SpeechGenerator(target, draft, codec)
    plain = generator.generate("hello there", method="ar", temperature=0, max_new_tokens=40, num_samples=2)
    spec = generator.generate("hello there", method="sd", temperature=0, max_new_tokens=40, num_samples=2,
                              num_draft_tokens=3)
    assert [s["tokens"] for s in spec.samples] == [s["tokens"] for s in plain.samples]
    assert spec.tokens and max(spec.tokens) < 64
    assert spec.stats["steps"] <= plain.stats["steps"] and spec.stats["drafted"] > 0
    assert spec.audio.dtype.name == "float32" and len(spec.audio) > 0 and spec.sample_rate == 16000


class Oracle:
    """The target's float64 logits of the next token given a context."""

    def __init__(self, model):
        self.model = model

    def logits(self, context):
        with torch.no_grad():
            return self.model(input_ids=torch.tensor([list(context)])).logits[0, -1].double()


def _exact_law(generator, text: str, voice: str, length: int) -> dict:
    """The target's exact law of `length` new tokens at temperature 1 (acoustic tokens or EOS), with sequences that
    end at EOS folded onto their prefix up to EOS (what generation returns)."""
    vocab = generator.vocab
    processing = Processing(temperature=1.0, hooks=(AcousticOnly(vocab.num_tokens, vocab.eos),))
    expected = target_joint(Oracle(generator.model), processing, vocab.prompt_ids(text, voice).tolist(), length)
    folded = {}
    for seq, p in expected.items():
        cut = seq[:seq.index(vocab.eos) + 1] if vocab.eos in seq else seq
        folded[cut] = folded.get(cut, 0.0) + p
    return folded


def _with_eos(generator, result, length: int) -> list[tuple]:
    """Sampled token tuples with EOS put back where a sample stopped short of `length` (generate drops it)."""
    eos = generator.vocab.eos
    return [tuple(s["tokens"]) + ((eos,) if len(s["tokens"]) < length else ()) for s in result.samples]


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_sampling_matches_the_exact_target(small_vocab, method):
    target, draft, codec = small_vocab
    generator = SpeechGenerator(target, draft, codec, dtype=torch.float64)
    result = generator.generate("ab", voice="awb", method=method, temperature=1.0, top_k=0, max_new_tokens=3,
                                num_samples=2000, seed=11, decode=False,
                                **({} if method == "ar" else {"num_draft_tokens": 2}))
    fit = goodness_of_fit(_with_eos(generator, result, 3), _exact_law(generator, "ab", "awb", 3))
    assert fit.p_value > 1e-4, fit
    assert method == "ar" or result.stats["drafted"] > 0


def test_bad_requests_get_clear_errors(tiny, tmp_path):
    target, draft, codec = tiny
    generator = SpeechGenerator(target, draft, codec)
    with pytest.raises(InvalidRequest, match="empty"):
        generator.generate("   ", method="ar")
    with pytest.raises(InvalidRequest, match="cannot read"):
        generator.generate("hello {world}", method="ar")
    with pytest.raises(InvalidRequest, match="unknown voice"):
        generator.generate("hello", method="ar", voice="nobody")
    with pytest.raises(InvalidRequest, match="unknown speech method"):
        generator.generate("hello", method="pcg-x")
    with pytest.raises(InvalidRequest, match="max_new_tokens"):
        generator.generate("hello", method="ar", max_new_tokens=10_000)
    with pytest.raises(InvalidRequest, match="num_draft_tokens"):
        generator.generate("hello", method="sd", num_draft_tokens=0)
    with pytest.raises(ModelNotFound):
        SpeechGenerator(tmp_path / "missing", draft, codec)
    with pytest.raises(InvalidRequest, match="needs a draft"):
        SpeechGenerator(target, None, codec).generate("hello", method="sd")


SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "speech"


@pytest.mark.skipif(not (SHIPPED / "draft" / "model.safetensors").exists(), reason="the speech models are not shipped")
def test_shipped_pair_greedy_sd_equals_ar():
    generator = SpeechGenerator()
    plain = generator.generate("keep them in one big pile.", method="ar", temperature=0, max_new_tokens=48,
                               decode=False)
    spec = generator.generate("keep them in one big pile.", method="sd", temperature=0, max_new_tokens=48,
                              decode=False)
    assert spec.tokens == plain.tokens and spec.stats["tau"] > 1.5


# ---- the relaxed rules: pcg and ssd ----------------------------------------------------------------------------


@pytest.mark.parametrize("method, knobs", [("pcg", {"theta": 0.2}), ("pcg", {"theta": 0.2, "residual": "thinning"}),
                                           ("ssd", {"beta": 0.3})])
@pytest.mark.parametrize("temperature", [0, 0.8])
def test_relaxed_methods_give_valid_audio_tokens(tiny, method, knobs, temperature):
    generator = SpeechGenerator(*tiny)
    result = generator.generate("hello there", method=method, temperature=temperature, max_new_tokens=30,
                                num_samples=2, seed=1, **knobs)
    for sample in result.samples:
        assert sample["tokens"] and all(0 <= t < 64 for t in sample["tokens"]) and len(sample["audio"]) > 0
    stats = result.stats
    assert stats["lossless"] is False and stats["drafted"] > 0
    assert stats["acceptance_level"] == {"pcg": "group", "ssd": "tolerance"}[method]
    if method == "pcg":
        groups = generator.groups(knobs["theta"])
        for sample in result.samples:
            assert len(sample["groups"]) == len(sample["tokens"])
            assert all(t in groups.members(g) for t, g in zip(sample["tokens"], sample["groups"]))
        assert result.groups == result.samples[0]["groups"]
    else:
        assert result.groups is None and "groups" not in result.samples[0]


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_pcg_with_singleton_groups_is_sd_token_for_token(tiny, temperature):
    """theta >= 1 makes every group a singleton; with the explicit residual the same noise gives sd's tokens."""
    generator = SpeechGenerator(*tiny)
    options = dict(temperature=temperature, max_new_tokens=40, num_samples=3, seed=7, decode=False)
    sd = generator.generate("good night", method="sd", **options)
    pcg = generator.generate("good night", method="pcg", theta=1.0, **options)
    assert [s["tokens"] for s in pcg.samples] == [s["tokens"] for s in sd.samples]
    assert [s["groups"] for s in pcg.samples] == [s["tokens"] for s in pcg.samples]
    assert pcg.stats["accepted"] == sd.stats["accepted"] and pcg.stats["exact_accepted"] == sd.stats["accepted"]


def test_pcg_singletons_with_thinning_sample_the_exact_target(small_vocab):
    """Thinning draws the residual differently from sd, so tokens differ, but at theta = 1 the law is the target's."""
    target, draft, codec = small_vocab
    generator = SpeechGenerator(target, draft, codec, dtype=torch.float64)
    result = generator.generate("ab", voice="awb", method="pcg", theta=1.0, residual="thinning", temperature=1.0,
                                top_k=0, max_new_tokens=2, num_samples=2000, seed=5, decode=False, num_draft_tokens=1)
    fit = goodness_of_fit(_with_eos(generator, result, 2), _exact_law(generator, "ab", "awb", 2))
    assert fit.p_value > 1e-4, fit


def test_pcg_first_group_follows_the_coarse_target(tiny):
    """The group committed first is distributed as W p of the target's first law (chi-square over samples)."""
    generator = SpeechGenerator(*tiny, dtype=torch.float64)
    vocab, theta = generator.vocab, 0.2
    groups = generator.groups(theta)
    assert groups.stats(range(vocab.num_tokens))["mean_size"] > 1.5  # the groups really overlap
    processing = generator.processing(temperature=1.0, top_k=0)
    prompt = vocab.prompt_ids("hello", "slt")
    coarse = groups.coarse(processing(Oracle(generator.model).logits(prompt.tolist())))
    result = generator.generate("hello", method="pcg", theta=theta, temperature=1.0, top_k=0, max_new_tokens=3,
                                num_samples=3000, seed=2, decode=False, num_draft_tokens=2)
    first = [(sample["groups"][0],) if sample["tokens"] else (vocab.eos,)  # EOS is its own group
             for sample in result.samples]
    fit = goodness_of_fit(first, {(g,): float(p) for g, p in enumerate(coarse.tolist()) if p > 0})
    assert fit.p_value > 1e-4 and fit.dof > 10, fit
    assert result.stats["accepted"] > result.stats["exact_accepted"]  # the groups did accept more


def test_groups_are_cached_per_model_and_theta(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    generator = SpeechGenerator(*tiny)
    groups = generator.groups(0.3)
    cached = sorted((tmp_path / "home" / "groups").glob("*.npz"))
    assert len(cached) == 1 and "theta0.3" in cached[0].name
    again = SpeechGenerator(*tiny).groups(0.3)  # a fresh generator loads the cached tables
    assert torch.equal(again.member_ids, groups.member_ids) and again.vocab_size == generator.vocab.vocab_size
    cached[0].write_bytes(b"damaged")  # a damaged entry is rebuilt
    assert torch.equal(SpeechGenerator(*tiny).groups(0.3).member_ids, groups.member_ids)
    specials = range(generator.vocab.num_tokens, generator.vocab.vocab_size)
    assert all(groups.members(t) == [t] for t in specials)  # EOS, voices and characters are singletons


@pytest.mark.parametrize("knobs, words", [
    ({"method": "pcg", "theta": 1.5}, "theta must be <= 1.0"),
    ({"method": "pcg", "theta": -0.1}, "theta must be >= 0.0"),
    ({"method": "pcg", "theta": "wide"}, "theta must be a float"),
    ({"method": "pcg", "theta": float("nan")}, "theta must be finite"),
    ({"method": "pcg", "residual": "best"}, "residual must be one of explicit, thinning"),
    ({"method": "ssd", "beta": 2.0}, "beta must be <= 1.0"),
    ({"method": "ssd", "beta": float("nan")}, "beta must be a number in"),
    ({"method": "sd", "theta": 0.3}, "has no parameter"),
])
def test_bad_relaxed_knobs_are_clear_errors(tiny, knobs, words):
    with pytest.raises(InvalidRequest, match=words.replace("(", r"\(")):
        SpeechGenerator(*tiny).generate("hello", max_new_tokens=5, decode=False, **knobs)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_parallel_drafting_gives_sd_tokens(tiny, temperature):
    """`parallel` (the draft in a process of its own, docs/parallel.md) serves sd's chains from the branches it
    drafted ahead: the same tokens as sd for the same seed, at temperature 0 and when sampling."""
    generator = SpeechGenerator(*tiny)
    options = dict(temperature=temperature, max_new_tokens=40, num_samples=3, seed=7, decode=False,
                   num_draft_tokens=3)
    sd = generator.generate("good night", method="sd", **options)
    parallel = generator.generate("good night", method="parallel", branches=3, **options)
    assert [s["tokens"] for s in parallel.samples] == [s["tokens"] for s in sd.samples]
    assert parallel.stats["ahead_hits"] + parallel.stats["ahead_misses"] > 0
