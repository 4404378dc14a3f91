"""Phoneme input for the speech models: espeak-ng's transcription (the bundled library, the same as the espeak-ng
program's, and speech without the program), the phoneme vocabulary, alignment to phonemes, training and generation
that speaks the phonemes in order; and appending an encoded corpus to new audio."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_models import save_say_corpus

from specgen.app.cli import main
from specgen.errors import InvalidRequest, MissingExtra
from specgen.modalities.speech import phonemes
from specgen.modalities.speech.codec import AcousticCodec, write_wav
from specgen.modalities.speech.models import SpeechVocab, default_vocab

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=160)
ASSETS = Path(__file__).resolve().parents[2] / "assets" / "speech"
needs_program = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the espeak-ng program is not installed")
needs_shipped = pytest.mark.skipif(not (ASSETS / "target" / "model.safetensors").exists(),
                                   reason="the speech models are not shipped")


@pytest.fixture
def backend(monkeypatch):
    """Chooses SPECGEN_ESPEAK for one test, with an empty lexicon so that every word is transcribed again."""
    monkeypatch.setattr(phonemes, "_LEXICON", {})

    def choose(name):
        monkeypatch.setenv(phonemes.BACKEND_ENV, name)
        phonemes._LEXICON.clear()
    return choose


def failing_program(folder):
    """An espeak-ng on PATH that fails the way a broken install does."""
    program = folder / "espeak-ng"
    program.write_text("#!/bin/sh\necho 'espeak-ng: cannot open /nonexistent/phontab' >&2\nexit 1\n")
    program.chmod(0o755)
    return folder


def test_library_gives_the_programs_transcriptions(backend):
    backend("library")
    # checked against `espeak-ng -q -x --sep=_ -v en-us` 1.51 (Debian bookworm), which also stresses a function
    # word said alone ('a_n_d, D_'@2, j_'U@): stress marks are dropped, so the units are the same
    assert phonemes._espeak_library(["through", "pneumonia", "1990", "you're", "the", "and"]) == [
        "T_r_'u:", "n_u:_m_'oU_n_i@", "n_'aI_n_t_i:_n_h_'V_n_d_r_I2_d n_'aI_n_t_i", "j_U@", "D_@2", "a_n_d"]
    assert phonemes.transcribe(["knight", "hello", "there", "'"]) == {
        "knight": ("n", "aI", "t"), "hello": ("h", "@", "l", "oU"), "there": ("D", "e@"), "'": ()}


def test_library_is_safe_from_several_threads(backend):
    backend("library")
    words = ["through", "rough", "knight", "pneumonia", "1990"] * 20
    expected = phonemes._espeak_library(words)
    results = []
    threads = [threading.Thread(target=lambda: results.append(phonemes._espeak_library(words))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


@needs_program
def test_library_equals_the_program_on_corpus_words(backend):
    """The shipped corpus was aligned on the program's transcriptions: the library must give the same units."""
    texts = np.load(ASSETS / "corpus" / "tokens.npz")["texts"][::12]  # 300 of the 3,600 shipped sentences
    backend("library")
    library = phonemes.corpus_units(texts)
    words = sorted(phonemes._LEXICON)
    by_library = dict(phonemes._LEXICON)
    backend("binary")
    assert phonemes.corpus_units(texts) == library
    assert len(words) > 1000 and {w: phonemes._LEXICON[w] for w in words} == by_library


@needs_shipped
def test_speech_without_the_espeak_ng_program(tmp_path):
    """A pip install alone speaks: PATH holds only the venv's programs, so no espeak-ng."""
    bin_dir = Path(sys.executable).parent
    assert not (bin_dir / "espeak-ng").exists()
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1",
           "SPECGEN_HOME": os.environ["SPECGEN_HOME"]}
    done = subprocess.run([str(bin_dir / "specgen"), "generate", "speech", "--text", "hello there.", "--out",
                           str(tmp_path / "x.wav"), "--max-new-tokens", "20", "--temperature", "0"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "x.wav").stat().st_size > 44


@needs_shipped
def test_a_failing_program_is_one_error_line(backend, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", f"{failing_program(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    backend("binary")
    code = main(["generate", "speech", "--text", "hello there.", "--out", str(tmp_path / "x.wav")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: the espeak-ng program failed (exit 1")
    assert "phontab" in err


def test_the_program_only_when_the_library_cannot_load(backend, tmp_path, monkeypatch):
    monkeypatch.setattr(phonemes, "_lib", None)
    monkeypatch.setattr(phonemes, "_lib_error", "libespeak-ng from espeakng-loader cannot be loaded: test")
    monkeypatch.setenv("PATH", str(tmp_path))  # no program either
    backend("auto")
    with pytest.raises(MissingExtra, match="libespeak-ng or the espeak-ng program.*cannot be loaded: test"):
        phonemes.transcribe(["hello"])
    monkeypatch.setenv("PATH", str(failing_program(tmp_path)))
    with pytest.raises(phonemes.EspeakFailed, match="exit 1"):  # auto fell back to the program
        phonemes.transcribe(["hello"])
    backend("Library")  # case-insensitive, and never the program
    with pytest.raises(MissingExtra, match="cannot be loaded: test"):
        phonemes.transcribe(["hello"])
    backend("espeak")
    with pytest.raises(InvalidRequest, match="SPECGEN_ESPEAK must be one of auto, library, binary"):
        phonemes.transcribe(["hello"])


def test_text_units_are_sounds_and_punctuation():
    assert phonemes.text_units("through rough, knight.") == ["T", "r", "u:", "r", "V", "f", ",", "n", "aI", "t", "."]
    # stress marks are dropped; a number is read out; a batch of words equals one call per word
    words = ["life", "1990", "you're", "pneumonia"]
    batch = phonemes.transcribe(words)
    phonemes._LEXICON.clear()
    assert {w: phonemes.transcribe([w])[w] for w in words} == batch
    assert all("'" not in u and "," not in u for units in batch.values() for u in units) and len(batch["1990"]) > 8
    with pytest.raises(InvalidRequest, match="no sounds"):
        phonemes.text_units("' .")


def test_units_outside_the_inventory_are_mapped_or_dropped():
    assert phonemes.fit_to_inventory(["a#", "T", "x", "."], ("a", "T", ".")) == ["a", "T", "."]
    units = phonemes.corpus_units(["one two.", "three!"])
    assert units == [["w", "V", "n", "t", "u:", "."], ["T", "r", "i:", "!"]]
    assert set(phonemes.PUNCTUATION) <= set(phonemes.inventory(units))


def test_phoneme_vocabulary_reads_text_and_round_trips(tmp_path):
    inventory = phonemes.inventory(phonemes.corpus_units(["say one now.", "hello there"]))
    vocab = default_vocab(32, "interleaved", inventory)
    assert vocab.units == "phonemes" and vocab.vocab_size == 32 + 4 + 6 + len(inventory)
    ids = vocab.char_ids("Say ONE now.")
    assert [vocab.chars[i - vocab.char_base] for i in ids] == ["s", "eI", "w", "V", "n", "n", "aU", "."]
    vocab.save(tmp_path / "vocab.json")
    assert SpeechVocab.load(tmp_path) == vocab
    assert json.loads((tmp_path / "vocab.json").read_text())["units"] == "phonemes"
    with pytest.raises(InvalidRequest, match="cannot read"):
        vocab.char_ids("caf\u00e9")
    with pytest.raises(InvalidRequest, match="units"):
        dataclasses.replace(vocab, units="syllables")
    frames = list(range(12))
    seq, prompt = vocab.sequence("say one now.", "slt", frames, [2, 1, 1, 1, 2, 1, 3, 1])
    assert seq[prompt] == ids[0] and seq[prompt + 1:prompt + 3] == [0, 1] and seq[-1] == vocab.eos
    with pytest.raises(InvalidRequest, match="duration"):
        vocab.sequence("say one now.", "slt", frames, [12])  # one duration per character is not one per phoneme


def test_phoneme_alignment_trains_a_model_that_speaks_in_order(tmp_path):
    from specgen.modalities.speech.generator import SpeechGenerator
    from specgen.modalities.speech.training.alignment import align_corpus, load_durations, load_inventory
    from specgen.modalities.speech.training.token_models import TrainConfig, train

    texts, lengths = save_say_corpus(tmp_path)
    report = align_corpus(tmp_path, tmp_path / "codec", held_out=4, gaussian_rounds=1, network_rounds=1,
                          units="phonemes", log=lambda m: None)
    (tmp_path / "durations.json").write_text(json.dumps(report))
    inventory = load_inventory(tmp_path)
    assert report["units"] == "phonemes" and inventory == tuple(report["inventory"]) and "V" in inventory
    units = phonemes.corpus_units(texts)
    assert all(len(d) == len(u) and d.min() >= 1 and d.sum() == n
               for d, u, n in zip(load_durations(tmp_path), units, lengths))
    cfg = TrainConfig(role="target", steps=2, batch_size=4, lr=1e-3, tokens=str(tmp_path),
                      run_dir=str(tmp_path / "run"), warmup=2, eval_every=1, overrides=TINY, layout="interleaved",
                      out=str(tmp_path / "export"))
    assert train(cfg)["steps"] == 2
    generator = SpeechGenerator(tmp_path / "export", tmp_path / "export", tmp_path / "codec")
    vocab = generator.vocab
    assert vocab.units == "phonemes" and vocab.chars == inventory
    runs = {}
    for method in ("ar", "sd"):
        runs[method] = generator.generate("say two now.", method=method, max_new_tokens=60, temperature=0,
                                          decode=False)
    assert runs["sd"].tokens == runs["ar"].tokens and max(runs["ar"].tokens) < 32
    stream = [t for e in generator.stream("say two now.", method="ar", max_new_tokens=60, temperature=0)
              for t in e.tokens]
    spoken = [vocab.chars[t - vocab.char_base] for t in stream if t >= vocab.char_base]
    assert spoken and spoken == phonemes.text_units("say two now.")[:len(spoken)]


def test_encoding_appends_an_encoded_corpus_after_new_audio(tmp_path):
    from specgen.modalities.speech.training.codebook import encode_corpus, load_tokens

    codec = AcousticCodec(torch.randn(16, 80, generator=torch.Generator().manual_seed(0)))
    codec.save(tmp_path / "codec")
    rng = np.random.default_rng(0)
    for name, count in (("a", 2), ("b", 3)):
        folder = tmp_path / name
        (folder / "wav").mkdir(parents=True)
        with open(folder / "manifest.jsonl", "w") as f:
            for i in range(count):
                write_wav(folder / "wav" / f"{name}{i}.wav", 0.1 * rng.standard_normal(4000 + 800 * i))
                f.write(json.dumps({"id": f"{name}{i}", "text": f"text {name} {i}", "voice": "slt",
                                    "file": f"wav/{name}{i}.wav", "seconds": 0.3, "synth_s": 0.01}) + "\n")
    encode_corpus(tmp_path / "b", tmp_path / "codec", tmp_path / "old")
    info = encode_corpus([tmp_path / "a"], tmp_path / "codec", tmp_path / "all", append=tmp_path / "old")
    merged, old = load_tokens(tmp_path / "all"), load_tokens(tmp_path / "old")
    assert info["utterances"] == 5 and list(merged["ids"]) == ["a0", "a1", "b0", "b1", "b2"]
    start = merged["offsets"][2]
    assert np.array_equal(merged["tokens"][start:], old["tokens"])
    assert merged["offsets"][-1] - start == old["offsets"][-1]
    AcousticCodec(torch.randn(16, 80)).save(tmp_path / "other")
    with pytest.raises(InvalidRequest, match="another codebook"):
        encode_corpus([tmp_path / "a"], tmp_path / "other", tmp_path / "bad", append=tmp_path / "old")
