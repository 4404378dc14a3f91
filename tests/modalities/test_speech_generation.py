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


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_sampling_matches_the_exact_target(small_vocab, method):
    target, draft, codec = small_vocab
    generator = SpeechGenerator(target, draft, codec, dtype=torch.float64)
    vocab = generator.vocab
    prompt = vocab.prompt_ids("ab", "awb").tolist()
    processing = Processing(temperature=1.0, hooks=(AcousticOnly(vocab.num_tokens, vocab.eos),))
    expected = target_joint(Oracle(generator.model), processing, prompt, 3)
    # sequences that ended early at EOS are prefixes; fold the joint onto what generation returns
    folded = {}
    for seq, p in expected.items():
        cut = seq[:seq.index(vocab.eos) + 1] if vocab.eos in seq else seq
        folded[cut] = folded.get(cut, 0.0) + p
    result = generator.generate("ab", voice="awb", method=method, temperature=1.0, top_k=0, max_new_tokens=3,
                                num_samples=2000, seed=11, decode=False,
                                **({} if method == "ar" else {"num_draft_tokens": 2}))
    samples = [tuple(s["tokens"]) for s in result.samples]
    # put EOS back where a sample stopped short of the cap (generate drops it)
    samples = [s + (vocab.eos,) if len(s) < 3 else s for s in samples]
    fit = goodness_of_fit(samples, folded)
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
