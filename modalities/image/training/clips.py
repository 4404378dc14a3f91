"""An offline dataset of short clips: a glyph that moves across a still background, 8 frames of 64×64 RGB.

Each clip is one character from the system fonts in a palette colour on another, moving left, right, up or down by
4 pixels a frame; prompt "red K moving right on blue", class "K moving right". Four pixels is one token of the
16×16 VQ grid, so consecutive frames are nearly the previous frame's codes shifted by one: the predictable
structure that makes Jacobi decoding of video far more effective than of single images.

Item i of a (seed, split) is a pure function of (seed, split, i), like `images.make_item`, so training resumes on
exact data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specgen.errors import InvalidRequest
from specgen.modalities.image.training import images

FRAMES = 8
STEP_PX = 4  # pixels a glyph moves per frame: one cell of the 16×16 token grid at 64×64
MOTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
_SPLIT_SALT = {"train": 10, "val": 11}  # disjoint from the image dataset's streams
# The clips' glyph styles (images.GLYPH_STYLES' names): smaller glyphs than the images', so that a path of 8 frames
# stays inside the frame; a style's jitter bounds the offset across the motion.
CLIP_STYLES: dict[str, images.GlyphStyle] = {
    "varied": images.GlyphStyle(sizes=(24, 36)),
    "bold": images.GlyphStyle(("DejaVuSans-Bold",), (32, 36), 2),
}


@dataclass(frozen=True)
class ClipSet:
    clips: np.ndarray  # uint8 [N, frames, 64, 64, 3]
    classes: list[str]
    prompts: list[str]

    def __len__(self) -> int:
        return len(self.clips)


def render_clip(char: str, fg: str, bg: str, motion: str, *, font: str | None = None, size: int = 30,
                start: tuple[int, int] = (0, 0), frames: int = FRAMES) -> np.ndarray:
    """`char` starting at offset `start` from the centre and moving STEP_PX a frame, as uint8 [frames, 64, 64, 3]."""
    if motion not in MOTIONS:
        raise InvalidRequest(f"motion must be one of {', '.join(MOTIONS)}, not {motion!r}")
    mx, my = MOTIONS[motion]
    return np.stack([images.render_glyph(char, fg, bg, font=font, size=size, dx=start[0] + mx * STEP_PX * t,
                                       dy=start[1] + my * STEP_PX * t) for t in range(frames)])


def clip_style(name: str) -> images.GlyphStyle:
    if name not in CLIP_STYLES:
        raise InvalidRequest(f"the clips' glyph style must be one of {', '.join(CLIP_STYLES)}, not {name!r}")
    return CLIP_STYLES[name]


def glyph_path(style: images.GlyphStyle, motion: str, rng: np.random.Generator,
               frames: int = FRAMES) -> tuple[str, int, tuple[int, int]]:
    """(font, size, start offset) of a clip's glyph in `style` moving `motion`, drawn from rng: along the motion the
    path is centred with a little jitter; across it, any offset that keeps a glyph of this size inside the frame (at
    most the style's jitter)."""
    size = int(rng.integers(style.sizes[0], style.sizes[1] + 1))
    along = -(STEP_PX * (frames - 1)) // 2 + int(rng.integers(-3, 4))
    low, high = (-(images.SIZE - size) // 3, (images.SIZE - size) // 3) if style.jitter is None else \
        (-style.jitter, style.jitter)
    across = int(rng.integers(low, high + 1))
    mx, my = MOTIONS[motion]
    start = (along * mx + across * (1 - abs(mx)), along * my + across * (1 - abs(my)))
    fonts = style.font_files()
    return fonts[rng.integers(len(fonts))], size, start


def clip_item(index: int, seed: int = 0, split: str = "train", frames: int = FRAMES, style: str = "varied"):
    """Clip `index` of the dataset (seed, split), its glyph in `style`: (frames uint8 [F, 64, 64, 3], class,
    prompt)."""
    if split not in _SPLIT_SALT:
        raise InvalidRequest(f"split must be 'train' or 'val', not {split!r}")
    if index < 0:
        raise InvalidRequest(f"clip index must be >= 0, not {index}")
    rng = np.random.default_rng((seed, _SPLIT_SALT[split], index))
    char = images.CHARACTERS[rng.integers(len(images.CHARACTERS))]
    fg, bg = images._two_colours(rng)
    motion = list(MOTIONS)[rng.integers(len(MOTIONS))]
    font, size, start = glyph_path(clip_style(style), motion, rng, frames)
    clip = render_clip(char, fg, bg, motion, font=font, size=size, start=start, frames=frames)
    return clip, f"{char} moving {motion}", f"{fg} {char} moving {motion} on {bg}"


def make_clips(n: int, seed: int = 0, split: str = "train", start: int = 0, frames: int = FRAMES,
               style: str = "varied") -> ClipSet:
    """Clips start .. start+n-1 of the dataset (seed, split), glyphs in `style`, stacked."""
    if n < 0:
        raise InvalidRequest(f"dataset size must be >= 0, not {n}")
    items = [clip_item(i, seed, split, frames, style) for i in range(start, start + n)]
    clips = np.stack([c for c, _, _ in items]) if items else np.zeros((0, frames, images.SIZE, images.SIZE, 3), np.uint8)
    return ClipSet(clips, [c for _, c, _ in items], [p for _, _, p in items])
