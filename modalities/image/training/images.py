"""An offline dataset of 64×64 RGB images with a class name and a short text prompt.

Three sources, all on disk or inside installed packages (nothing is downloaded):

- glyph: A–Z, a–z, 0–9 rendered with PIL from the system TTFs, random palette colours, size and position;
  prompt "red K on blue", class "K".
- digit: scikit-learn's `load_digits()` 8×8 scans upscaled, either grey ("digit 3") or tinted
  ("green digit 3 on black"); class "digit 3".
- photo: random rescaled crops of scikit-image's sample photos; prompt "photo of coffee", class "coffee".

Item i of a (seed, split) is a pure function of (seed, split, i): it has its own random generator, so any slice of
the dataset can be rebuilt without the items before it (this is what makes training resumable on exact data).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

from specgen.errors import InvalidRequest

SIZE = 64
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (240, 220, 40),
    "white": (245, 245, 245), "black": (15, 15, 15), "orange": (245, 140, 30), "purple": (140, 50, 170),
    "cyan": (40, 210, 220), "grey": (128, 128, 128),
}
CHARACTERS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
# Prompt name -> skimage.data loader. Names are single words so they are single condition tokens.
PHOTOS: dict[str, str] = {
    "astronaut": "astronaut", "coffee": "coffee", "cat": "chelsea", "rocket": "rocket", "coins": "coins",
    "horse": "horse", "cameraman": "camera", "moon": "moon", "tissue": "immunohistochemistry",
    "galaxies": "hubble_deep_field", "retina": "retina", "brick": "brick", "grass": "grass", "gravel": "gravel",
    "clock": "clock", "colorwheel": "colorwheel",
}
SOURCES = ("glyph", "digit", "photo")
# Out of every 10 consecutive items: 6 glyphs, 2 digits, 2 photos (fixed, so any N has the same mix).
_SOURCE_PATTERN = ("glyph",) * 6 + ("digit",) * 2 + ("photo",) * 2
FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/truetype/liberation")
_SKIP_FONTS = ("math", "symbol", "cmex", "cmsy", "stix", "extralight")  # no letters, or too thin at 64 px
_DIGITS_VAL = 297  # the last scans of load_digits() are held out for the "val" split
_SPLIT_SALT = {"train": 0, "val": 1}


@dataclass(frozen=True)
class ImageItem:
    image: np.ndarray  # uint8 [64, 64, 3]
    cls: str
    prompt: str
    source: str


@dataclass(frozen=True)
class ImageSet:
    images: np.ndarray  # uint8 [N, 64, 64, 3]
    classes: list[str]
    prompts: list[str]
    sources: list[str]

    def __len__(self) -> int:
        return len(self.images)


@lru_cache(maxsize=1)
def font_files() -> tuple[str, ...]:
    files = sorted(str(p) for d in FONT_DIRS for p in Path(d).glob("*.ttf")
                   if not any(s in p.name.lower() for s in _SKIP_FONTS))
    if not files:
        raise InvalidRequest(f"no TrueType fonts found in {', '.join(FONT_DIRS)} (install fonts-dejavu-core)")
    return tuple(files)


@dataclass(frozen=True)
class GlyphStyle:
    """How glyph items are drawn: which fonts, sizes and offsets from the centre."""
    fonts: tuple[str, ...] = ()  # font file stems; () = every font of font_files()
    sizes: tuple[int, int] = (26, 52)  # smallest and largest size, px
    jitter: int | None = None  # largest offset from the centre, px; None: (64 - size) // 3, so big glyphs stay inside

    def font_files(self) -> tuple[str, ...]:
        found = font_files()
        if not self.fonts:
            return found
        chosen = tuple(f for f in found if Path(f).stem in self.fonts)
        if len(chosen) != len(self.fonts):
            raise InvalidRequest(f"this glyph style needs the fonts {', '.join(self.fonts)}; {len(chosen)} found")
        return chosen

    def draw(self, rng: np.random.Generator) -> tuple[str, int, int, int]:
        """(font file, size, dx, dy) of one glyph, drawn from rng."""
        size = int(rng.integers(self.sizes[0], self.sizes[1] + 1))
        jitter = max(1, (SIZE - size) // 3) if self.jitter is None else self.jitter
        dx, dy = (int(v) for v in rng.integers(-jitter, jitter + 1, size=2))
        fonts = self.font_files()
        return fonts[rng.integers(len(fonts))], size, dx, dy


# "varied" is every font at 26-52 px anywhere in the frame; the narrower styles are distributions a small token model
# learns to draw legibly in fewer steps (docs/image.md, the token model pilots).
GLYPH_STYLES: dict[str, GlyphStyle] = {
    "varied": GlyphStyle(),
    "sans": GlyphStyle(("DejaVuSans-Bold", "DejaVuSans", "LiberationSans-Bold", "LiberationSans-Regular"), (36, 52)),
    "bold": GlyphStyle(("DejaVuSans-Bold",), (44, 48), 2),
    "fixed": GlyphStyle(("DejaVuSans-Bold",), (48, 48), 0),
}


def glyph_style(name: str) -> GlyphStyle:
    if name not in GLYPH_STYLES:
        raise InvalidRequest(f"glyph style must be one of {', '.join(GLYPH_STYLES)}, not {name!r}")
    return GLYPH_STYLES[name]


@lru_cache(maxsize=4096)
def _font(path: str, size: int):
    from PIL import ImageFont

    return ImageFont.truetype(path, size)


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float32) / 16.0, d.target.astype(np.int64)


@cache
def _photo(name: str) -> np.ndarray:
    """The named sample photo as uint8 RGB (grey and binary ones are expanded to three channels)."""
    import skimage.data

    img = np.asarray(getattr(skimage.data, PHOTOS[name])())
    if img.dtype == bool:
        img = img.astype(np.uint8) * 255
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    return np.ascontiguousarray(img[:, :, :3].astype(np.uint8))


def _two_colours(rng: np.random.Generator) -> tuple[str, str]:
    fg, bg = rng.choice(len(PALETTE), size=2, replace=False)
    names = list(PALETTE)
    return names[fg], names[bg]


def render_glyph(char: str, fg: str, bg: str, *, font: str | None = None, size: int = 44,
                 dx: int = 0, dy: int = 0) -> np.ndarray:
    """`char` centred (then shifted by dx, dy) on a 64×64 background, as uint8 [64, 64, 3]."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (SIZE, SIZE), PALETTE[bg])
    f = _font(font or font_files()[0], size)
    left, top, right, bottom = ImageDraw.Draw(img).textbbox((0, 0), char, font=f)
    x = (SIZE - (right - left)) // 2 - left + dx
    y = (SIZE - (bottom - top)) // 2 - top + dy
    ImageDraw.Draw(img).text((x, y), char, fill=PALETTE[fg], font=f)
    return np.asarray(img)


def glyph_item(rng: np.random.Generator, style: str = "varied") -> ImageItem:
    char = CHARACTERS[rng.integers(len(CHARACTERS))]
    fg, bg = _two_colours(rng)
    font, size, dx, dy = glyph_style(style).draw(rng)
    image = render_glyph(char, fg, bg, font=font, size=size, dx=dx, dy=dy)
    return ImageItem(image, char, f"{fg} {char} on {bg}", "glyph")


def digit_item(rng: np.random.Generator, split: str = "train") -> ImageItem:
    from PIL import Image

    scans, labels = _digits()
    lo, hi = (0, len(scans) - _DIGITS_VAL) if split == "train" else (len(scans) - _DIGITS_VAL, len(scans))
    k = int(rng.integers(lo, hi))
    side = int(rng.integers(40, SIZE + 1))
    ink = np.asarray(Image.fromarray(scans[k]).resize((side, side), Image.BILINEAR))
    canvas = np.zeros((SIZE, SIZE), np.float32)
    x, y = (int(v) for v in rng.integers(0, SIZE - side + 1, size=2))
    canvas[y:y + side, x:x + side] = np.clip(ink, 0.0, 1.0)
    label = int(labels[k])
    if rng.random() < 0.5:  # the scans' own look: white ink on black
        fg, bg, prompt = PALETTE["white"], PALETTE["black"], f"digit {label}"
    else:
        fg_name, bg_name = _two_colours(rng)
        fg, bg, prompt = PALETTE[fg_name], PALETTE[bg_name], f"{fg_name} digit {label} on {bg_name}"
    fg, bg = np.array(fg, np.float32), np.array(bg, np.float32)
    image = bg + (fg - bg) * canvas[:, :, None]
    return ImageItem(np.rint(image).astype(np.uint8), f"digit {label}", prompt, "digit")


def photo_item(rng: np.random.Generator) -> ImageItem:
    from PIL import Image

    names = list(PHOTOS)
    name = names[rng.integers(len(names))]
    photo = _photo(name)
    h, w = photo.shape[:2]
    # Log-uniform crop side between 64 px (full detail) and the whole short side (the whole scene).
    side = int(np.exp(rng.uniform(np.log(SIZE), np.log(min(h, w)))))
    y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
    crop = Image.fromarray(photo[y:y + side, x:x + side])
    if side != SIZE:
        crop = crop.resize((SIZE, SIZE), Image.BILINEAR, reducing_gap=2.0)
    return ImageItem(np.asarray(crop), name, f"photo of {name}", "photo")


def make_item(index: int, seed: int = 0, split: str = "train", style: str = "varied") -> ImageItem:
    """Item `index` of the dataset (seed, split), glyphs in `style`; the source follows the fixed 6:2:2 pattern."""
    if split not in _SPLIT_SALT:
        raise InvalidRequest(f"split must be 'train' or 'val', not {split!r}")
    if index < 0:
        raise InvalidRequest(f"item index must be >= 0, not {index}")
    rng = np.random.default_rng((seed, _SPLIT_SALT[split], index))
    source = _SOURCE_PATTERN[index % len(_SOURCE_PATTERN)]
    if source == "glyph":
        return glyph_item(rng, style)
    if source == "digit":
        return digit_item(rng, split)
    return photo_item(rng)


def make_dataset(n: int, seed: int = 0, split: str = "train", start: int = 0, style: str = "varied") -> ImageSet:
    """Items start .. start+n-1 of the dataset (seed, split), glyphs in `style`, stacked."""
    if n < 0:
        raise InvalidRequest(f"dataset size must be >= 0, not {n}")
    items = [make_item(i, seed, split, style) for i in range(start, start + n)]
    images = np.stack([it.image for it in items]) if items else np.zeros((0, SIZE, SIZE, 3), np.uint8)
    return ImageSet(images, [it.cls for it in items], [it.prompt for it in items], [it.source for it in items])


def source_items(source: str, n: int, seed: int = 0, split: str = "val") -> ImageSet:
    """n items of one source only (for per-source evaluation), taken from the mixed stream in order."""
    if source not in SOURCES:
        raise InvalidRequest(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    offsets = [k for k, s in enumerate(_SOURCE_PATTERN) if s == source]
    period = len(_SOURCE_PATTERN)
    indices = [(j // len(offsets)) * period + offsets[j % len(offsets)] for j in range(n)]
    items = [make_item(i, seed, split) for i in indices]
    return ImageSet(np.stack([it.image for it in items]), [it.cls for it in items], [it.prompt for it in items],
                    [it.source for it in items])
