"""Video on tiny random models: a video is its frames' codes in one sequence, decoded by plain, SJD and both
coupled Jacobi decoders with windows longer than a frame; greedy Jacobi equals greedy decoding token for token,
sampling matches the exact guided target, and the frames come out as a GIF."""

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_models import GuidedTransformers, save_tiny_image_model

from specgen.errors import InvalidRequest
from specgen.modalities.image.training import clips
from specgen.modalities.image.training.token_models import video_vocab
from specgen.modalities.image.generator import CodesOnly, ImageGenerator
from specgen.modalities.image.video import filmstrip, save_video
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers.processing import Processing


@pytest.fixture(scope="module")
def video4(tmp_path_factory):
    """4 frames of 4x4 codes: 64 tokens a video."""
    return save_tiny_image_model(tmp_path_factory.mktemp("video4"), num_codes=16, grid=4, frames=4)


@pytest.fixture(scope="module")
def video_tiny(tmp_path_factory):
    """3 frames of one code out of 4: 64 possible videos, few enough to enumerate."""
    return save_tiny_image_model(tmp_path_factory.mktemp("video1"), num_codes=4, grid=1, frames=3, seed=2)


@pytest.mark.parametrize("method,window", [("sjd", 16), ("mc-sjd", 128), ("gumbel-sjd", 40)])
def test_greedy_jacobi_on_video_equals_greedy_decoding(video4, method, window):
    model, vq = video4
    generator = ImageGenerator(model, vq)
    assert generator.modality == "video" and generator.vocab.image_tokens == 64
    plain = generator.generate("red K moving right", method="ar", temperature=0, num_samples=2)
    jacobi = generator.generate("red K moving right", method=method, temperature=0, num_samples=2, window=window)
    assert jacobi.tokens == plain.tokens
    assert jacobi.stats["steps"] < plain.stats["steps"] == 64
    frames = jacobi.image
    assert len(frames) == 4 and all(f.size == (16, 16) for f in frames)
    assert len(jacobi.images) == 2


@pytest.mark.slow
@pytest.mark.parametrize("method", ["mc-sjd", "gumbel-sjd"])
def test_video_sampling_matches_the_guided_target(video_tiny, method):
    model, vq = video_tiny
    generator = ImageGenerator(model, vq, dtype=torch.float64)
    prompt, scale = "blue K moving right", 2.0
    oracle = GuidedTransformers(generator.model, generator.vocab, prompt, scale)
    expected = target_joint(oracle, Processing(top_k=3, hooks=(CodesOnly(4),)), oracle.prompt, 3)
    result = generator.generate(prompt, method=method, top_k=3, guidance_scale=scale, num_samples=3000, seed=7,
                                window=128)  # the window is longer than the whole video
    fit = goodness_of_fit([tuple(t) for t in result.tokens], expected)
    assert fit.p_value > 1e-4, fit


def test_a_video_model_is_not_an_image_model(video4):
    model, vq = video4
    generator = ImageGenerator(model, vq)
    with pytest.raises(InvalidRequest, match="unknown video method"):
        generator.generate("red K", method="lantern")
    with pytest.raises(InvalidRequest, match="needs 64 codes"):
        generator.decode([[0] * 16])


def test_gif_and_filmstrip(tmp_path):
    frames = [Image.new("RGB", (8, 8), (10 * k, 0, 0)) for k in range(5)]
    path = save_video(frames, tmp_path / "v.gif", fps=5, scale=2)
    gif = Image.open(path)
    assert gif.n_frames == 5 and gif.size == (16, 16) and gif.info["duration"] == 200
    assert filmstrip(frames, columns=2, gap=1).size == (17, 26)
    with pytest.raises(InvalidRequest, match="gif"):
        save_video(frames, tmp_path / "v.avi")
    with pytest.raises(InvalidRequest, match="at least one frame"):
        save_video([], tmp_path / "v.gif")


def test_clips_move_one_token_a_frame():
    clip, cls, prompt = clips.clip_item(3)
    assert clip.shape == (clips.FRAMES, 64, 64, 3) and clip.dtype == np.uint8
    words = prompt.split()
    assert cls == f"{words[1]} moving {words[3]}" and words[2] == "moving" and words[3] in clips.MOTIONS
    dx, dy = clips.MOTIONS[words[3]]
    shifted = np.roll(clip[0].astype(int), (dy * clips.STEP_PX, dx * clips.STEP_PX), axis=(0, 1))
    assert np.array_equal(shifted[8:-8, 8:-8], clip[1][8:-8, 8:-8].astype(int))  # the glyph moved, nothing else
    assert not np.array_equal(clip[0], clip[1])
    again, _, _ = clips.clip_item(3)
    assert np.array_equal(clip, again)  # a pure function of (seed, split, index)
    vocab = video_vocab()
    assert vocab.frames == clips.FRAMES and vocab.image_tokens == clips.FRAMES * 256
    assert len(vocab.condition_ids(prompt)) == 6 and vocab.condition_ids("red K on blue")
    with pytest.raises(InvalidRequest, match="motion"):
        clips.render_clip("K", "red", "blue", "sideways")


def test_a_clip_style_draws_the_same_clips_in_its_font_and_sizes():
    from specgen.modalities.image import judge

    varied, bold = clips.make_clips(6, seed=2), clips.make_clips(6, seed=2, style="bold")
    assert varied.prompts == bold.prompts and not np.array_equal(varied.clips, bold.clips)
    for clip in bold.clips:  # 32-36 px DejaVu Sans Bold: the ink is at least ~20 px high in every frame
        ink = (clip != clip[0, 0, 0]).any(axis=3)
        assert all(np.ptp(np.flatnonzero(frame.any(axis=1))) >= 18 for frame in ink)
    with pytest.raises(InvalidRequest, match="glyph style"):
        clips.make_clips(1, style="sans")  # an image style without a clip counterpart
    ask = judge.parse_prompt("red K moving left on blue")  # the judge's true clips follow the style
    assert np.array_equal(judge.true_clip(ask, judge.render_rng("a", 0), style="bold")[0, 0, 0],
                          judge.true_clip(ask, judge.render_rng("a", 0))[0, 0, 0])
    assert not np.array_equal(judge.true_clip(ask, judge.render_rng("a", 0), style="bold"),
                              judge.true_clip(ask, judge.render_rng("a", 0)))
