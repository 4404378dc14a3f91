"""Two-step smoke tests of the image trainer (vq, target, draft), resuming, and what it exports."""

from __future__ import annotations

import json
import math

import pytest
import torch
from specgen.modalities.image.conditions import ImageVocab
from specgen.modalities.image.models import load_image_lm, load_image_vocab
from specgen.modalities.image.training.recipe import main
from specgen.modalities.image.vq import load_vq

from specgen.errors import InvalidRequest, ModelNotFound

VQ_TINY = ["--batch-size", "2", "--eval-images", "3", "--eval-every", "1"]
LM_TINY = ["--batch-size", "2", "--eval-images", "3", "--num-images", "12", "--eval-every", "1"]


@pytest.fixture(scope="module")
def trained_vq(tmp_path_factory):
    """A VQ exported after two steps: good enough to make codes for the token-model smoke tests."""
    base = tmp_path_factory.mktemp("vq")
    assert main(["--role", "vq", "--steps", "2", "--run-dir", str(base / "run"), "--out", str(base / "out"),
                 *VQ_TINY]) == 0
    return base


def test_vq_two_steps_exports_fp16(trained_vq):
    out, run = trained_vq / "out", trained_vq / "run"
    config = json.loads((out / "config.json").read_text())
    assert config["_class_name"] == "VQModel" and config["num_vq_embeddings"] == 512
    summary = json.loads((out / "training.json").read_text())
    assert summary["steps"] == 2 and math.isfinite(summary["final_train_loss"])
    assert {"psnr_glyph", "psnr_digit", "psnr_photo", "eval_codes_used"} <= set(summary["eval"])
    assert (run / "checkpoint.pt").exists() and (run / "metrics.jsonl").exists()
    assert load_vq(out).dtype == torch.float32


def test_vq_resumes_from_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    main(["--role", "vq", "--steps", "2", "--run-dir", str(run), *VQ_TINY])
    main(["--role", "vq", "--steps", "3", "--run-dir", str(run), *VQ_TINY])
    summary = json.loads((run / "training.json").read_text())
    assert summary["steps"] == 3 and summary["resumed_from_steps"] == [2]
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == [2, 3]  # logged at the end of each run; nothing redone twice
    with pytest.raises(InvalidRequest, match="different settings"):
        main(["--role", "vq", "--steps", "4", "--run-dir", str(run), *VQ_TINY[:1], "3", *VQ_TINY[2:]])


def test_a_vq_pilots_architecture_is_exported_recorded_and_kept_on_resume(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    pilot = ["--vq-config", '{"num_vq_embeddings": 64, "vq_embed_dim": 4}']
    assert main(["--role", "vq", "--steps", "2", "--run-dir", str(run), "--out", str(out), *VQ_TINY, *pilot]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["num_vq_embeddings"], config["vq_embed_dim"]) == (64, 4)
    command = json.loads((out / "training.json").read_text())["command"]
    assert """--vq-config '{"num_vq_embeddings":64,"vq_embed_dim":4}'""" in command
    with pytest.raises(InvalidRequest, match="different settings"):  # the shipped architecture is another run
        main(["--role", "vq", "--steps", "3", "--run-dir", str(run), *VQ_TINY])


@pytest.mark.parametrize("role", ["target", "draft"])
def test_token_model_two_steps_then_resume(role, trained_vq, tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    common = ["--role", role, "--run-dir", str(run), "--vq", str(trained_vq / "out"), *LM_TINY]
    assert main([*common, "--steps", "2"]) == 0
    assert (run / "tokens.npz").exists()
    assert main([*common, "--steps", "3", "--out", str(out)]) == 0
    summary = json.loads((out / "training.json").read_text())
    assert summary["steps"] == 3 and summary["resumed_from_steps"] == [2]
    assert math.isfinite(summary["eval"]["eval_loss"]) and math.isfinite(summary["eval"]["char_gain"])
    vocab = load_image_vocab(out)
    assert isinstance(vocab, ImageVocab) and vocab.num_codes == 512
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float16" and config["vocab_size"] == vocab.vocab_size
    model = load_image_lm(out)
    ids = torch.cat([vocab.prompt_ids("red K on blue"), torch.zeros(4, dtype=torch.long)])[None]
    assert model(input_ids=ids).logits.shape == (1, len(ids[0]), vocab.vocab_size)


def test_a_token_model_records_its_glyph_style_and_vq_and_refuses_another_vq(trained_vq, tmp_path):
    import shutil

    from specgen.modalities.image.generator import ImageGenerator
    from specgen.modalities.image.models import glyph_style_of, vq_of

    run, out = tmp_path / "run", tmp_path / "out"
    assert main(["--role", "target", "--run-dir", str(run), "--vq", str(trained_vq / "out"), "--steps", "1",
                 "--glyph-style", "sans", "--out", str(out), *LM_TINY]) == 0
    summary = json.loads((out / "training.json").read_text())
    assert "--glyph-style sans" in summary["command"] and glyph_style_of(out) == "sans"
    assert json.loads((run / "tokens.json").read_text())["glyph_style"] == "sans"
    with pytest.raises(InvalidRequest, match="glyph-style"):  # the VQ's data has no glyph style
        main(["--role", "vq", "--run-dir", str(tmp_path / "v"), "--glyph-style", "bold", "--steps", "1"])
    with pytest.raises(InvalidRequest, match="different settings"):  # another style is another run
        main(["--role", "target", "--run-dir", str(run), "--vq", str(trained_vq / "out"), "--steps", "2", *LM_TINY])
    # trained on another VQ than the shipped one, the export carries a copy of it, which is its default
    assert vq_of(out) == out / "vq" and ImageGenerator(out).vq_path == out / "vq"
    assert (out / "vq" / "config.json").stat().st_mode & 0o777 == 0o644
    shutil.rmtree(out / "vq")  # without it: the shipped VQ, which is not the one it was trained on
    with pytest.raises(InvalidRequest, match="another VQ"):
        ImageGenerator(out)
    assert ImageGenerator(out, trained_vq / "out").vq_path == trained_vq / "out"


def test_swapped_characters_keep_the_colours_and_change_every_letter():
    from specgen.modalities.image.training.token_models import swap_characters

    prompts = ["red K on blue", "photo of cat", "green K on white", "digit 3", "green digit 3 on black",
               "white g on black"]
    glyphs, swapped = swap_characters(prompts)
    assert glyphs == [0, 2, 5]  # scanned digits ("green digit 3 on black") and photos are not glyph prompts
    assert swapped == ["red g on blue", "green g on white", "white K on black"]
    assert swap_characters(["red K on blue"]) == ([0], ["red K on blue"])  # no other letter to take


def test_token_model_needs_a_vq(tmp_path):
    with pytest.raises(ModelNotFound, match="VQ"):
        main(["--role", "draft", "--steps", "1", "--run-dir", str(tmp_path), "--vq", str(tmp_path / "none"),
              *LM_TINY])
    with pytest.raises(ModelNotFound):
        load_image_lm(tmp_path / "none")


def test_reference_sampler_gives_image_codes(trained_vq, tmp_path):
    from specgen.modalities.image.models import sample_codes

    out = tmp_path / "draft"
    main(["--role", "draft", "--steps", "1", "--run-dir", str(tmp_path / "run"), "--vq", str(trained_vq / "out"),
          "--out", str(out), *LM_TINY])
    model, vocab = load_image_lm(out), load_image_vocab(out)
    g = torch.Generator().manual_seed(0)
    codes = sample_codes(model, vocab, ["K", "photo of cat"], top_k=20, guidance=2.0, generator=g)
    assert codes.shape == (2, 16, 16) and codes.dtype == torch.int64
    assert codes.min() >= 0 and codes.max() < vocab.num_codes
    g.manual_seed(0)
    again = sample_codes(model, vocab, ["K", "photo of cat"], top_k=20, guidance=2.0, generator=g)
    assert torch.equal(codes, again)


def test_video_model_starts_from_an_image_model_then_resumes(trained_vq, tmp_path):
    from specgen.modalities.image.training.token_models import video_vocab
    from specgen.modalities.image.models import build_image_lm
    from specgen.modalities.image.training.token_models import start_from

    image = tmp_path / "image"
    assert main(["--role", "target", "--steps", "1", "--run-dir", str(tmp_path / "image-run"), "--vq",
                 str(trained_vq / "out"), "--out", str(image), *LM_TINY]) == 0
    run, out = tmp_path / "run", tmp_path / "out"
    common = ["--role", "video", "--run-dir", str(run), "--vq", str(trained_vq / "out"), "--init-from", str(image),
              "--batch-size", "1", "--eval-images", "1", "--num-images", "3", "--eval-every", "1"]
    assert main([*common, "--steps", "1"]) == 0
    assert main([*common, "--steps", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "training.json").read_text())
    assert summary["steps"] == 2 and summary["resumed_from_steps"] == [1] and "--init-from" in summary["command"]
    vocab = load_image_vocab(out)
    assert vocab.frames == 8 and vocab.image_tokens == 8 * 256 and vocab.prefix_length == 6
    # the copy: every image-model weight lands in the same place; the motion words keep their fresh rows
    source, fresh = load_image_lm(image), build_image_lm("video", video_vocab())
    start_from(fresh, image)
    image_vocab = load_image_vocab(image)
    embed = fresh.model.embed_tokens.weight
    assert torch.equal(embed[:image_vocab.vocab_size], source.model.embed_tokens.weight.float())
    assert torch.equal(fresh.model.layers[1].mlp.up_proj.weight, source.model.layers[1].mlp.up_proj.weight.float())
    assert embed.shape[0] == image_vocab.vocab_size + 5
    with pytest.raises(InvalidRequest, match="cannot start from"):
        start_from(build_image_lm("draft", video_vocab()), image)
