"""The pcg speed/quality frontier of `specgen bench speech` on tiny random speech models: the theta sweep with
pocketsphinx WER, the speaker-similarity proxy and the token-swap stress test end to end, its report and plot, and
the pieces it is built from (bootstrap intervals, voice profiles, the swap test, the choice of theta)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_models import save_tiny_speech_corpus, save_tiny_speech_models

from specgen.app.cli import main
from specgen.app.bench.speech_frontier import QualityBound, choose_theta
from specgen.modalities.speech.training.quality import bootstrap_mean_ci
from specgen.modalities.speech.codec import AcousticCodec
from specgen.modalities.speech.training.quality import VoiceProfiles, load_corpus, separation, swap_test
from specgen.samplers.groups import build_groups


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech-frontier")
    target, draft, codec = save_tiny_speech_models(root, num_tokens=64)
    return target, draft, codec, save_tiny_speech_corpus(root / "corpus", num_tokens=64)


def test_theta_sweep_runs_end_to_end_and_writes_report_and_plot(tiny, tmp_path):
    from specgen.app.bench import speech as speech_bench
    from specgen.modalities.speech.generator import SpeechGenerator

    target, draft, codec, corpus = tiny
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "good night"}\n{"id": "b", "text": "open the box", "voice": "awb"}\n')
    result = speech_bench.run_bench_speech(prompts_path=prompts, max_new_tokens=10,
                                              generator=SpeechGenerator(target, draft, codec), thetas=[1.0, 0.25],
                                              quality=True, corpus=corpus, swap_utterances=3)
    assert set(result) == {"methods", "items", "env", "frontier"}  # the bench contract, plus the frontier
    assert set(result["methods"]) == {"ar", "sd", "ssd", "pcg", "auto"}  # the default methods
    frontier = result["frontier"]
    rows = {r["variant"]: r for r in frontier["rows"]}
    # the registry's default theta (0.5) joins every sweep
    assert set(rows) == {"ar", "sd", "ssd beta=0.1", "pcg theta=1", "pcg theta=0.5", "pcg theta=0.25", "auto"}
    for row in rows.values():
        assert row["speedup_vs_ar"] > 0 and row["speedup_vs_sd"] > 0 and 0 <= row["wer"] and -1 <= row["similarity"] <= 1
    for key in ("sd", "ssd beta=0.1", "pcg theta=1", "pcg theta=0.25"):
        low, high = rows[key]["delta_wer_ci95"]
        assert low <= rows[key]["delta_wer"] <= high
        low, high = rows[key]["delta_similarity_ci95"]
        assert low - 1e-12 <= rows[key]["delta_similarity"] <= high + 1e-12
    # theta = 1 is sd: same tokens for the same seed, so the same WER and similarity
    assert rows["pcg theta=1"]["wer"] == rows["sd"]["wer"]
    assert rows["pcg theta=1"]["similarity"] == pytest.approx(rows["sd"]["similarity"])
    scored = [i for i in result["items"] if not i.get("greedy")]
    assert all({"edits", "words", "similarity", "speedup_vs_sd"} <= set(i) for i in scored)
    swaps = {s["theta"]: s for s in frontier["swap_test"]}
    assert set(swaps) == {1.0, 0.5, 0.25} and swaps[1.0]["utterances"] == 3
    assert swaps[1.0]["swapped_fraction"] == 0 and swaps[1.0]["delta_wer"] == 0 and swaps[1.0]["mel_l1"] == 0
    assert swaps[0.25]["swapped_fraction"] > 0
    assert frontier["speaker_proxy"]["utterances"] == 3 and frontier["choice"]["bound"]["delta_wer_max"] == 0.03

    paths = speech_bench.write_bench_speech(result, tmp_path / "out").runs
    assert set(paths) == {"json", "md", "png"}
    for name in ("speech-frontier-latest.json", "speech-frontier-latest.md", "speech-frontier-latest.png"):
        assert (tmp_path / "out" / name).exists()
    assert json.loads(paths["json"].read_text())["frontier"]["rows"]
    markdown = paths["md"].read_text()
    assert "## Speed/quality frontier" in markdown and "**proxy**" in markdown and "Token-swap stress test" in markdown
    assert "| `pcg θ=0.25` |" in markdown and paths["png"].name in markdown
    assert "speech-frontier-latest.png" in (tmp_path / "out" / "speech-frontier-latest.md").read_text()
    with Image.open(paths["png"]) as image:
        assert image.width > 600 and image.height > 300


@pytest.mark.parametrize("argv, words", [
    (["--thetas", "1.5"], ["--thetas", "[0, 1]"]),
    (["--thetas", "0.3", "--methods", "ar,sd"], ["--thetas", "pcg"]),
    (["--betas", "0.2", "--methods", "pcg"], ["--betas", "ssd"]),
    (["--swap-rate", "0.5,0.6"], ["--swap-rate", "one number"]),
])
def test_bad_sweep_options_are_one_error_line(argv, words, capsys):
    code = main(["bench", "speech", *argv])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert all(w in err for w in words)


def test_bootstrap_interval_contains_the_point_estimate():
    rng = np.random.default_rng(3)
    for n in (2, 5, 30):
        values = rng.normal(size=n)
        weights = rng.integers(1, 12, size=n)
        for w in (None, weights):
            point, low, high = bootstrap_mean_ci(values, w)
            assert low <= point <= high
            assert point == pytest.approx(np.average(values, weights=w))
    assert bootstrap_mean_ci([0.2]) == (0.2, 0.2, 0.2)
    assert bootstrap_mean_ci([]) is None
    assert bootstrap_mean_ci([1.0, 2.0, 3.0], seed=1) == bootstrap_mean_ci([1.0, 2.0, 3.0], seed=1)


def _voice(pitch_hz: float, brightness: float, seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    """A crude synthetic voice: a pulse train at `pitch_hz` through a one-pole filter (brightness in (0, 1))."""
    rng = np.random.default_rng(seed)
    n = int(16000 * seconds)
    pulses = np.zeros(n)
    pulses[::int(16000 / pitch_hz)] = 1.0
    signal, state = np.zeros(n), 0.0
    for i, x in enumerate(pulses + 0.01 * rng.standard_normal(n)):
        state = brightness * state + x
        signal[i] = state
    return (0.3 * signal / np.abs(signal).max()).astype(np.float32)


def test_voice_profiles_tell_two_voices_apart_and_silence_scores_zero():
    references = {"low": [_voice(100, 0.95, seed=s) for s in range(3)],
                  "high": [_voice(230, 0.5, seed=s) for s in range(3)]}
    profiles = VoiceProfiles.fit(references)
    probe_low, probe_high = _voice(105, 0.95, seed=9), _voice(220, 0.5, seed=9)
    assert profiles.similarity(probe_low, "low") > profiles.similarity(probe_low, "high")
    assert profiles.similarity(probe_high, "high") > profiles.similarity(probe_high, "low")
    report = separation(profiles, [("low", probe_low), ("high", probe_high)])
    assert report["identified"] == 1 and report["same_voice"] > report["other_voice"]
    assert profiles.similarity(np.zeros(16000, np.float32), "low") == 0.0
    assert profiles.similarity(np.zeros(100, np.float32), "low") == 0.0  # too short to describe a voice


def test_swap_test_swaps_nothing_at_theta_one_or_above(tiny):
    _, _, codec_dir, corpus = tiny
    codec, utterances = AcousticCodec.load(codec_dir), load_corpus(corpus)[:2]
    embeddings = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    groups = {theta: build_groups(embeddings, theta, 64) for theta in (1.0, 1.5, -1.0)}
    calls = []

    def measure(audio, utterance):
        calls.append(len(audio))
        return {"edits": 1, "words": 2, "similarity": 0.5}

    rows, decoded = swap_test(codec, utterances, groups, measure, rate=1.0)
    by_theta = {t: [r for r in rows if r["theta"] == t] for t in groups}
    for theta in (1.0, 1.5):
        assert all(r["swapped"] == 0 and r["mel_l1"] == 0 for r in by_theta[theta])
    assert all(r["swapped"] == r["tokens"] for r in by_theta[-1.0])  # one group of everything: every token moves
    assert len(decoded) == 2 and len(calls) == 2 * (1 + len(groups))


def test_choose_theta_takes_the_fastest_theta_within_the_bound():
    def row(theta, speed, wer_ci, sim_ci):
        return {"method": "pcg", "value": theta, "speedup_vs_ar": speed, "tau": 3.0, "delta_wer_ci95": wer_ci,
                "delta_similarity_ci95": sim_ci}

    def swap(theta, wer_ci):
        return {"theta": theta, "delta_wer_ci95": wer_ci, "delta_similarity_ci95": [-0.01, 0.01]}

    rows = [row(0.4, 1.1, [-0.02, 0.02], [-0.01, 0.0]), row(0.3, 1.3, [-0.02, 0.02], [-0.02, 0.0]),
            row(0.2, 1.5, [-0.01, 0.05], [-0.01, 0.0])]
    choice = choose_theta(rows, [swap(0.4, [0, 0.01]), swap(0.3, [0, 0.02]), swap(0.2, [0, 0.01])], QualityBound())
    assert choice["theta"] == 0.3 and choice["admitted"] == [0.3, 0.4]
    choice = choose_theta(rows, [swap(0.4, [0, 0.1]), swap(0.3, [0, 0.2]), swap(0.2, [0, 0.3])], QualityBound())
    assert choice["theta"] is None and choice["generation_only_theta"] == 0.3
