"""An independent judge of generated glyph images and clips: which character Tesseract reads, which palette colours
the glyph and its background are, and which way the glyph moves over a clip's frames.

The judge shares nothing with the models it scores (no VQ, no classifier trained here): it maps pixels to the 10
palette colours of the training data, takes the background as the majority colour of the border and the glyph as the
dominant colour of the rest, binarises the image to black ink on white by the nearer of the two colours, crops the
ink, scales it to a fixed height and asks Tesseract for one character of the prompt alphabet (`--psm 10`, with two
fallbacks where that reads nothing: OCR_CONFIGS). A clip
is judged frame by frame with the clip's own two colours, and the ink's centroid over the frames gives the direction
of motion. Its ceiling, the same checks on true renders of the same prompts drawn as the training data draws them
(`true_image`, `true_clip`), is reported beside every generated figure: a model cannot be judged better than that.

Letters are compared two ways: strictly, and case-folded (letters case-insensitive, and 0 the same as O). A lone
glyph has no baseline or x-height to compare with, so its case is often undecidable, even on true renders: c/C,
o/O, s/S, v/V, w/W, x/X, z/Z (and 0/O) have one shape in most fonts, and k/K, p/P, u/U, m/M differ only in size.
Reports lead with the case-folded figure and show the strict one beside it.

Tesseract is the Debian package `tesseract-ocr` driven through `pytesseract` (extra `image-eval`); both are imported
only when a glyph is read, and `require_tesseract()` turns their absence into one clear error.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from specgen.errors import MissingExtra
from specgen.modalities.image.training import clips, images

ALPHABET = "".join(images.CHARACTERS)
COLOUR_NAMES = tuple(images.PALETTE)
_PALETTE_RGB = np.array([images.PALETTE[name] for name in COLOUR_NAMES], np.float32)  # [10, 3]
SAME_SHAPE = frozenset("cosvwxz")  # lower and upper case drawn alike in most fonts (and 0 like O)
GROUPS = ("uppercase", "lowercase", "digit")

BORDER_PX = 2  # the frame the background colour is read from (the training renders keep glyphs off it mostly)
MIN_INK_SHARE = 0.005  # less glyph-coloured area than this (20 of 4,096 pixels) is no glyph at all
OCR_HEIGHT = 48  # ink is scaled to this height: of 24-96 px, 48 read the most true renders
# Tesseract configurations tried in turn until one reads a character. Tesseract 5.3's LSTM with --psm 10 and a
# whitelist returns nothing for some plain glyphs (DejaVu Sans "R" at any height) that it reads without the whitelist
# or as a one-word page (--psm 8). On 186 training-style renders this chain read 97 % case-folded (psm 10 with the
# whitelist alone: 96 %; psm 8 alone: 95 %), with 1.05 calls per glyph.
OCR_CONFIGS = (f"--psm 10 --oem 1 -c tessedit_char_whitelist={ALPHABET}", "--psm 10 --oem 1",
               f"--psm 8 --oem 1 -c tessedit_char_whitelist={ALPHABET}")
MOVE_PX = 0.5  # a centroid step smaller than this along the asked direction is not a move


# ---- what a prompt asks for --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ask:
    """What a prompt asks for; None where it does not say (a class prompt "K" names no colours)."""

    char: str | None = None
    fg: str | None = None
    bg: str | None = None
    motion: str | None = None

    @property
    def group(self) -> str | None:
        """uppercase, lowercase or digit: the class groups accuracy is reported by."""
        if self.char is None:
            return None
        return "digit" if self.char.isdigit() else "uppercase" if self.char.isupper() else "lowercase"

    @property
    def judgeable(self) -> bool:
        return self.char is not None or self.bg is not None


def parse_prompt(prompt: str) -> Ask:
    """The glyph, colours and motion of a prompt of the training data's grammar: "red K on blue", "K",
    "red K moving right on blue", "K moving up", "green digit 5 on black" (colours only: scanned digits are not
    glyphs of the fonts). Photos and anything else ask for nothing judgeable."""
    words = prompt.split()
    motion = None
    if "moving" in words:
        at = words.index("moving")
        if at + 1 < len(words) and words[at + 1] in clips.MOTIONS:
            motion = words[at + 1]
            words = words[:at] + words[at + 2:]
    fg = bg = None
    if len(words) >= 3 and words[-2] == "on" and words[-1] in images.PALETTE and words[0] in images.PALETTE:
        fg, bg, words = words[0], words[-1], words[1:-2]
    char = words[0] if len(words) == 1 and words[0] in images.CHARACTERS else None
    if char is None and not (words[:1] == ["digit"] and fg is not None):
        return Ask(motion=motion)  # nothing we can judge: a photo, a scanned digit without colours, free text
    return Ask(char, fg, bg, motion)


# ---- one image -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageVerdict:
    """What the judge sees in one image."""

    char: str | None  # what Tesseract read (one character of ALPHABET), or None
    fg: str | None  # the glyph's palette colour, None where no second colour covers MIN_INK_SHARE
    bg: str  # the background's palette colour
    centroid: tuple[float, float] | None  # the ink's centre (x, y) in pixels
    ink_share: float  # the share of pixels drawn in the glyph colour


def palette_index(pixels: np.ndarray) -> np.ndarray:
    """The nearest palette colour of every pixel: uint8 [..., 3] -> int [...] into COLOUR_NAMES."""
    rgb = pixels.astype(np.float32)[..., None, :]  # [..., 1, 3]
    return ((rgb - _PALETTE_RGB) ** 2).sum(-1).argmin(-1)


def two_colours(frames: np.ndarray) -> tuple[int, int | None]:
    """(background, glyph) palette indices of uint8 [F, H, W, 3] frames: the majority colour of the border, and the
    most common other colour if it covers MIN_INK_SHARE of the pixels."""
    labels = palette_index(frames)  # [F, H, W]
    border = np.ones(labels.shape[1:], bool)
    border[BORDER_PX:-BORDER_PX, BORDER_PX:-BORDER_PX] = False
    bg = int(np.bincount(labels[:, border].ravel(), minlength=len(COLOUR_NAMES)).argmax())
    counts = np.bincount(labels.ravel(), minlength=len(COLOUR_NAMES))
    counts[bg] = 0
    fg = int(counts.argmax())
    return bg, (fg if counts[fg] >= MIN_INK_SHARE * labels.size else None)


def ink_mask(frames: np.ndarray, bg: int, fg: int | None) -> np.ndarray:
    """bool [F, H, W]: pixels nearer the glyph's colour than the background's. The two colours are their mean RGB in
    these frames (a generated image shifts the palette), seeded by the pixels labelled with them."""
    if fg is None:
        return np.zeros(frames.shape[:-1], bool)
    labels = palette_index(frames)
    rgb = frames.astype(np.float32)
    fg_rgb, bg_rgb = rgb[labels == fg].mean(0), rgb[labels == bg].mean(0)
    return ((rgb - fg_rgb) ** 2).sum(-1) < ((rgb - bg_rgb) ** 2).sum(-1)


def centroid(ink: np.ndarray) -> tuple[float, float] | None:
    ys, xs = np.nonzero(ink)
    return (float(xs.mean()), float(ys.mean())) if len(xs) else None


def ocr_page(ink: np.ndarray, height: int = OCR_HEIGHT):
    """The PIL page Tesseract reads: the ink's bounding box as black on white, scaled to `height`, with a margin of
    half that (Tesseract needs white space around a character to find it)."""
    from PIL import Image

    ys, xs = np.nonzero(ink)
    crop = np.where(ink[ys.min():ys.max() + 1, xs.min():xs.max() + 1], 0, 255).astype(np.uint8)
    scale = height / crop.shape[0]
    page = Image.fromarray(crop).resize((max(1, round(crop.shape[1] * scale)), height), Image.BICUBIC)
    return Image.fromarray(np.pad(np.asarray(page), height // 2, constant_values=255))


def read_glyph(ink: np.ndarray) -> str | None:
    """One character of ALPHABET that Tesseract reads in a bool [H, W] ink mask, or None."""
    if ink.mean() < MIN_INK_SHARE:
        return None
    pytesseract = _pytesseract()
    page = ocr_page(ink)
    for config in OCR_CONFIGS:
        text = [c for c in pytesseract.image_to_string(page, config=config) if c in ALPHABET]
        if text:
            return text[0]  # --psm 10 sometimes splits one glyph in two ("Ww"): the first is the better read
    return None


def judge_image(image) -> ImageVerdict:
    """Colours, ink and the character read of one uint8 [H, W, 3] image (or PIL image)."""
    pixels = np.asarray(image)[None]
    bg, fg = two_colours(pixels)
    ink = ink_mask(pixels, bg, fg)[0]
    return ImageVerdict(read_glyph(ink), COLOUR_NAMES[fg] if fg is not None else None, COLOUR_NAMES[bg],
                        centroid(ink), float(ink.mean()))


# ---- a clip --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClipVerdict:
    frames: tuple[ImageVerdict, ...]
    direction: str | None  # left, right, up or down: the axis and sign of the centroid's fitted velocity
    velocity: tuple[float, float] | None  # px per frame (x, y), least squares over the frames with ink


def judge_clip(frames) -> ClipVerdict:
    """Each frame of a clip (uint8 [F, H, W, 3], or a list of PIL frames) judged with the clip's own two colours (a
    frame is too small a sample to tell a glyph's colour from a stray blob), and the glyph's motion."""
    pixels = np.stack([np.asarray(f) for f in frames])
    bg, fg = two_colours(pixels)
    inks = ink_mask(pixels, bg, fg)
    verdicts = tuple(ImageVerdict(read_glyph(ink), COLOUR_NAMES[fg] if fg is not None else None, COLOUR_NAMES[bg],
                                  centroid(ink), float(ink.mean())) for ink in inks)
    velocity = fitted_velocity([v.centroid for v in verdicts])
    return ClipVerdict(verdicts, direction_of(velocity), velocity)


def fitted_velocity(centroids: list) -> tuple[float, float] | None:
    """Least-squares slope of x and y over frame number, over the frames that have a centroid (needs two)."""
    points = [(t, c) for t, c in enumerate(centroids) if c is not None]
    if len(points) < 2:
        return None
    t = np.array([p[0] for p in points], np.float64)
    xy = np.array([p[1] for p in points], np.float64)  # [n, 2]
    t = t - t.mean()
    slope = (t[:, None] * (xy - xy.mean(0))).sum(0) / (t ** 2).sum()
    return float(slope[0]), float(slope[1])


def direction_of(velocity: tuple[float, float] | None) -> str | None:
    """The motion word whose axis the velocity mostly follows (image y grows downwards, as in clips.MOTIONS)."""
    if velocity is None or velocity == (0.0, 0.0):
        return None
    vx, vy = velocity
    if abs(vx) >= abs(vy):
        return "right" if vx > 0 else "left"
    return "down" if vy > 0 else "up"


def monotonicity(centroids: list, motion: str) -> float | None:
    """Share of consecutive frame pairs (both with ink) whose centroid moves forward along `motion` by MOVE_PX."""
    mx, my = clips.MOTIONS[motion]
    steps = [(b[0] - a[0]) * mx + (b[1] - a[1]) * my for a, b in zip(centroids, centroids[1:])
             if a is not None and b is not None]
    return sum(s > MOVE_PX for s in steps) / len(steps) if steps else None


# ---- scoring against the prompt ------------------------------------------------------------------------------------

def fold(char: str) -> str:
    """The case-folded class of a character: letters lower-cased, and 0 the same as O."""
    return "o" if char in "0Oo" else char.lower()


def score_image(verdict: ImageVerdict, ask: Ask) -> dict:
    """Booleans per check the prompt asks for: ocr_strict, ocr_folded, fg, bg (absent where not asked)."""
    score = {}
    if ask.char is not None:
        score["group"] = ask.group
        score["ocr_strict"] = verdict.char == ask.char
        score["ocr_folded"] = verdict.char is not None and fold(verdict.char) == fold(ask.char)
    if ask.fg is not None:
        score["fg"] = verdict.fg == ask.fg
    if ask.bg is not None:
        score["bg"] = verdict.bg == ask.bg
    return score


def score_clip(verdict: ClipVerdict, ask: Ask) -> dict:
    """Per-frame shares of score_image's checks, plus direction (bool) and monotonicity (share) where asked."""
    frames = [score_image(v, ask) for v in verdict.frames]
    score = {key: sum(f[key] for f in frames) / len(frames) for key in ("ocr_strict", "ocr_folded", "fg", "bg")
             if key in frames[0]}
    if ask.char is not None:
        score["group"] = ask.group
    if ask.motion is not None:
        score["direction"] = verdict.direction == ask.motion
        score["monotonic"] = monotonicity([v.centroid for v in verdict.frames], ask.motion) or 0.0
    return score


def score(verdict: ImageVerdict | ClipVerdict, ask: Ask) -> dict:
    return score_clip(verdict, ask) if isinstance(verdict, ClipVerdict) else score_image(verdict, ask)


def verdict_from_dict(data: dict) -> ImageVerdict | ClipVerdict:
    """A verdict back from `dataclasses.asdict` (as bench records keep it), to score it against another prompt."""
    if "frames" in data:
        return ClipVerdict(tuple(ImageVerdict(**f) for f in data["frames"]), data["direction"], data["velocity"])
    return ImageVerdict(**data)


def summarise(scores: list[dict]) -> dict:
    """Mean of every check over the scored samples, and the OCR accuracies per class group; counts beside them."""
    summary = {"samples": len(scores)}
    for key in ("ocr_strict", "ocr_folded", "fg", "bg", "direction", "monotonic"):
        values = [float(s[key]) for s in scores if key in s]
        if values:
            summary[key] = sum(values) / len(values)
            summary[f"{key}_n"] = len(values)
    for group in GROUPS:
        chosen = [s for s in scores if s.get("group") == group]
        if chosen:
            summary[group] = {"n": len(chosen), "ocr_strict": sum(s["ocr_strict"] for s in chosen) / len(chosen),
                              "ocr_folded": sum(s["ocr_folded"] for s in chosen) / len(chosen)}
    return summary


# ---- the ceiling: true renders of a prompt, as the training data draws them ------------------------------------------

def true_image(ask: Ask, rng: np.random.Generator, style: str = "varied") -> np.ndarray:
    """A render of the asked glyph as the training data draws it in glyph `style` (`images.glyph_item`: its fonts,
    its sizes, jitter); colours the prompt leaves open are drawn at random. uint8 [64, 64, 3]."""
    fg, bg = _colours(ask, rng)
    font, size, dx, dy = images.glyph_style(style).draw(rng)
    return images.render_glyph(ask.char, fg, bg, font=font, size=size, dx=dx, dy=dy)


def true_clip(ask: Ask, rng: np.random.Generator, frames: int = clips.FRAMES, style: str = "varied") -> np.ndarray:
    """A clip of the asked glyph and motion as the training clips draw it in glyph `style` (`clips.glyph_path`).
    uint8 [frames, 64, 64, 3]."""
    fg, bg = _colours(ask, rng)
    font, size, start = clips.glyph_path(clips.clip_style(style), ask.motion, rng, frames)
    return clips.render_clip(ask.char, fg, bg, ask.motion, font=font, size=size, start=start, frames=frames)


def _colours(ask: Ask, rng: np.random.Generator) -> tuple[str, str]:
    if ask.fg is not None and ask.bg is not None:
        return ask.fg, ask.bg
    fg, bg = rng.choice(len(COLOUR_NAMES), size=2, replace=False)
    return COLOUR_NAMES[fg], COLOUR_NAMES[bg]


def render_rng(prompt: str, sample: int) -> np.random.Generator:
    """The random stream of true render `sample` of `prompt`: the same renders on every run and machine."""
    return np.random.default_rng((zlib.crc32(prompt.encode()), sample))


# ---- Tesseract -----------------------------------------------------------------------------------------------------

def require_tesseract() -> str:
    """Tesseract's version, or a MissingExtra naming what to install (checked before a bench does any work)."""
    try:
        import pytesseract
    except ImportError:
        raise MissingExtra("the image judge needs pytesseract: pip install 'specgen[image-eval]'") from None
    try:
        return str(pytesseract.get_tesseract_version())
    except (pytesseract.TesseractNotFoundError, OSError):
        raise MissingExtra("the image judge needs the tesseract program: apt-get install tesseract-ocr") from None


@lru_cache(maxsize=1)
def _pytesseract():
    require_tesseract()
    import pytesseract

    return pytesseract
