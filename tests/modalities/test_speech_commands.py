"""`specgen generate speech` and `specgen bench speech` on tiny random models: WAV out, one JSON object with --json,
greedy exactness recorded by bench, and one `error:` line with exit 2 for bad requests."""

import json

import pytest
import soundfile as sf
from tiny_models import save_tiny_speech_models

from specgen.app.cli import main


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target, draft, codec = save_tiny_speech_models(tmp_path_factory.mktemp("speech-cli"), num_tokens=64)
    return ["--model", str(target), "--draft", str(draft), "--codec", str(codec)]


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_speech_writes_a_wav_and_one_json_object(models, tmp_path, capsys):
    out = tmp_path / "x.wav"
    code, stdout, _ = run(["generate", "speech", "--text", "Hello there.", "--out", str(out), "--method", "sd",
                           "--temperature", "0", "--max-new-tokens", "30", "--json", *models], capsys)
    assert code == 0
    result = json.loads(stdout)
    audio, rate = sf.read(out)
    assert rate == 16000 and len(audio) > 0 and len(result["tokens"]) <= 30
    assert result["stats"]["method"] == "sd" and result["stats"]["lossless"] is True
    code, stdout, _ = run(["generate", "speech", "--text", "Hello there.", "--out", str(tmp_path / "y.wav"),
                           "--method", "ar", "--temperature", "0", "--max-new-tokens", "30", "--json", *models], capsys)
    assert json.loads(stdout)["tokens"] == result["tokens"]


@pytest.mark.parametrize("method", ["sd", "pcg"])
def test_generate_speech_with_an_interleaved_model(tmp_path, capsys, method):
    """Characters spoken again in the stream are not frames: the WAV and --json hold acoustic tokens only."""
    target, draft, codec = save_tiny_speech_models(tmp_path / "models", num_tokens=64, layout="interleaved")
    code, stdout, _ = run(["generate", "speech", "--text", "Hi there.", "--out", str(tmp_path / "x.wav"), "--method",
                           method, "--temperature", "0.8", "--max-new-tokens", "40", "--json", "--model", str(target),
                           "--draft", str(draft), "--codec", str(codec)], capsys)
    assert code == 0
    result = json.loads(stdout)
    assert result["tokens"] and max(result["tokens"]) < 64
    assert method != "pcg" or len(result["groups"]) == len(result["tokens"])
    audio, _ = sf.read(tmp_path / "x.wav")
    assert len(audio) > 0


@pytest.mark.parametrize("extra, words", [
    (["--text", "tab{le}"], ["cannot read"]),
    (["--text", "hello", "--voice", "nobody"], ["unknown voice", "slt"]),
    (["--text", "hello", "--max-new-tokens", "5000"], ["max_new_tokens"]),
    (["--text", "hello", "--method", "ar", "--num-draft-tokens", "3"], ["--num-draft-tokens"]),
    (["--text", "hello", "--method", "pcg", "--theta", "1.5"], ["theta", "<= 1.0"]),
    (["--text", "hello", "--method", "pcg", "--theta", "nan"], ["--theta", "finite"]),
    (["--text", "hello", "--method", "pcg", "--theta", "abc"], ["--theta", "number"]),
    (["--text", "hello", "--method", "ssd", "--beta", "-0.1"], ["beta", ">= 0.0"]),
    (["--text", "hello", "--method", "sd", "--theta", "0.3"], ["--theta applies to pcg", "'sd'"]),
    (["--text", "hello", "--method", "pcg", "--beta", "0.3"], ["--beta applies to ssd", "'pcg'"]),
])
def test_bad_requests_are_one_error_line(models, tmp_path, capsys, extra, words):
    code, stdout, err = run(["generate", "speech", "--out", str(tmp_path / "x.wav"), *extra, *models], capsys)
    assert code == 2 and stdout == "" and len(err.splitlines()) == 1 and err.startswith("error: ")
    assert all(w in err for w in words)
    assert not (tmp_path / "x.wav").exists()


def test_missing_model_is_one_error_line(tmp_path, capsys):
    code, _, err = run(["generate", "speech", "--text", "hi", "--out", str(tmp_path / "x.wav"), "--model",
                        str(tmp_path / "none")], capsys)
    assert code == 2 and "none" in err and len(err.splitlines()) == 1


def test_bench_speech_compares_ar_and_sd(models, tmp_path, capsys, monkeypatch):
    from specgen.app.bench import speech as speech_bench
    from specgen.modalities.speech.generator import SpeechGenerator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "hello there"}\n{"id": "b", "text": "good night", "voice": "awb"}\n')
    generator = SpeechGenerator(models[1], models[3], models[5])
    result = speech_bench.run_bench_speech(prompts_path=prompts, max_new_tokens=12, generator=generator)
    assert set(result["methods"]) == {"ar", "sd", "ssd", "pcg", "auto"}  # every speech method by default
    assert result["methods"]["auto"]["identical_to_ar"] is True
    slow = result["methods"]["sd"]["slowdowns"]
    assert slow["prompts"] == 2 and 0 <= slow["slower_than_ar"] <= 2 and slow["worst_speedup"] > 0
    sd = result["methods"]["sd"]
    assert sd["identical_to_ar"] is True and sd["tau"] >= 1 and sd["speedup_vs_ar"] > 0
    assert result["methods"]["ar"]["tau"] == 1
    assert "predicted_speedup_measured" in sd and result["env"]["repeats"] == 1
    pcg, ssd = result["methods"]["pcg"], result["methods"]["ssd"]
    assert pcg["lossless"] is False and pcg["acceptance_level"] == "group" and 0 <= pcg["exact_alpha_hat"] <= 1
    assert ssd["acceptance_level"] == "tolerance" and "exact_alpha_hat" not in sd
    markdown = speech_bench.render_markdown(result)
    assert "| `sd` |" in markdown and "| `pcg` | no |" in markdown and "(group; exact" in markdown
    speech_bench.write_bench_speech(result, tmp_path / "runs", tmp_path / "latest")  # no quality frontier
    assert sorted(p.name for p in (tmp_path / "latest").iterdir()) == ["speech-latest.json", "speech-latest.md"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n')
    code, _, err = run(["bench", "speech", "--prompts", str(bad)], capsys)
    assert code == 2 and "line 1" in err and "'text'" in err


@pytest.mark.parametrize("method, flags", [("pcg", ["--theta", "0.3"]), ("pcg", ["--theta", "1"]),
                                           ("ssd", ["--beta", "0.2"])])
def test_generate_speech_with_a_relaxed_rule(models, tmp_path, capsys, method, flags):
    out = tmp_path / "r.wav"
    code, stdout, err = run(["generate", "speech", "--text", "Hello there.", "--out", str(out), "--method", method,
                             *flags, "--max-new-tokens", "24", "--seed", "3", "--json", *models], capsys)
    assert code == 0, err
    result = json.loads(stdout)
    audio, rate = sf.read(out)
    assert rate == 16000 and len(audio) > 0 and 0 < len(result["tokens"]) <= 24
    assert max(result["tokens"]) < 64
    stats = result["stats"]
    assert stats["method"] == method and stats["lossless"] is False
    assert stats["acceptance_level"] == ("group" if method == "pcg" else "tolerance")
    assert 0 <= stats["exact_accepted"] <= stats["drafted"]
    if method == "pcg":  # every token comes with the group it was committed in
        assert len(result["groups"]) == len(result["tokens"])
    code, stdout, err = run(["generate", "speech", "--text", "Hello there.", "--out", str(out), "--method", method,
                             *flags, "--max-new-tokens", "24", "--seed", "3", *models], capsys)
    assert code == 0 and stdout.strip() == str(out) and "exact sampling" in err
