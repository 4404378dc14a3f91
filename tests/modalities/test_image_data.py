"""The offline image dataset (glyphs, digits, photos) and the token layout shared by image models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specgen.modalities.image.training import images
from specgen.modalities.image.conditions import EXAMPLE_PROMPTS, ImageVocab
from specgen.modalities.image.training.token_models import default_vocab

from specgen.errors import InvalidRequest, ModelNotFound


def test_items_are_deterministic_and_independent_of_the_slice():
    a = images.make_dataset(20, seed=5)
    b = images.make_dataset(20, seed=5)
    assert a.images.shape == (20, 64, 64, 3) and a.images.dtype == np.uint8
    assert np.array_equal(a.images, b.images) and a.prompts == b.prompts
    tail = images.make_dataset(5, seed=5, start=15)  # item i does not depend on the items before it
    assert np.array_equal(tail.images, a.images[15:]) and tail.classes == a.classes[15:]
    assert not np.array_equal(images.make_dataset(20, seed=6).images, a.images)
    assert not np.array_equal(images.make_dataset(20, seed=5, split="val").images, a.images)


def test_sources_mix_in_fixed_proportions_with_matching_prompts():
    d = images.make_dataset(30, seed=0)
    assert [d.sources.count(s) for s in images.SOURCES] == [18, 6, 6]
    for cls, prompt, source in zip(d.classes, d.prompts, d.sources):
        if source == "glyph":
            fg, char, on, bg = prompt.split()
            assert char == cls and on == "on" and fg != bg and {fg, bg} <= set(images.PALETTE)
        elif source == "digit":
            assert cls.startswith("digit ") and (prompt == cls or f" {cls} on " in prompt)
        else:
            assert prompt == f"photo of {cls}" and cls in images.PHOTOS


def test_per_source_items_and_rendering():
    photos = images.source_items("photo", 4, seed=1)
    assert set(photos.sources) == {"photo"} and photos.images.shape == (4, 64, 64, 3)
    img = images.render_glyph("K", "red", "blue")
    assert tuple(img[0, 0]) == images.PALETTE["blue"] and (img == images.PALETTE["red"]).all(axis=2).any()
    with pytest.raises(InvalidRequest, match="source"):
        images.source_items("video", 1)
    with pytest.raises(InvalidRequest, match="split"):
        images.make_item(0, split="test")


def test_a_glyph_style_narrows_fonts_and_sizes_and_leaves_the_rest_of_the_stream():
    fonts = images.glyph_style("sans").font_files()
    assert len(fonts) == 4 and all("Sans" in f and "Mono" not in f and "Condensed" not in f for f in fonts)
    assert images.glyph_style("sans").sizes == (36, 52)
    assert images.glyph_style("varied").font_files() == images.font_files()
    varied, sans = images.make_dataset(30, seed=3), images.make_dataset(30, seed=3, style="sans")
    assert varied.prompts == sans.prompts  # same characters and colours: the style only draws them otherwise
    glyphs = [i for i, s in enumerate(varied.sources) if s == "glyph"]
    others = [i for i, s in enumerate(varied.sources) if s != "glyph"]
    assert np.array_equal(varied.images[others], sans.images[others])
    assert not np.array_equal(varied.images[glyphs], sans.images[glyphs])
    # the style's glyphs are as large as it says: the ink's bounding box is at least 36 px * ~0.5 high
    for i in glyphs:
        ink = (sans.images[i] != sans.images[i][0, 0]).any(axis=2)
        rows = np.flatnonzero(ink.any(axis=1))
        assert rows[-1] - rows[0] >= 17
    with pytest.raises(InvalidRequest, match="glyph style"):
        images.make_dataset(1, style="cursive")


def test_vocab_layout_and_prompts():
    v = default_vocab()
    assert (v.bos, v.boi, v.null, v.pad) == (512, 513, 514, 515)
    assert v.vocab_size == 512 + 4 + len(v.words) and v.sequence_length == v.prefix_length + 2 + 256
    ids = v.prompt_ids("Red K on BLUE")
    assert ids.dtype == torch.int64 and len(ids) == v.prompt_length
    assert ids[0] == v.bos and ids[-1] == v.boi and ids[-2] == v.pad
    assert v.words_of(ids) == ["red", "K", "on", "blue"]
    assert v.prompt_ids("k")[1] != v.prompt_ids("K")[1]  # single characters keep their case
    un = v.uncond_ids()
    assert len(un) == len(ids) and un[1:-1].eq(v.null).all()
    for prompt in EXAMPLE_PROMPTS:
        v.prompt_ids(prompt)
    for item in images.make_dataset(40).prompts:  # every dataset prompt and class is expressible
        v.prompt_ids(item)


def test_vocab_errors_and_round_trip(tmp_path):
    v = default_vocab()
    with pytest.raises(InvalidRequest, match="unknown word 'dragon'.*'red K on blue'"):
        v.prompt_ids("photo of dragon")
    with pytest.raises(InvalidRequest, match="empty"):
        v.prompt_ids("   ")
    with pytest.raises(InvalidRequest, match="at most 5"):
        v.prompt_ids("red K on blue on red")
    v.save(tmp_path / "vocab.json")
    assert ImageVocab.load(tmp_path / "vocab.json") == v == ImageVocab.load(tmp_path)
    with pytest.raises(ModelNotFound):
        ImageVocab.load(tmp_path / "missing.json")
