"""The independent image judge (modalities/image/judge.py): it reads true renders right, judges wrong images wrong,
tells motion from its reverse, and `bench image --quality` reports it. Needs Tesseract (tesseract-ocr, pytesseract)."""

import json
import shutil

import numpy as np
import pytest

pytesseract = pytest.importorskip("pytesseract", reason="the image judge needs pytesseract (extra image-eval)")
if shutil.which(pytesseract.pytesseract.tesseract_cmd) is None:
    pytest.skip("the image judge needs the tesseract program (apt-get install tesseract-ocr)", allow_module_level=True)

from specgen.modalities.image import judge  # noqa: E402
from specgen.modalities.image.training import clips, images  # noqa: E402

# one of each class group, in colour pairs of high and of low contrast; DejaVu Sans at 44 px, centred
LEGIBLE = ("red K on blue", "white A on black", "yellow h on purple", "black 7 on orange", "cyan R on grey",
           "orange 3 on green")


def render(prompt: str) -> np.ndarray:
    ask = judge.parse_prompt(prompt)
    return images.render_glyph(ask.char, ask.fg, ask.bg)


def test_prompts_are_parsed_into_what_they_ask():
    assert judge.parse_prompt("red K on blue") == judge.Ask("K", "red", "blue")
    assert judge.parse_prompt("K") == judge.Ask("K")
    assert judge.parse_prompt("yellow g moving left on purple") == judge.Ask("g", "yellow", "purple", "left")
    assert judge.parse_prompt("M moving up") == judge.Ask("M", motion="up")
    assert judge.parse_prompt("green digit 5 on black") == judge.Ask(None, "green", "black")
    assert not judge.parse_prompt("photo of coffee").judgeable and not judge.parse_prompt("digit 3").judgeable
    assert [judge.Ask(c).group for c in "Kg7"] == ["uppercase", "lowercase", "digit"]
    assert judge.fold("O") == judge.fold("0") == judge.fold("o") and judge.fold("K") == "k"


@pytest.mark.parametrize("prompt", LEGIBLE)
def test_true_renders_are_read_and_coloured_right(prompt):
    ask = judge.parse_prompt(prompt)
    verdict = judge.judge_image(render(prompt))
    assert (verdict.char, verdict.fg, verdict.bg) == (ask.char, ask.fg, ask.bg)
    assert judge.score_image(verdict, ask) == {"group": ask.group, "ocr_strict": True, "ocr_folded": True,
                                               "fg": True, "bg": True}


def test_wrong_images_are_judged_wrong():
    ask = judge.parse_prompt("red K on blue")
    noise = np.random.default_rng(0).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    wrong_glyph = images.render_glyph("B", "red", "blue")
    swapped = images.render_glyph("K", "blue", "red")
    flat = np.full((64, 64, 3), images.PALETTE["blue"], np.uint8)  # the background alone
    assert not judge.score_image(judge.judge_image(noise), ask)["ocr_folded"]
    assert judge.score_image(judge.judge_image(wrong_glyph), ask) == {
        "group": "uppercase", "ocr_strict": False, "ocr_folded": False, "fg": True, "bg": True}
    scores = judge.score_image(judge.judge_image(swapped), ask)
    assert scores["ocr_strict"] and not scores["fg"] and not scores["bg"]
    verdict = judge.judge_image(flat)
    assert verdict.char is None and verdict.fg is None and verdict.bg == "blue"


@pytest.mark.parametrize("motion", ["right", "up"])
def test_motion_is_read_and_flips_when_the_clip_runs_backwards(motion):
    ask = judge.Ask("K", "white", "black", motion)
    clip = clips.render_clip("K", "white", "black", motion, start=(-14 * clips.MOTIONS[motion][0],
                                                                    -14 * clips.MOTIONS[motion][1]))
    forward = judge.judge_clip(clip)
    assert forward.direction == motion and judge.monotonicity([f.centroid for f in forward.frames], motion) == 1.0
    assert abs(sum(forward.velocity)) == pytest.approx(clips.STEP_PX, abs=0.5)  # 4 px a frame along one axis
    scores = judge.score_clip(forward, ask)
    assert scores["direction"] and scores["fg"] == scores["bg"] == 1.0 and scores["ocr_folded"] >= 0.75
    backward = judge.judge_clip(clip[::-1])
    opposite = {"right": "left", "up": "down"}[motion]
    assert backward.direction == opposite
    assert judge.score_clip(backward, ask)["direction"] is False and judge.score_clip(backward, ask)["monotonic"] == 0


def test_true_render_ceiling_is_high_on_training_style_renders():
    """Random fonts, sizes and places, as the training data draws them: most are read (case-folded)."""
    scores = [judge.score_image(judge.judge_image(judge.true_image(judge.Ask(c), judge.render_rng(c, 0))),
                                judge.Ask(c)) for c in "AKRgkt37"]
    summary = judge.summarise(scores)
    assert summary["samples"] == 8 and summary["ocr_folded"] >= 0.75
    assert set(summary) >= {"uppercase", "lowercase", "digit", "ocr_strict"}
    # in a model's narrower training style the renders follow it: the same draws, other fonts and sizes
    varied = judge.true_image(judge.Ask("K"), judge.render_rng("K", 1))
    sans = judge.true_image(judge.Ask("K"), judge.render_rng("K", 1), "sans")
    assert varied[0, 0].tolist() == sans[0, 0].tolist() and not np.array_equal(varied, sans)


def test_the_shipped_tokenizer_keeps_most_renders_legible_and_a_scrambled_one_does_not():
    """The tokenizer's ceiling (`bench image --quality`'s `through the tokenizer` row): renders encoded to the
    shipped VQ's codes and decoded keep their background and are mostly read; with every code mapped to another
    (a tokenizer that maps images to the wrong codes) they are not."""
    import torch

    from specgen.modalities.assets import assets_dir
    from specgen.modalities.image.vq import decode, encode, load_vq

    vq = load_vq(assets_dir() / "image" / "vq")
    asks = [judge.Ask(c, "white", "black") for c in "AEKRZ2479"]
    renders = np.stack([judge.true_image(ask, judge.render_rng(ask.char, 0)) for ask in asks])
    codes = encode(vq, renders)

    def read(images):
        return judge.summarise([judge.score_image(judge.judge_image(image), ask) for image, ask in zip(images, asks)])

    through = read(decode(vq, codes))
    assert through["bg"] == 1.0 and through["ocr_folded"] >= 0.5
    shuffled = torch.randperm(vq.quantize.embedding.weight.shape[0], generator=torch.Generator().manual_seed(0))
    assert read(decode(vq, shuffled[torch.as_tensor(codes)]))["ocr_folded"] <= 0.25


def test_bench_image_quality_writes_the_judge_columns(tmp_path):
    from tiny_models import save_tiny_image_model

    from specgen.app.bench.image import run_bench_image, write_outputs
    from specgen.modalities.image.generator import ImageGenerator

    model, vq = save_tiny_image_model(tmp_path / "image", num_codes=16, grid=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "k", "category": "glyph", "prompt": "red K on blue"}\n'
                       '{"id": "three", "category": "digit", "class": "digit 3"}\n')
    result = run_bench_image(prompts_path=prompts, methods=["mc-sjd"], windows=(2,),
                             generator=ImageGenerator(model, vq), quality=True)
    result["env"]["timestamp_utc"] = "x"
    quality = result["quality"]
    # "digit 3" asks nothing judgeable: one sample per method
    assert set(quality["methods"]) == {"ar", "mc-sjd"} and quality["methods"]["ar"]["samples"] == 1
    assert {"ocr_folded", "ocr_strict", "fg", "bg", "uppercase"} <= set(quality["methods"]["mc-sjd"])
    assert quality["true_renders"]["samples"] == 4 and quality["true_renders"]["bg"] == 1.0
    assert quality["through_tokenizer"]["samples"] == 4  # the same renders through the (random) VQ
    assert quality["chance"]["samples"] == 0  # one judgeable prompt: no other prompt to score against
    verdict = result["items"][0]["quality"]["verdict"]
    assert judge.score(judge.verdict_from_dict(verdict), judge.Ask("K", "red", "blue")) == {
        k: v for k, v in result["items"][0]["quality"].items() if k != "verdict"}
    assert result["env"]["tesseract"]
    written = write_outputs(result, tmp_path, plot=False)
    report = (tmp_path / "image-quality-latest.md").read_text()
    assert "Quality (independent judge)" in report and "true renders (ceiling)" in report and "| `mc-sjd` |" in report
    assert "| true renders through the tokenizer | 4 |" in report
    assert json.loads(written.runs["json"].read_text())["quality"]["renders_per_prompt"] == 4


def test_bench_quality_without_tesseract_is_one_clear_error(tmp_path, monkeypatch, capsys):
    from specgen.app.cli import main

    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", str(tmp_path / "no-tesseract"))
    assert main(["bench", "image", "--quality", "--methods", "ar", "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "tesseract-ocr" in err and len(err.strip().splitlines()) == 1
