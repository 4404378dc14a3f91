"""The speech token trainer: two steps, a checkpoint, a resume onto the same batches, and the export the generator
loads; all on a small synthetic token file (no corpus, no shipped models)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_models import save_say_corpus

from specgen.errors import InvalidRequest
from specgen.modalities.speech.codec import AcousticCodec
from specgen.modalities.speech.generator import SpeechGenerator
from specgen.modalities.speech.training.codebook import load_tokens
from specgen.modalities.speech.training.token_models import TrainConfig, train

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 20, size=24)
    np.savez_compressed(folder / "tokens.npz", tokens=rng.integers(0, 32, size=int(lengths.sum())).astype(np.uint16),
                        offsets=np.concatenate([[0], np.cumsum(lengths)]), num_tokens=np.array(32),
                        texts=np.array([f"sentence number {i}." for i in range(24)]),
                        voices=np.array(["slt", "awb"] * 12), ids=np.array([str(i) for i in range(24)]))
    return folder


def config(token_file, run_dir, steps, **extra):
    return TrainConfig(role="target", steps=steps, batch_size=4, lr=1e-3, tokens=str(token_file), run_dir=str(run_dir),
                       warmup=2, eval_every=1, overrides=TINY, **extra)


def test_two_steps_then_resume_equals_an_unbroken_run(token_file, tmp_path):
    torch.set_num_threads(1)
    unbroken = train(config(token_file, tmp_path / "a", 3))
    train(config(token_file, tmp_path / "b", 2))
    resumed = train(config(token_file, tmp_path / "b", 3, out=str(tmp_path / "export")))
    assert resumed["resumed_from_steps"] == [2] and resumed["steps"] == 3
    assert resumed["final_train_loss"] == pytest.approx(unbroken["final_train_loss"], rel=1e-5)
    assert resumed["eval"]["eval_loss"] == pytest.approx(unbroken["eval"]["eval_loss"], rel=1e-5)
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)
    export = tmp_path / "export"
    assert {"config.json", "model.safetensors", "vocab.json", "training.json"} <= {p.name for p in export.iterdir()}
    AcousticCodec(torch.randn(32, 80)).save(tmp_path / "codec")
    result = SpeechGenerator(export, export, tmp_path / "codec").generate("sentence", method="sd", max_new_tokens=6,
                                                                           temperature=0, decode=False)
    assert 1 <= len(result.tokens) <= 6 and max(result.tokens) < 32


def test_export_only_and_mismatched_settings(token_file, tmp_path):
    train(config(token_file, tmp_path / "run", 1))
    summary = train(config(token_file, tmp_path / "run", 5, out=str(tmp_path / "out")), export_only=True)
    assert summary["steps"] == 1 and summary["planned_steps"] == 5
    bigger = TrainConfig(role="target", steps=2, batch_size=8, lr=1e-3, tokens=str(token_file),
                         run_dir=str(tmp_path / "run"), overrides=TINY)
    with pytest.raises(InvalidRequest, match="different settings"):
        train(bigger)
    with pytest.raises(InvalidRequest, match="no checkpoint"):
        train(config(token_file, tmp_path / "empty", 2), export_only=True)
    assert len(load_tokens(token_file)["offsets"]) == 25


SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "speech"


@pytest.mark.skipif(not (SHIPPED / "corpus" / "tokens.npz").exists(), reason="the encoded corpus is not shipped")
def test_train_speech_command_runs_two_steps_then_resumes(tmp_path, capsys):
    from specgen.app.cli import main

    argv = ["--threads", "1", "train", "speech", "--role", "draft", "--tokens", str(SHIPPED / "corpus"),
            "--out", str(tmp_path / "run")]
    assert main([*argv, "--steps", "2"]) == 0
    assert main([*argv, "--steps", "3"]) == 0
    summary = json.loads((tmp_path / "run" / "training.json").read_text())
    assert summary["steps"] == 3 and summary["resumed_from_steps"] == [2] and summary["params"] == 686_208
    assert summary["layout"] == "interleaved"  # auto: the shipped corpus has durations
    vocab = json.loads((tmp_path / "run" / "export" / "vocab.json").read_text())
    assert vocab["units"] == "phonemes" and len(vocab["chars"]) == 76  # aligned to phonemes: durations.json says so
    distilled = ["--threads", "1", "train", "speech", "--role", "draft", "--tokens", str(SHIPPED / "corpus"),
                 "--out", str(tmp_path / "kd"), "--teacher", str(SHIPPED / "target"), "--steps", "1"]
    assert main(distilled) == 0
    summary = json.loads((tmp_path / "kd" / "training.json").read_text())
    assert summary["teacher"] == str(SHIPPED / "target") and "eval_kl" in summary["eval"]
    assert (tmp_path / "run" / "export" / "model.safetensors").exists()
    capsys.readouterr()


def test_aligned_corpus_trains_the_interleaved_layout(tmp_path):
    """align -> durations.npz -> an interleaved bf16 run -> an export whose generation speaks the text in order."""
    from specgen.modalities.speech.training.alignment import align_corpus, load_durations

    texts, lengths = save_say_corpus(tmp_path)
    report = align_corpus(tmp_path, tmp_path / "codec", held_out=4, gaussian_rounds=1, network_rounds=1,
                          log=lambda m: None)
    durations = load_durations(tmp_path)
    assert report["utterances"] == 16 and len(durations) == 16
    assert all(len(d) == len(t) and d.min() >= 1 and d.sum() == n for d, t, n in zip(durations, texts, lengths))
    summary = train(config(tmp_path, tmp_path / "run", 2, out=str(tmp_path / "export"), layout="interleaved",
                           bf16=True))
    assert summary["layout"] == "interleaved" and summary["bf16_autocast"] and summary["steps"] == 2
    generator = SpeechGenerator(tmp_path / "export", tmp_path / "export", tmp_path / "codec")
    assert generator.vocab.layout == "interleaved"
    result = generator.generate("say one now.", method="sd", max_new_tokens=20, temperature=0, decode=False)
    assert result.tokens and max(result.tokens) < 32
    (tmp_path / "durations.npz").unlink()
    with pytest.raises(Exception, match="durations"):
        train(config(tmp_path, tmp_path / "run2", 1, layout="interleaved"))


def test_distillation_from_a_teacher_lowers_the_kl(token_file, tmp_path):
    torch.set_num_threads(1)
    train(config(token_file, tmp_path / "teacher", 2, out=str(tmp_path / "teacher-export")))
    first = train(config(token_file, tmp_path / "student", 1, teacher=str(tmp_path / "teacher-export")))
    later = train(config(token_file, tmp_path / "student", 12, teacher=str(tmp_path / "teacher-export")))
    assert first["teacher"] and "eval_kl" in first["eval"] and later["eval"]["eval_kl"] < first["eval"]["eval_kl"]
    with pytest.raises(InvalidRequest, match="different settings"):  # a resume cannot switch teachers
        train(config(token_file, tmp_path / "student", 13))


def test_input_noise_replaces_only_generated_acoustic_inputs(token_file, tmp_path):
    from specgen.modalities.speech.training.token_models import LMTask

    clean = LMTask(config(token_file, tmp_path / "clean", 1))
    noisy = LMTask(config(token_file, tmp_path / "noisy", 1, input_noise=0.3))
    for step in range(3):
        (ids, labels), (noisy_ids, noisy_labels) = clean.batch(step), noisy.batch(step)
        assert torch.equal(labels, noisy_labels)  # the targets stay the true tokens
        assert torch.equal(noisy.batch(step)[0], noisy_ids)  # a pure function of (seed, step)
        changed = noisy_ids != ids
        assert not changed[labels == -100].any()  # the prompt (BOS, voice, text, BOA) is never touched
        assert torch.equal(noisy_ids[ids >= 32], ids[ids >= 32])  # characters and EOS stay
        assert changed.any() and (noisy_ids[changed] < 32).all()  # replacements are acoustic tokens
    # over many batches about 30 % of the generated acoustic inputs are replaced (a few collide with the truth)
    hits = total = 0
    for step in range(40):
        (ids, labels), (noisy_ids, _) = clean.batch(step), noisy.batch(step)
        acoustic = (labels != -100) & (ids < 32)
        hits, total = hits + int((noisy_ids != ids)[acoustic].sum()), total + int(acoustic.sum())
    assert 0.3 * (1 - 1 / 32) - 0.04 < hits / total < 0.3 + 0.04
    summary = train(config(token_file, tmp_path / "noisy-run", 2, input_noise=0.3))
    assert summary["input_noise"] == 0.3 and "--input-noise 0.3" in summary["command"]
    with pytest.raises(InvalidRequest, match="different settings"):  # a resume cannot change the noise
        train(config(token_file, tmp_path / "noisy-run", 3))
    with pytest.raises(InvalidRequest, match="input noise"):
        train(config(token_file, tmp_path / "bad", 1, input_noise=1.0))


def test_init_starts_from_an_exported_model(token_file, tmp_path):
    train(config(token_file, tmp_path / "base", 2, out=str(tmp_path / "base-export")))
    from specgen.modalities.speech.models import load_speech_lm
    from specgen.modalities.speech.training.token_models import LMTask

    task = LMTask(config(token_file, tmp_path / "ft", 1, init=str(tmp_path / "base-export")))
    start = load_speech_lm(tmp_path / "base-export")
    assert all(torch.equal(a, b) for a, b in zip(task.model.state_dict().values(), start.state_dict().values()))
    wider = dict(TINY, hidden_size=64)
    with pytest.raises(InvalidRequest, match="not a target of this shape"):
        LMTask(TrainConfig(role="target", steps=1, batch_size=4, lr=1e-3, tokens=str(token_file),
                           run_dir=str(tmp_path / "w"), overrides=wider, init=str(tmp_path / "base-export")))


def test_model_noise_feeds_the_models_own_samples(token_file, tmp_path):
    from specgen.modalities.speech.training.token_models import LMTask

    clean = LMTask(config(token_file, tmp_path / "clean", 1))
    task = LMTask(config(token_file, tmp_path / "own", 1, input_noise=0.5, noise_source="model"))
    (ids, labels), (own_ids, own_labels) = clean.batch(0), task.batch(0)
    assert torch.equal(labels, own_labels) and torch.equal(task.batch(0)[0], own_ids)
    assert torch.equal(own_ids[labels == -100], ids[labels == -100]) and (own_ids[own_ids != ids] < 32).all()
    # a model that puts all its mass on token 7 feeds back only 7s where it replaces
    def certain_logits(batch_ids):
        logits = torch.full((*batch_ids[:, :-1].shape, task.vocab.vocab_size), -30.0)
        logits[..., 7] = 30.0
        return logits

    task._logits = certain_logits
    fed = task.batch(0)[0]
    replaced = fed != ids
    assert replaced.any() and (fed[replaced] == 7).all()
    assert 0.4 < replaced[(labels != -100) & (ids < 32) & (ids != 7)].float().mean() < 0.6
    summary = train(config(token_file, tmp_path / "own-run", 2, input_noise=0.5, noise_source="model"))
    assert summary["noise_source"] == "model" and "--noise-source model" in summary["command"]
    with pytest.raises(InvalidRequest, match="noise source"):
        train(config(token_file, tmp_path / "bad", 1, input_noise=0.2, noise_source="echo"))
