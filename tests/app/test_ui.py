"""The web demo driven through its API with gradio_client, on a tiny random model pair saved to a temp folder
(tests never use the shipped checkpoints)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tiny_models import (free_port, save_tiny, save_tiny_image_head, save_tiny_image_model, save_tiny_speech_models,
                         serve)
from specgen.app.ui import build_demo
from specgen.app.ui.detokenizer import IncrementalDetokenizer
from specgen.app.ui.widgets import COLOR_MAP
from specgen.modalities.text.generator import TextGenerator

pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402

PROMPT = "abc abc (x"






@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return TextGenerator(save_tiny(root / "target", 0), save_tiny(root / "draft", 1, layers=1, hidden=16))


@pytest.fixture(scope="module")
def image_generator(tmp_path_factory):
    from specgen.modalities.image.generator import ImageGenerator

    root = tmp_path_factory.mktemp("image")
    model, vq = save_tiny_image_model(root, num_codes=16, grid=4)
    return ImageGenerator(model, vq, head=save_tiny_image_head(root, model))


@pytest.fixture(scope="module")
def video_generator(tmp_path_factory):
    from specgen.modalities.image.generator import ImageGenerator

    return ImageGenerator(*save_tiny_image_model(tmp_path_factory.mktemp("video"), num_codes=16, grid=4, frames=3))


@pytest.fixture(scope="module")
def speech_generator(tmp_path_factory):
    from specgen.modalities.speech.generator import SpeechGenerator

    return SpeechGenerator(*save_tiny_speech_models(tmp_path_factory.mktemp("speech"), num_tokens=64))


@pytest.fixture(scope="module")
def app(generator, image_generator, speech_generator, video_generator):
    yield from serve(build_demo(generator, image_generator=image_generator, speech_generator=speech_generator,
                                video_generator=video_generator))


@pytest.fixture(scope="module")
def client(app):
    # a local http URL: with certificate checks on, each request loaded the CA bundle (46 s of CPU over the memory
    # test's 200 requests, py-spy)
    return Client(app, verbose=False, ssl_verify=False)


def _text(highlighted) -> str:
    return "".join(part["token"] for part in highlighted or [])


def _generated(highlighted) -> str:
    """The generated part (everything after the unlabelled prompt)."""
    return "".join(part["token"] for part in highlighted or [] if part["class_or_confidence"] is not None)


def test_text_tab_streams_and_reports_stats(client, generator):
    job = client.submit(prompt=PROMPT, method="draft", max_new_tokens=30, compare=True, api_name="/generate_text")
    result = job.result(timeout=60)
    updates = job.outputs()
    lengths = [len(_text(update[0])) for update in updates]
    assert len(updates) >= 3 and lengths == sorted(lengths) and lengths[-1] > lengths[0]  # output grows live
    highlighted, stats_md, plot, stats = result
    assert _text(highlighted).startswith(PROMPT)
    assert {part["class_or_confidence"] for part in highlighted[1:]} <= {"accepted", "recovered", "bonus"}
    alone = generator.generate(PROMPT, method="draft", max_new_tokens=30)
    assert _generated(highlighted) == alone.text
    assert "τ" in stats_md and "measured speedup vs plain decoding" in stats_md
    for key in ("tau", "acceptance_rate", "alpha_hat", "steps", "tokens_per_s", "predicted_speedup_ideal",
                "predicted_speedup_measured", "per_position_acceptance", "speedup_vs_ar"):
        assert key in stats
    assert stats["tau"] == pytest.approx(alone.stats["tau"]) and stats["committed"] == len(alone.tokens)
    assert stats["identical_to_ar"] is True  # greedy: speculative output equals plain decoding
    assert [row[0] for row in plot["data"]] == [f"#{i + 1}" for i in range(len(stats["per_position_acceptance"]))]


def test_prompt_lookup_marks_accepted_tokens_and_plain_decoding_is_grey(client):
    ngram = client.predict(prompt="ab ab ab ab", method="ngram", max_new_tokens=40, compare=False,
                           api_name="/generate_text")
    assert "accepted" in {part["class_or_confidence"] for part in ngram[0]}
    plain = client.predict(prompt=PROMPT, method="ar", max_new_tokens=10, api_name="/generate_text")
    assert {part["class_or_confidence"] for part in plain[0][1:]} == {"target"} and "target" in COLOR_MAP
    assert plain[3]["tau"] == 1.0


def test_image_tab_streams_a_decoding_image(client, image_generator):
    job = client.submit(prompt="red K on blue", method="mc-sjd", window=6, temperature=0, compare=True,
                        api_name="/generate_image")
    image, stats_md, plot, stats = job.result(timeout=60)
    updates = job.outputs()
    assert len(updates) >= 3 and all(update[0] for update in updates)  # an image from the first step on
    from PIL import Image

    assert Image.open(image).size == (64, 64)  # 16x16 pixels shown 4x larger
    alone = image_generator.generate("red K on blue", method="ar", temperature=0)
    assert stats["committed"] == 16 and stats["identical_to_ar"] is True and stats["speedup_vs_ar"] > 0
    assert "τ" in stats_md and "measured speedup vs plain decoding" in stats_md and "changed per step" in stats_md
    assert stats["steps"] < alone.stats["steps"] or stats["tau"] >= 1.0


def test_image_tab_runs_lantern_plus_plus_with_its_lambda(client, image_generator):
    image, stats_md, plot, stats = client.predict(prompt="red K on blue", method="lantern++", lam=4.0, temperature=0,
                                                  compare=True, api_name="/generate_image")
    # greedy: the relaxation has no mass to move (the target's law is a point mass), so it equals plain decoding
    assert stats["identical_to_ar"] is True and stats["committed"] == 16 and stats["lossless"] is False
    assert "relaxed acceptance" in stats_md
    with pytest.raises(Exception, match="minimum value 1"):  # the slider checks its range itself
        client.predict(prompt="red K", method="lantern++", lam=0.5, api_name="/generate_image")


def test_image_tab_rejects_bad_requests(client):
    with pytest.raises(Exception, match="unknown word"):
        client.predict(prompt="purple Q", method="ar", api_name="/generate_image")
    with pytest.raises(Exception, match="minimum value 2"):  # the window slider checks its range itself
        client.predict(prompt="red K", method="mc-sjd", window=1, api_name="/generate_image")
    with pytest.raises(Exception, match="Enter a prompt"):
        client.predict(prompt="   ", method="ar", api_name="/generate_image")


def test_speech_tab_reports_stats_and_returns_audio(client, speech_generator):
    job = client.submit(text="hello there", method="sd", voice="slt", temperature=0, compare=True,
                        api_name="/generate_speech")
    audio, stats_md, plot, stats = job.result(timeout=90)
    assert len(job.outputs()) >= 2  # live statistics before the audio
    import soundfile

    samples, rate = soundfile.read(audio)
    assert rate == 16000 and len(samples) > 0
    alone = speech_generator.generate("hello there", method="sd", voice="slt", temperature=0)
    assert stats["committed"] == alone.stats["committed"] and stats["identical_to_ar"] is True
    assert "τ" in stats_md and "measured speedup vs plain decoding" in stats_md
    with pytest.raises(Exception, match="Enter some text"):
        client.predict(text="  ", method="sd", api_name="/generate_speech")


def test_video_tab_streams_frames_then_shows_a_gif(client, video_generator):
    job = client.submit(prompt="red K moving right", method="gumbel-sjd", window=40, temperature=0, compare=True,
                        api_name="/generate_video")
    video, stats_md, plot, stats = job.result(timeout=60)
    updates = job.outputs()
    from PIL import Image

    live = Image.open(updates[0][0])
    assert live.size == (2 * (3 * 16 + 2 * 2), 32)  # three 16-pixel frames, 2-pixel gutters, shown 2x larger
    gif = Image.open(video)
    assert gif.format == "GIF" and gif.n_frames == 3
    alone = video_generator.generate("red K moving right", method="ar", temperature=0)
    assert stats["committed"] == 48 == alone.stats["committed"] and stats["identical_to_ar"] is True
    assert stats["steps"] < alone.stats["steps"] and "τ" in stats_md
    with pytest.raises(Exception, match="not in the list of choices"):
        client.predict(prompt="red K", method="lantern", api_name="/generate_video")


@pytest.mark.parametrize("kwargs, words", [
    ({"prompt": "   "}, ["prompt"]),
    ({"prompt": "ab", "max_new_tokens": 500}, ["max_new_tokens", "context"]),
    ({"prompt": "ab", "temperature": 99}, ["99"]),
    ({"prompt": "ab", "seed": -5}, ["-5"]),
    ({"prompt": "ab", "method": "bogus"}, ["bogus"]),
    ({"prompt": "ab", "length_schedule": "sometimes"}, ["sometimes"]),
])
def test_bad_inputs_show_an_error_message(client, kwargs, words):
    with pytest.raises(Exception) as info:
        client.predict(**{"max_new_tokens": 8, **kwargs}, api_name="/generate_text")
    for word in words:
        assert word in str(info.value)


def test_twenty_concurrent_seeded_clients_equal_the_same_requests_alone(app, generator, image_generator):
    """12 text and 8 image clients at once, each seeded: all finish without errors and without cross-talk."""
    results, errors = {}, []

    def one(kind, seed):
        client = Client(app, verbose=False)
        try:
            if kind == "text":
                results[kind, seed] = client.predict(prompt="ab", method="draft", temperature=1.0, seed=seed,
                                                     max_new_tokens=16, compare=False, api_name="/generate_text")
            else:
                results[kind, seed] = client.predict(prompt="red K on blue", method="mc-sjd", window=6, seed=seed,
                                                     temperature=1.0, compare=False, api_name="/generate_image")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            client.close()

    jobs = [("text", seed) for seed in range(12)] + [("image", seed) for seed in range(8)]
    threads = [threading.Thread(target=one, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors and sorted(results) == sorted(jobs)
    for (kind, seed), result in results.items():
        if kind == "text":
            alone = generator.generate("ab", method="draft", temperature=1.0, seed=seed, max_new_tokens=16)
            assert _generated(result[0]) == alone.text and result[3]["committed"] == len(alone.tokens)
        else:
            alone = image_generator.generate("red K on blue", method="mc-sjd", window=6, seed=seed, temperature=1.0)
            assert result[3]["steps"] == alone.stats["steps"] and result[3]["committed"] == 16
            from PIL import Image

            shown = Image.open(result[0])
            expected = alone.image.resize(shown.size, Image.NEAREST)
            assert list(shown.convert("RGB").getdata()) == list(expected.convert("RGB").getdata())
    assert len({_generated(r[0]) for k, r in results.items() if k[0] == "text"}) > 1  # the seeds matter


def test_cancel_frees_the_model_slot(client):
    job = client.submit(prompt=PROMPT, method="draft", max_new_tokens=80, compare=True, api_name="/generate_text")
    job.cancel()
    after = client.predict(prompt=PROMPT, method="ar", max_new_tokens=5, api_name="/generate_text")
    assert after[3]["committed"] == 5


def test_models_load_lazily_and_a_missing_model_is_a_message(tmp_path):
    demo = build_demo(model=str(tmp_path / "missing"))  # builds without touching the model
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                            quiet=True, ssr_mode=False)
    try:
        with pytest.raises(Exception, match="does not exist"):
            Client(url, verbose=False).predict(prompt="ab", api_name="/generate_text")
    finally:
        demo.close()


def test_demo_command_on_a_busy_port_is_one_error_line(capsys, tmp_path):
    from specgen.app.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["demo", "--port", str(port), "--model", str(tmp_path / "missing")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: cannot serve on 127.0.0.1:") and len(err.splitlines()) == 1


def test_importing_the_app_loads_nothing_heavy():
    code = ("import sys, specgen.app.ui, specgen.app.batch; "
            "print(sorted(m for m in ('torch', 'gradio', 'transformers', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_incremental_detokenizer_matches_full_decoding():
    text = "héllo wörld — naïve café 😀 ünïcödé\n  indented(x) 🎉🎉"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["hello world cafe", "indented"], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe)
    context = tokenizer("the prompt ", add_special_tokens=False)["input_ids"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, context)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert "" in pieces  # multi-byte characters wait for their last byte
    assert all("\ufffd" not in piece for piece in pieces)


def test_every_request_hands_freed_memory_back(monkeypatch):
    """Resident memory stays flat over many requests only if freed memory is returned after each one, whether
    the run finished or failed (benchmarks/memory-app.md measures the whole app)."""
    import gradio as gr

    from specgen.app.ui import widgets
    from specgen.modalities import memory

    calls = []
    monkeypatch.setattr(widgets, "release_freed", lambda: calls.append(1))

    def failing():
        yield 1
        raise RuntimeError("boom")

    assert list(widgets.shown_in_ui(gr, "text", iter([1, 2]))) == [1, 2] and calls == [1]
    with pytest.raises(gr.Error, match="generation failed: RuntimeError: boom"):
        list(widgets.shown_in_ui(gr, "text", failing()))
    assert calls == [1, 1]
    if memory._glibc() is not None:  # glibc: the arena cap is accepted and trimming runs
        assert memory.limit_malloc_arenas(8) is True
        memory.release_freed()


def _rss_mb() -> float:
    from specgen.modalities.memory import resident_mb

    return resident_mb()


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="reads /proc")
def test_resident_memory_after_200_requests_stays_within_2_percent_of_after_20(client):
    """Mixed tabs on the tiny models, served in this process: what the app keeps between requests must not grow
    (benchmarks/memory-app.md runs the same check on the default models through `specgen demo`)."""
    import gc

    requests = [("/generate_text", dict(prompt="ab ab ab", method="ngram", max_new_tokens=12)),
                ("/generate_image", dict(prompt="red K on blue", method="mc-sjd", window=4, temperature=1.0)),
                ("/generate_text", dict(prompt="ab", method="draft", max_new_tokens=12, temperature=1.0)),
                ("/generate_speech", dict(text="hello there", method="sd", temperature=1.0)),
                ("/generate_video", dict(prompt="red K moving right", method="mc-sjd", window=8, temperature=1.0))]
    marks = {}
    for index in range(1, 201):
        api, kwargs = requests[index % len(requests)]
        client.predict(**kwargs, seed=index, compare=index % 10 == 0, api_name=api)
        if index in (20, 200):
            gc.collect()
            marks[index] = _rss_mb()
    assert marks[200] <= 1.02 * marks[20], marks


def test_the_text_tab_starts_knobs_from_the_served_models_preferences(tmp_path):
    """On Gemma the draft-length slider starts at the measured best length of the chosen method (not the
    registry's 5, which the request would then send); other models keep the registry default. Nothing loads."""
    from specgen.app.ui.text import TextModels, text_knobs
    from specgen.modalities.text import gemma
    from specgen.samplers import registry

    knob = next(k for k in text_knobs() if k.name == "num_draft_tokens")
    on_gemma = TextModels(model=gemma.ALIAS)
    assert on_gemma.knob_value(knob, "ngram") == gemma.DRAFT_LENGTH
    assert on_gemma.knob_value(knob, "draft") == gemma.MODEL_DRAFT_LENGTHS["draft"]
    assert not on_gemma.loaded
    from specgen.modalities.assets import assets_dir
    from specgen.modalities.text.generator import CODE_DRAFT_LENGTHS

    on_code = TextModels(model=str(assets_dir() / "code" / "target"))
    assert on_code.knob_value(knob, "ngram") == CODE_DRAFT_LENGTHS["ngram"] != knob.default
    assert on_code.knob_value(knob, "svip") == knob.default  # no measurement for it: the slider's default
    elsewhere = TextModels(model=str(tmp_path / "some-model"))
    assert elsewhere.knob_value(knob, "ngram") == registry.get_method("text", "ngram").knobs[0].default == knob.default


def test_the_image_tab_starts_each_method_from_its_own_window_and_initial_drafts():
    """Picking a Jacobi method sets the window and the initial drafts to that method's defaults (the coupled
    methods copy the previous code, SJD draws at random); other methods leave them alone. Nothing loads."""
    import gradio as gr

    from specgen.app.ui.image import jacobi_knob_defaults
    from specgen.samplers import registry

    for method in ("sjd", "mc-sjd", "gumbel-sjd"):
        knobs = registry.get_method("image", method).resolve_knobs({})
        window, init = jacobi_knob_defaults(gr, "image", method)
        assert (window["value"], init["value"]) == (knobs["window"], knobs["init"])
    assert jacobi_knob_defaults(gr, "image", "sjd")[1]["value"] == "random"
    assert jacobi_knob_defaults(gr, "image", "mc-sjd")[1]["value"] == "left"
    assert all("value" not in update for update in jacobi_knob_defaults(gr, "image", "ar"))


def test_the_image_tab_starts_guidance_at_the_models_own(tmp_path):
    """The guidance slider starts at the served model's default (its generation_config.json), 3 where it names
    none: the request then decodes as `specgen generate image` does. Nothing loads."""
    import json

    from specgen.app import request_options
    from specgen.app.ui.image import ImageModels, with_model_guidance

    unguided = tmp_path / "unguided"
    unguided.mkdir()
    (unguided / "generation_config.json").write_text(json.dumps({"guidance_scale": 1.0}))
    options = request_options.fields("image")
    for folder, start in ((unguided, 1.0), (tmp_path / "plain", 3.0)):
        models = ImageModels(model=str(folder))
        assert with_model_guidance(options, models.model_path())["guidance_scale"].demo.start == start
        assert not models.loaded
    assert options["guidance_scale"].demo.start == 3.0  # the shared fields are left as they were


def test_the_text_tabs_knobs_keep_their_positions_new_ones_come_last():
    """The demo's API takes the knobs positionally: a knob added to the registry goes after all earlier ones."""
    from specgen.app.ui.text import text_knobs

    names = [k.name for k in text_knobs()]
    assert names == [
        "num_draft_tokens", "length_schedule", "max_matching_ngram_size", "min_matching_ngram_size", "branches",
        "worker", "tree_budget", "max_depth", "shape", "accept_probs", "rank_temperature", "per_round",
        "expand_top_k", "depth", "entropy_threshold", "max_ngram", "store_top_k", "share", "min_value", "datastore",
        "max_match", "min_match", "retrieved", "context_weight", "min_share", "neighbours", "group", "exit_layer",
        "confidence", "verify_capacity", "capacity_estimate", "margin", "candidates", "output_rows", "head",
        "vocabulary", "exit_layers", "draft_exit", "exit_threshold", "stop_threshold",
        "decision_layers", "shallow_pass"]
