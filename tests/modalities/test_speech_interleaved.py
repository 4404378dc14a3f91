"""The interleaved speech layout: characters spoken again where they start, generation held to the text's order by
a prefix constraint, and speculative decoding exact under that constraint (greedy equality, chi-square against the
exactly enumerated constrained target, and a stale-mask control that must fail the same test)."""

import itertools

import numpy as np
import pytest
import torch
from tiny_models import save_tiny_speech_models

from specgen.errors import InvalidRequest
from specgen.modalities.speech.training.alignment import best_alignment
from specgen.modalities.speech.generator import SpeechGenerator, SpokenInOrder
from specgen.modalities.speech.models import SpeechVocab
from specgen.samplers import loop
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers.processing import Processing, prefix_routes, route_logits


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_speech_models(tmp_path_factory.mktemp("speech-il"), num_tokens=64, layout="interleaved")


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    return save_tiny_speech_models(tmp_path_factory.mktemp("speech-il3"), num_tokens=3, seed=4, layout="interleaved")


def test_best_alignment_matches_brute_force():
    rng = np.random.default_rng(0)
    for chars, frames in [(1, 4), (3, 3), (3, 7), (4, 9)]:
        scores = rng.normal(size=(chars, frames))
        best, best_path = -np.inf, None
        for cuts in itertools.combinations(range(1, frames), chars - 1):  # where each character starts
            path = np.searchsorted(np.array(cuts), np.arange(frames), side="right")
            total = scores[path, np.arange(frames)].sum()
            if total > best:
                best, best_path = total, path
        assert np.array_equal(best_alignment(scores), best_path)
    with pytest.raises(ValueError, match="cannot hold"):
        best_alignment(np.zeros((5, 3)))


def test_interleaved_sequence_and_its_errors():
    vocab = SpeechVocab(num_tokens=8, voices=("slt",), chars="ab ", layout="interleaved")
    seq, prompt_len = vocab.sequence("ab", "slt", [5, 6, 7], [2, 1])
    a, b = vocab.char_ids("ab")
    assert seq == [vocab.bos, vocab.voice_id("slt"), a, b, vocab.boa, a, 5, 6, b, 7, vocab.eos] and prompt_len == 5
    assert vocab.acoustic(seq) == [5, 6, 7]
    with pytest.raises(InvalidRequest, match="one duration"):
        vocab.sequence("ab", "slt", [5, 6, 7], [3, 1])
    prefix = SpeechVocab(num_tokens=8, voices=("slt",), chars="ab ")
    assert prefix.sequence("ab", "slt", [5, 6], None)[0] == [*prefix.prompt_ids("ab", "slt").tolist(), 5, 6, prefix.eos]
    with pytest.raises(InvalidRequest, match="layout"):
        SpeechVocab(num_tokens=8, voices=("slt",), chars="ab", layout="diagonal")


def test_spoken_in_order_routes():
    vocab = SpeechVocab(num_tokens=4, voices=("slt",), chars="ab", layout="interleaved")
    a, b = vocab.char_ids("ab")
    prompt = vocab.prompt_ids("ab", "slt")
    routes = SpokenInOrder(vocab).routes(prompt, [a, 1, b, 2])
    frames = [0, 1, 2, 3]
    assert (routes[0] == a).all()  # after BOA: the first character, whatever the model says
    assert routes[1, :4].tolist() == frames and (routes[1, 4:] == -1).all()  # after a character: a frame
    for row, onward in ((2, b), (4, vocab.eos)):  # after a frame: stay, or move on to the next character / EOS
        assert routes[row, :4].tolist() == frames
        assert (routes[row, vocab.char_base:] == onward).all() and routes[row, vocab.eos] == onward
        assert (routes[row, [vocab.bos, vocab.boa, vocab.pad, vocab.voice_id("slt")]] == -1).all()
    # from a committed context alone it agrees with the walk through the continuation
    again = SpokenInOrder(vocab).routes(torch.cat([prompt, torch.tensor([a, 1, b])]), [])
    assert torch.equal(again[0], routes[3])
    batched = prefix_routes(SpokenInOrder(vocab), [prompt, prompt], [[a, 1], [a, 2]])
    assert batched.shape == (2, 3, vocab.vocab_size)


def test_route_logits_merges_and_masks():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]], dtype=torch.float64)
    merged = route_logits(logits, torch.tensor([[0, 1, 1, -1]]))
    probs = logits.softmax(-1)[0]
    assert torch.allclose(merged.softmax(-1)[0], torch.stack([probs[0], probs[1] + probs[2], probs[3] * 0, probs[3] * 0])
                          / (1 - probs[3]))
    masked = route_logits(logits, torch.tensor([[0, -1, 2, 3]]))  # a pure mask keeps the other logits' bits
    assert torch.equal(masked[0, [0, 2, 3]], logits[0, [0, 2, 3]]) and masked[0, 1] == float("-inf")
    # decided per slot: a masked slot next to a merging one gets the bits it gets alone (window invariance)
    window = torch.randn(2, 4, dtype=torch.float32)
    routes = torch.tensor([[0, -1, 2, 3], [0, 1, 1, -1]])
    together = route_logits(window, routes)
    assert torch.equal(together[0], route_logits(window[:1], routes[:1])[0])
    assert torch.equal(together[1], route_logits(window[1:], routes[1:])[0])
    # a dropped token far above the kept ones cannot underflow the kept mass
    far = route_logits(torch.tensor([[500.0, 0.0, 1.0, 2.0]]), torch.tensor([[-1, 1, 1, 3]]))
    assert torch.isfinite(far[0, [1, 3]]).all() and not far.softmax(-1).isnan().any()


def _spoken_text(vocab, tokens):
    return "".join(vocab.chars[t - vocab.char_base] for t in tokens if t >= vocab.char_base)


def test_greedy_sd_equals_ar_and_follows_the_text(tiny):
    target, draft, codec = tiny
    generator = SpeechGenerator(target, draft, codec)
    runs = {m: generator.stream("hello there", method=m, temperature=0, max_new_tokens=60, num_samples=2,
                                **({} if m == "ar" else {"num_draft_tokens": 3})) for m in ("ar", "sd")}
    tokens = {m: [[], []] for m in runs}
    for m, events in runs.items():
        for e in events:
            tokens[m][e.row].extend(e.tokens)
    assert tokens["sd"] == tokens["ar"]
    vocab = generator.vocab
    for row in tokens["ar"]:
        spoken = _spoken_text(vocab, row)
        assert "hello there".startswith(spoken) and spoken and row[0] == vocab.char_ids("h")[0]
        assert all(not (x >= vocab.char_base and y >= vocab.char_base) for x, y in zip(row, row[1:]))
    result = generator.generate("hello there", method="sd", temperature=0, max_new_tokens=60)
    assert result.tokens and max(result.tokens) < 64 and len(result.audio) > 0


class ConstrainedOracle:
    """The tiny target's float64 logits with the layout's routes applied: the constrained target's law."""

    def __init__(self, model, vocab):
        self.model, self.constraint = model, SpokenInOrder(vocab)

    def logits(self, context):
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([list(context)])).logits[0, -1].double()
        return route_logits(logits, self.constraint.routes(torch.tensor(context), [])[0])


def _sequences(generator, method, length=4, samples=2000):
    vocab = generator.vocab
    rows = [[] for _ in range(samples)]
    for e in generator.stream("ab", voice="awb", method=method, temperature=1.0, top_k=0, max_new_tokens=length,
                              num_samples=samples, seed=5, **({} if method == "ar" else {"num_draft_tokens": 2})):
        rows[e.row].extend(e.tokens)
    expected = target_joint(ConstrainedOracle(generator.model, vocab), Processing(temperature=1.0),
                            vocab.prompt_ids("ab", "awb").tolist(), length)
    folded = {}
    for seq, p in expected.items():
        cut = seq[:seq.index(vocab.eos) + 1] if vocab.eos in seq else seq
        folded[cut] = folded.get(cut, 0.0) + p
    return [tuple(r) for r in rows], folded


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_sampling_matches_the_exact_constrained_target(small_vocab, method):
    target, draft, codec = small_vocab
    generator = SpeechGenerator(target, draft, codec, dtype=torch.float64)
    samples, law = _sequences(generator, method)
    assert len(law) > 20  # frames, the forced order and EOS all appear
    fit = goodness_of_fit(samples, law)
    assert fit.p_value > 1e-4, fit


def test_stale_masks_fail_the_same_test(small_vocab, monkeypatch):
    """Control: verification that routes every slot as if nothing had been drafted before it samples another law."""
    target, draft, codec = small_vocab
    generator = SpeechGenerator(target, draft, codec, dtype=torch.float64)

    def stale(constraint, contexts, continuations):
        fresh = prefix_routes(constraint, contexts, continuations)
        return fresh[:, :1].expand_as(fresh)

    monkeypatch.setattr(loop, "prefix_routes", stale)
    samples, law = _sequences(generator, "sd")
    assert goodness_of_fit(samples, law).p_value < 1e-6


def test_trees_are_refused_under_a_prefix_constraint(tiny):
    target, draft, codec = tiny
    generator = SpeechGenerator(target, draft, codec)
    processing = generator.processing()
    assert processing.constraint is not None
    with pytest.raises(InvalidRequest, match="prefix constraint"):
        processing(torch.zeros(1, generator.vocab.vocab_size))


@pytest.mark.skipif(not __import__("shutil").which("flite"), reason="flite needed")
def test_evaluation_reports_generated_speech_against_the_ceiling(tiny, tmp_path):
    pytest.importorskip("pocketsphinx")
    from specgen.modalities.speech.training import spoken_corpus
    from specgen.modalities.speech.training.evaluate import evaluate, summarise, wer_interval

    target, draft, codec = tiny
    spoken_corpus.build_corpus(tmp_path, 2, voices=("slt",), progress=False)
    report = evaluate(tmp_path, codec, n=2, model=target, draft=draft, true_mel=False, method="sd")
    generic = report["wer"]["generic_lm"]
    assert set(generic["ci95"]) == {"original", "gl_tokens", "generated"} and "gl_true_mel" not in generic
    value, low, high = generic["generated_minus_gl_tokens"]
    assert low <= value <= high
    rows = report["rows"]
    assert all(r["frames"] > 0 and r["generated_frames"] > 0 for r in rows)
    merged = summarise(rows[:1] + rows[1:], codec)  # shard reports merge from their rows
    assert merged["wer"] == report["wer"] and merged["utterances"] == 2
    rows = [{"a_lm_edits": 1, "a_lm_words": 4, "b_lm_edits": 0, "b_lm_words": 4},
            {"a_lm_edits": 3, "a_lm_words": 4, "b_lm_edits": 1, "b_lm_words": 4}]
    assert wer_interval(rows, "a", "lm")[0] == 0.5 and wer_interval(rows, "a", "lm", minus="b")[0] == 0.375
