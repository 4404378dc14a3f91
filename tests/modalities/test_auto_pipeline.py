"""`auto` through each generator on tiny random models: greedy output equals plain decoding's, the calibration is
measured once and reused from the user cache, and auto is every modality's default."""

import json

import pytest
import torch
from tiny_models import save_tiny_image_model, save_tiny_pair, save_tiny_speech_models

from specgen.errors import InvalidRequest
from specgen.modalities import auto as auto_pipeline, calibration
from specgen.modalities.text.generator import TextGenerator
from specgen.samplers import registry


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("auto-models"), wide=True)


def test_auto_is_the_default_everywhere():
    for modality in registry.MODALITIES:
        assert registry.default_method(modality) == "auto"
        assert registry.get_method(modality, "auto").lossless


def test_text_auto_equals_plain_greedy_and_reports_its_choices(pair):
    generator = TextGenerator(*pair)
    assert generator.default_method == "auto"
    prompt = "def f(a):\n  return a\ndef f(a):\n"
    plain = generator.generate(prompt, method="ar", max_new_tokens=40)
    auto = generator.generate(prompt, max_new_tokens=40)
    assert auto.tokens == plain.tokens
    report = auto.stats["auto"]
    assert report["initial"]["method"] in {"ar", "draft", "ngram", "draft-lookup", "sequoia", "dyspec", "eagle2"}
    assert sum(report["steps_by_method"].values()) == auto.stats["steps"]
    offered = set(report["initial"]["predicted"])
    assert {"ar", "ngram"} <= offered and "draft" not in offered  # draft-lookup subsumes the draft alone


def test_text_auto_sampled_runs_and_num_samples(pair):
    generator = TextGenerator(*pair)
    result = generator.generate("def f(a):\n", max_new_tokens=20, temperature=1.0, seed=3, num_samples=3)
    assert len(result.samples) == 3 and all(1 <= len(s["tokens"]) <= 20 for s in result.samples)
    assert result.stats["lossless"] is True


def test_calibration_is_cached_per_machine_and_model(pair, monkeypatch):
    generator = TextGenerator(*pair)
    generator.generate("abc", max_new_tokens=4)  # measures on first use (or reuses an earlier test's record)
    key = calibration.machine_key("text", [generator.model_path, generator.draft_path, None])
    path = calibration.cache_path(key)
    record = json.loads(path.read_text())
    assert record["key"]["threads"] == torch.get_num_threads() and record["key"]["torch"] == torch.__version__
    assert {"1", "2", "17"} <= set(record["verify_s"]) and {"draft-lookup", "ngram"} <= set(record["draft_s"])
    # each candidate's calibration runs: acceptance by position (non-decreasing) and a measured speedup
    profile = record["prior"]["draft-lookup"]["alpha_at"]
    assert profile == sorted(profile) and all(0.0 <= a <= 1.0 for a in profile)
    assert all(p["speedup"] > 0 for p in record["prior"].values()) and record["verify_per_slot_s"] >= 0.0
    assert {"cpu", "kernels", "model_hash"} <= set(record["key"])

    def refuse(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(calibration, "calibrate", refuse)
    generator.generate("abc", max_new_tokens=4)  # reused
    assert any(r["file"] == str(path) for r in calibration.cached_records())


def test_a_calibration_measured_under_load_is_measured_again_on_a_quiet_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path))  # a cache of its own: measured from nothing
    generator = TextGenerator(*save_tiny_pair(tmp_path / "models"))
    key = calibration.machine_key("text", [generator.model_path, generator.draft_path, None])
    measured = []
    calibrate = calibration.calibrate
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: measured.append(1) or calibrate(*a, **k))
    monkeypatch.setattr(calibration, "others_running", lambda: 1)  # another process beside it throughout
    generator.generate("abc", max_new_tokens=3)
    generator.generate("abc", max_new_tokens=3)  # still busy: reused, however it was measured
    assert len(measured) == 1 and calibration.load(key)["busy"] is True
    listed = [r for r in calibration.cached_records() if r["file"] == str(calibration.cache_path(key))]
    assert [r["busy"] for r in listed] == [True]  # `specgen info` says so
    monkeypatch.setattr(calibration, "others_running", lambda: 0)
    generator.generate("abc", max_new_tokens=3)  # quiet now: measured again, and kept
    generator.generate("abc", max_new_tokens=3)
    assert len(measured) == 2 and calibration.load(key)["busy"] is False


def test_contention_is_read_while_measuring_not_from_the_trailing_load_average(tmp_path, monkeypatch):
    """A calibration alone on the machine is quiet even where the 1-minute load average still reads the work before
    it; another process running beside most of its timings marks it busy; with no /proc/stat, the load average."""
    monkeypatch.setattr(calibration.os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    stat = tmp_path / "stat"
    monkeypatch.setattr(calibration, "PROC_STAT", str(stat))
    running = torch.get_num_threads()  # this process's own threads only
    stat.write_text(f"cpu  1 2 3 4\nprocs_running {running}\nprocs_blocked 0\n")
    assert calibration.others_running() == 0 and calibration.machine_busy() is False
    stat.write_text(f"procs_running {running + 1}\n")
    assert calibration.others_running() == 1 and calibration.machine_busy() is True
    contention = calibration.Contention()
    for others in (0, 0, 1, 0):  # a burst beside one timing in four
        stat.write_text(f"procs_running {running + others}\n")
        contention.sample()
    assert contention.busy() is False
    stat.unlink()
    assert calibration.others_running() is None and calibration.machine_busy() is True  # the load average, 5.0


def test_a_request_does_not_time_plain_decoding_again(pair, monkeypatch):
    """The stats' T_ar is measured once per octave of prompt length, not after every request."""
    generator = TextGenerator(*pair)
    calls = []
    measure = generator.measure_step_s
    monkeypatch.setattr(generator, "measure_step_s", lambda prompt: calls.append(prompt) or measure(prompt))
    generator.generate("def f(a):\n", method="ar", max_new_tokens=3)
    generator.generate("def g(b):\n", method="ar", max_new_tokens=3)
    assert len(calls) == 1
    generator.generate("def f(a):\n" * 4, method="ar", max_new_tokens=3)
    assert len(calls) == 2


def test_calibration_race_keeps_the_candidates_near_the_fastest():
    from specgen.modalities.auto import RACE_KEEP, raced
    from specgen.samplers.auto import Candidate

    cands = [Candidate("fast", None, None, (1,)), Candidate("close", None, None, (1,)),
             Candidate("slow", None, None, (1,)), Candidate("look", None, None, (1,), shadow=True),
             Candidate("new", None, None, (1,))]
    priors = {"fast": {"speedup": 2.0}, "close": {"speedup": 2.0 * RACE_KEEP}, "slow": {"speedup": 1.2},
              "look": {"speedup": 1.0}}
    assert [c.name for c in raced(cands, priors)] == ["fast", "close", "look", "new"]
    assert raced(cands, {}) == cands  # nothing measured: nothing left out


def test_the_race_judges_each_calibration_prompt_on_its_own():
    """A candidate fastest on one kind of prompt stays though another's pooled speedup is higher; one beaten on every
    prompt goes; records without per-prompt speedups (or over different prompt sets) are judged pooled."""
    from specgen.modalities.auto import RACE_KEEP, raced
    from specgen.samplers.auto import Candidate

    cands = [Candidate(name, None, None, (1,)) for name in ("lookup", "model", "slow")]
    priors = {"lookup": {"speedup": 2.8, "speedups": [1.6, 4.7]}, "model": {"speedup": 1.9, "speedups": [1.7, 2.2]},
              "slow": {"speedup": 1.5, "speedups": [1.7 * RACE_KEEP - 0.01, 4.7 * RACE_KEEP - 0.01]}}
    assert [c.name for c in raced(cands, priors)] == ["lookup", "model"]
    pooled = {name: {"speedup": prior["speedup"]} for name, prior in priors.items()}
    assert [c.name for c in raced(cands, pooled)] == ["lookup"]
    mixed = dict(priors, model={"speedup": 1.9, "speedups": [1.7]})
    assert [c.name for c in raced(cands, mixed)] == ["lookup"]


def test_a_calibrated_request_builds_only_the_candidates_the_race_offers(pair, monkeypatch):
    from specgen.modalities import auto as auto_pipeline

    generator = TextGenerator(*pair)
    generator.generate("abc", max_new_tokens=4)  # calibrated (or reused)
    record = calibration.load(calibration.machine_key("text", auto_pipeline.calibration_paths(generator)))
    built = []
    make_drafter = auto_pipeline.make_drafter
    monkeypatch.setattr(auto_pipeline, "make_drafter",
                        lambda gen, spec, *a, **k: built.append(spec.name) or make_drafter(gen, spec, *a, **k))
    result = generator.generate("def f(a):\n", max_new_tokens=8)
    prompts = len(record["prior"]["ngram"]["speedups"])  # one speedup per calibration prompt, for every candidate
    best = [max(p["speedups"][i] for p in record["prior"].values()) for i in range(prompts)]
    slow = {n for n, p in record["prior"].items() if n != "ngram"
            and all(s < auto_pipeline.RACE_KEEP * b for s, b in zip(p["speedups"], best))}
    assert built and not slow & set(built), (built, slow)
    assert set(built) == set(result.stats["auto"]["initial"]["predicted"]) - {"ar"}


def test_consensus_is_offered_only_to_requests_of_several_paths(pair, monkeypatch):
    """With one path, consensus is prompt lookup over the path's own text: ngram subsumes it."""
    from specgen.modalities import auto as auto_pipeline

    monkeypatch.setattr(auto_pipeline, "raced", lambda plans, priors: plans)  # every calibrated candidate offered
    generator = TextGenerator(*pair)
    one = generator.generate("def f(a):\n", max_new_tokens=6)
    assert {"ngram", "stand"} <= set(one.stats["auto"]["initial"]["predicted"])
    assert "consensus" not in one.stats["auto"]["initial"]["predicted"]
    several = generator.generate("def f(a):\n", max_new_tokens=6, temperature=1.0, num_samples=3)
    assert "consensus" in several.stats["auto"]["initial"]["predicted"]


def test_in_loop_costs_from_calibration_runs():
    """Drafting that took longer in the loop than its timings predict raises the fixed part (the slope stays the
    timings'); each verified slot's cost is the slope of the in-loop excess over T_verify(n) against n."""
    from specgen.samplers.auto import Costs

    costs = Costs({1: 1.0, 5: 2.0}, {"d": (0.1, 0.2)})
    run = {"lengths": [4, 4], "draft_s": [1.5, 1.7]}
    assert calibration._in_loop_fixed(costs, "d", run, per_token=0.2) == pytest.approx(1.6 - 0.8)
    cheap = {"lengths": [4], "draft_s": [0.05]}  # a lookup hit: never below the timings
    assert calibration._in_loop_fixed(costs, "d", cheap, per_token=0.2) == pytest.approx(0.1)
    # excess 0.5 s at n = 1 and 0.9 s at n = 5 (two steps there): 0.1 s per slot
    assert calibration._per_slot_s(costs, [(1, 1.5, 1), (5, 5.8, 2)]) == pytest.approx(0.1)
    assert calibration._per_slot_s(costs, [(5, 5.8, 2)]) == 0.0  # one size says nothing about the slope
    assert calibration._per_slot_s(costs, [(1, 1.5, 1), (5, 4.0, 2)]) == 0.0  # never negative


def test_a_batch_has_its_wide_windows_calibrated(pair):
    """A batch of R rows times windows of R, 2R, 3R, 5R, 9R and 17R slots (as far as a row's widest window and
    136 slots reach); one row adds none. `serve` at 4 rows adds them to the model's record and decodes as plainly
    as plain decoding."""
    assert calibration.batch_windows(1, 17) == set()
    assert calibration.batch_windows(8, 17) == {8, 16, 24, 40, 72, 136}
    assert calibration.batch_windows(8, 5) == {8, 16, 24, 40}
    assert calibration.batch_windows(32, 17) == {32, 64, 96}
    generator = TextGenerator(*pair)
    prompts = ["abc", "(x", "def f", "ab ab ab"]
    served = dict(generator.serve(prompts, rows=4, method="auto", max_new_tokens=12))
    plain = dict(generator.serve(prompts, rows=4, method="ar", max_new_tokens=12))
    assert [served[i].tokens for i in range(4)] == [plain[i].tokens for i in range(4)]
    key = calibration.machine_key("text", [generator.model_path, generator.draft_path, None])
    record = json.loads(calibration.cache_path(key).read_text())
    assert {"4", "8", "12", "20", "36", "68"} <= set(record["verify_s"])


def test_auto_candidates_knob(pair):
    generator = TextGenerator(*pair)
    result = generator.generate("def f(a):\n", max_new_tokens=12, candidates="ngram")
    assert set(result.stats["auto"]["initial"]["predicted"]) == {"ar", "ngram"}
    with pytest.raises(InvalidRequest, match="unknown text method"):
        generator.generate("def f(a):\n", max_new_tokens=12, candidates="nope")


def test_image_auto_equals_plain_greedy(tmp_path):
    from specgen.modalities.image.generator import ImageGenerator

    model, vq = save_tiny_image_model(tmp_path, num_codes=16, grid=4)
    generator = ImageGenerator(model, vq)
    plain = generator.generate("red K on blue", method="ar", temperature=0, num_samples=2)
    auto = generator.generate("red K on blue", temperature=0, num_samples=2)
    assert auto.tokens == plain.tokens and auto.stats["method"] == "auto"
    # which Jacobi variants are offered depends on their measured calibration speeds (the race): at least one is
    offered = set(auto.stats["auto"]["initial"]["predicted"]) - {"ar"}
    assert offered and offered <= {"sjd", "mc-sjd", "gumbel-sjd"}
    # Jacobi windows alone: plain decoding's step and the windows' own widths are timed, no chain lengths between
    record = calibration.load(calibration.machine_key("image", auto_pipeline.calibration_paths(generator)))
    assert "1" in record["verify_s"] and not {"2", "3", "5", "8", "10", "13"} & set(record["verify_s"])


def test_speech_auto_equals_plain_greedy(tmp_path, monkeypatch):
    from specgen.modalities.speech import generator as speech
    from specgen.modalities.speech.generator import SpeechGenerator

    # sentences short enough for the tiny model's 128 positions beside a calibration run
    monkeypatch.setattr(speech, "CALIBRATION_TEXTS", ("a cat sat.", "go on"))
    target, draft, codec = save_tiny_speech_models(tmp_path, num_tokens=64)
    generator = SpeechGenerator(target, draft, codec)
    plain = generator.generate("hello there", method="ar", temperature=0, max_new_tokens=30)
    auto = generator.generate("hello there", temperature=0, max_new_tokens=30)
    assert auto.tokens == plain.tokens and "sd" in auto.stats["auto"]["initial"]["predicted"]
    # the priors come from the model's example and calibration sentences, one run each, not from this request
    record = calibration.load(calibration.machine_key("speech", auto_pipeline.calibration_paths(generator)))
    assert len(record["prior"]["sd"]["speedups"]) == len(generator.calibration_prompts()) == 3
