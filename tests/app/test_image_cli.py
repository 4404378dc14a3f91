"""`specgen generate image` and `specgen train image` end to end on tiny random models."""

import json

import pytest
from PIL import Image
from tiny_models import save_tiny_image_model

from specgen.app.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_image_model(tmp_path_factory.mktemp("image"), num_codes=16, grid=4)


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_image_writes_a_png_and_reports_stats(tiny, tmp_path, capsys):
    model, vq = tiny
    out = tmp_path / "k.png"
    code, stdout, _ = run(["generate", "image", "--prompt", "red K on blue", "--model", str(model), "--vq", str(vq),
                           "--method", "mc-sjd", "--window", "6", "--out", str(out), "--seed", "3", "--json"], capsys)
    assert code == 0
    result = json.loads(stdout)
    assert result["out"] == str(out) and len(result["tokens"]) == 16
    assert result["stats"]["method"] == "mc-sjd" and result["stats"]["committed"] == 16
    assert Image.open(out).size == (16, 16)


def test_several_samples_make_one_grid(tiny, tmp_path, capsys):
    model, vq = tiny
    out = tmp_path / "grid.png"
    code, _, _ = run(["generate", "image", "--class", "K", "--model", str(model), "--vq", str(vq), "--method", "ar",
                      "--num-samples", "4", "--out", str(out)], capsys)
    assert code == 0 and Image.open(out).size == (32, 32)


@pytest.mark.parametrize("extra,words", [
    (["--prompt", "purple Q"], "unknown word"),
    (["--prompt", "red K", "--method", "ar", "--window", "8"], "Jacobi methods"),
    (["--prompt", "red K", "--guidance", "-1"], "guidance_scale"),
])
def test_bad_image_requests_give_one_error_line(tiny, tmp_path, capsys, extra, words):
    model, vq = tiny
    code, out, err = run(["generate", "image", "--model", str(model), "--vq", str(vq), "--out", str(tmp_path / "x.png"),
                          *extra], capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and words in err
    assert not (tmp_path / "x.png").exists()


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    code, _, err = run(["generate", "image", "--prompt", "K", "--model", str(tmp_path / "none"),
                        "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "no image token model" in err
