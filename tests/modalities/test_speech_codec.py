"""The acoustic tokenizer: log-mel frames, k-means, Griffin-Lim decoding and WAV I/O, on synthetic audio (no
corpus or shipped codebook needed); the corpus builder on a few sentences when espeak-ng or flite is installed."""

import json
import shutil

import numpy as np
import pytest
import torch

from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.speech import codec
from specgen.modalities.speech.training import spoken_corpus


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small FFTs: extra threads only contend on a busy machine
    yield
    torch.set_num_threads(threads)


def chirp(seconds=0.6, rate=16000):
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * (200 + 600 * t) * t)).astype(np.float32)


def test_log_mel_shape_and_frame_rate():
    frames = codec.log_mel(chirp(1.0))
    assert frames.shape == (16000 // 256 + 1, 80) and frames.dtype == torch.float32
    assert codec.MelConfig().frame_rate == 62.5


def test_kmeans_finds_separated_clusters_and_tokens_round_trip(tmp_path):
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(8, 80, generator=g) * 5
    frames = centres.repeat(50, 1) + 0.01 * torch.randn(400, 80, generator=g)
    centroids, report = codec.fit_kmeans(frames, 8, iters=10, seed=1)
    assert report["empty_clusters"] == 0 and report["inertia"][-1] < 0.01
    cd = codec.AcousticCodec(centroids)
    tokens = cd.quantise(frames)
    assert torch.equal(cd.quantise(cd.frames(tokens)), tokens)
    cd.save(tmp_path / "codec")
    loaded = codec.AcousticCodec.load(tmp_path / "codec")
    assert torch.equal(loaded.centroids, cd.centroids) and loaded.cfg == cd.cfg


def test_griffin_lim_resynthesis_is_close_in_mel_and_deterministic(tmp_path):
    audio = chirp()
    frames = codec.log_mel(audio)
    out = codec.vocode(frames)
    assert np.array_equal(out, codec.vocode(frames))  # zero initial phase: no randomness
    assert abs(len(out) - len(audio)) <= 256 and np.abs(out).max() <= 1.0
    assert codec.mel_distance(frames, codec.log_mel(out)) < 0.5
    path = codec.write_wav(tmp_path / "x.wav", out)
    back = codec.read_wav(path)
    assert len(back) == len(out) and np.abs(back - out).max() < 1e-3


def test_an_utterance_of_one_or_two_frames_still_decodes():
    """A sampled end-of-speech after a frame or two must give a short clip, not an STFT padding error."""
    frames = codec.log_mel(chirp())
    hop = codec.MelConfig().hop_length
    for count in (1, 2, 3):
        out = codec.vocode(frames[:count])
        assert len(out) == max(count - 1, 1) * hop and np.isfinite(out).all()
    long = codec.vocode(frames[:40])
    assert abs(len(long) - 40 * hop) <= 4 * hop  # longer utterances keep the STFT's own length


def test_bad_inputs_get_clear_errors(tmp_path):
    with pytest.raises(InvalidRequest, match="mono"):
        codec.log_mel(np.zeros((2, 4000), np.float32))
    with pytest.raises(InvalidRequest, match="0..7"):
        codec.AcousticCodec(torch.zeros(8, 80)).decode([3, 8])
    with pytest.raises(InvalidRequest, match="at least"):
        codec.fit_kmeans(torch.zeros(4, 80), 8)
    with pytest.raises(ModelNotFound, match="codebook"):
        codec.AcousticCodec.load(tmp_path)
    with pytest.raises(InvalidRequest, match="no such audio"):
        codec.read_wav(tmp_path / "missing.wav")


def test_sentences_are_speakable_and_reproducible():
    first = spoken_corpus.sentences(20, seed=3)
    assert first == spoken_corpus.sentences(20, seed=3) and len(set(first)) == 20
    assert all(spoken_corpus.is_speakable(s) for s in first)
    assert spoken_corpus.normalise("Don\u2019t  PANIC") == "don't panic"
    with pytest.raises(InvalidRequest, match="voice"):
        spoken_corpus.synthesise("hello", "nobody")


@pytest.mark.skipif(not (shutil.which("espeak-ng") and shutil.which("flite")), reason="espeak-ng and flite needed")
def test_corpus_resumes_and_records_speed(tmp_path):
    voices = ("slt", "en-us-f3")
    summary = spoken_corpus.build_corpus(tmp_path, 3, voices=voices, progress=False)
    assert summary["utterances"] == 3 and summary["voices"] == sorted(voices)
    assert set(summary["engines"]) == {"flite", "espeak-ng"} and summary["bytes"] > 0
    before = (tmp_path / "manifest.jsonl").read_text()
    with open(tmp_path / "manifest.jsonl", "a") as f:
        f.write('{"id": "torn')  # a kill mid-line
    summary = spoken_corpus.build_corpus(tmp_path, 4, voices=voices, progress=False)
    lines = (tmp_path / "manifest.jsonl").read_text().splitlines()
    assert len(lines) == 4 and "\n".join(lines[:3]) + "\n" == before
    utt = spoken_corpus.read_manifest(tmp_path)[0]
    audio = codec.read_wav(tmp_path / utt.file)
    assert abs(len(audio) / 16000 - utt.seconds) < 1e-3 and json.loads(lines[3])["voice"] == "en-us-f3"


@pytest.mark.skipif(not (shutil.which("flite")), reason="flite needed")
def test_an_evaluation_set_starts_past_the_corpus(tmp_path):
    summary = spoken_corpus.build_corpus(tmp_path, 5, voices=("slt",), progress=False, start=3)
    assert summary["utterances"] == 2
    assert [u.text for u in spoken_corpus.read_manifest(tmp_path)] == spoken_corpus.sentences(5)[3:]
    with pytest.raises(InvalidRequest, match="start"):
        spoken_corpus.build_corpus(tmp_path, 5, voices=("slt",), progress=False, start=5)
