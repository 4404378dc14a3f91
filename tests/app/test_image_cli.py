"""`specgen generate image|video`, `specgen bench video` and `specgen train image` end to end on tiny random
models."""

import json

import pytest
from PIL import Image
from tiny_models import save_tiny_image_head, save_tiny_image_model

from specgen.app.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_image_model(tmp_path_factory.mktemp("image"), num_codes=16, grid=4)


@pytest.fixture(scope="module")
def tiny_head(tiny):
    model, _ = tiny
    return save_tiny_image_head(model.parent, model)


@pytest.fixture(scope="module")
def tiny_video(tmp_path_factory):
    return save_tiny_image_model(tmp_path_factory.mktemp("video"), num_codes=16, grid=4, frames=3)


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
    (["--prompt", "red K", "--method", "ar", "--window", "8"],
     "--window applies to sjd, mc-sjd, gumbel-sjd, not 'ar'"),
    (["--prompt", "red K", "--guidance", "-1"], "guidance_scale"),
])
def test_bad_image_requests_give_one_error_line(tiny, tmp_path, capsys, extra, words):
    model, vq = tiny
    code, out, err = run(["generate", "image", "--model", str(model), "--vq", str(vq), "--out", str(tmp_path / "x.png"),
                          *extra], capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and words in err
    assert not (tmp_path / "x.png").exists()


def test_generate_image_with_lantern_plus_plus(tiny, tiny_head, tmp_path, capsys):
    model, vq = tiny
    code, stdout, _ = run(["generate", "image", "--prompt", "red K on blue", "--model", str(model), "--vq", str(vq),
                           "--head", str(tiny_head), "--method", "lantern++", "--lam", "3", "--shape", "chain-3",
                           "--out", str(tmp_path / "l.png"), "--json"], capsys)
    stats = json.loads(stdout)["stats"]
    assert code == 0 and stats["method"] == "lantern++" and stats["lossless"] is False and "relaxed_share" in stats


@pytest.mark.parametrize("extra,words", [
    (["--method", "lantern++", "--lam", "0.5"], "lam must be >= 1"),
    (["--method", "eagle", "--lam", "2"], "--lam applies to lantern++, not 'eagle'"),
    (["--method", "eagle", "--window", "4"], "--window applies to sjd, mc-sjd, gumbel-sjd"),
    (["--method", "eagle", "--shape", "bushy"], "tree shape"),
    (["--method", "lantern", "--delta", "2"], "delta must be <= 1"),
])
def test_bad_head_requests_give_one_error_line(tiny, tiny_head, tmp_path, capsys, extra, words):
    model, vq = tiny
    code, out, err = run(["generate", "image", "--prompt", "red K", "--model", str(model), "--vq", str(vq),
                          "--head", str(tiny_head), "--out", str(tmp_path / "x.png"), *extra], capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and words in err, err


def test_missing_head_is_a_clear_error(tiny, tmp_path, capsys):
    model, vq = tiny
    code, _, err = run(["generate", "image", "--prompt", "K", "--model", str(model), "--vq", str(vq), "--method",
                        "eagle", "--head", str(tmp_path / "none"), "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "train image-head" in err and len(err.splitlines()) == 1


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    code, _, err = run(["generate", "image", "--prompt", "K", "--model", str(tmp_path / "none"),
                        "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "no image token model" in err


def test_generate_video_writes_a_gif(tiny_video, tmp_path, capsys):
    model, vq = tiny_video
    out = tmp_path / "v.gif"
    code, stdout, _ = run(["generate", "video", "--prompt", "red K moving right", "--model", str(model), "--vq",
                           str(vq), "--method", "mc-sjd", "--window", "40", "--num-samples", "2", "--fps", "8",
                           "--out", str(out), "--json"], capsys)  # --window is a Jacobi knob; the default is auto
    assert code == 0
    result = json.loads(stdout)
    assert len(result["tokens"]) == 2 and all(len(t) == 48 for t in result["tokens"])
    assert result["stats"]["method"] == "mc-sjd" and result["stats"]["committed"] == 96
    gif = Image.open(out)
    assert gif.n_frames == 3 and gif.info["duration"] in (120, 130)  # GIF delays are in 10 ms units
    assert gif.size == (16 * 4, 2 * 16 * 4)  # both samples in every frame, enlarged 4x


def test_image_and_video_models_are_not_interchangeable(tiny, tiny_video, tmp_path, capsys):
    code, _, err = run(["generate", "video", "--class", "K", "--model", str(tiny[0]), "--vq", str(tiny[1]),
                        "--out", str(tmp_path / "v.gif")], capsys)
    assert code == 2 and "an image model" in err and "generate image" in err
    code, _, err = run(["bench", "image", "--model", str(tiny_video[0]), "--json"], capsys)
    assert code == 2 and "a video model" in err and "bench video" in err


def test_mp4_needs_ffmpeg(tiny_video, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    model, vq = tiny_video
    code, _, err = run(["generate", "video", "--class", "K", "--model", str(model), "--vq", str(vq), "--method", "ar",
                        "--out", str(tmp_path / "v.mp4")], capsys)
    assert code == 2 and "ffmpeg" in err and ".gif" in err


def test_bench_video_writes_its_report(tiny_video, tmp_path, capsys):
    model, vq = tiny_video
    prompts = tmp_path / "video.jsonl"
    prompts.write_text('{"id": "k", "category": "glyph", "prompt": "red K moving right"}\n')
    code, stdout, _ = run(["bench", "video", "--model", str(model), "--prompts", str(prompts), "--methods",
                           "mc-sjd", "--windows", "8,48", "--out-dir", str(tmp_path), "--json"], capsys)
    assert code == 0
    result = json.loads(stdout)
    assert result["modality"] == "video" and result["frames"] == 3 and result["tokens_per_image"] == 48
    assert {(r["method"], r["window"]) for r in result["table"]} == {("ar", 1), ("mc-sjd", 8), ("mc-sjd", 48)}
    assert result["all_identical_to_ar"]
    assert "# specgen bench video" in (tmp_path / "video-latest.md").read_text()
    assert (tmp_path / "video-latest-samples.png").exists()
