"""The token layout shared by the image token models and their decoders.

A sequence is [BOS, condition words padded with PAD to prefix_length, BOI, grid*grid image codes]. Image codes
keep their VQ ids (0 .. num_codes-1); the special tokens and the condition words follow them. The unconditional
prompt has NULL in every condition slot, so a conditional and an unconditional row have the same length and
classifier-free guidance can run them side by side in one batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from specgen.errors import InvalidRequest, ModelNotFound

SPECIALS = ("bos", "boi", "null", "pad")
VIDEO_EXAMPLE_PROMPTS = ("red K moving right on blue", "white A moving down on black",
                         "yellow g moving left on purple", "black 7 moving up on orange", "K moving right",
                         "green Q moving left on white")
EXAMPLE_PROMPTS = (
    "red K on blue", "white A on black", "yellow g on purple", "black 7 on orange", "K", "digit 3",
    "green digit 5 on black", "photo of coffee", "photo of astronaut", "photo of cat",
)


def _normalise(word: str) -> str:
    # Single characters are classes of their own (K and k differ); longer words are case-insensitive.
    return word if len(word) == 1 else word.lower()


@dataclass(frozen=True)
class ImageVocab:
    num_codes: int  # image tokens are ids 0 .. num_codes-1
    words: tuple[str, ...]  # condition words (colours, characters, "digit", "photo", "of", "on", photo names, ...)
    prefix_length: int  # fixed number of condition tokens (padded with PAD)
    grid: int = 16  # tokens per side: an image is grid*grid tokens in raster order
    frames: int = 1  # a video is `frames` images one after another

    @property
    def bos(self) -> int:
        return self.num_codes

    @property
    def boi(self) -> int:
        return self.num_codes + 1

    @property
    def null(self) -> int:
        return self.num_codes + 2

    @property
    def pad(self) -> int:
        return self.num_codes + 3

    @property
    def vocab_size(self) -> int:
        return self.num_codes + len(SPECIALS) + len(self.words)

    @property
    def frame_tokens(self) -> int:
        return self.grid * self.grid

    @property
    def image_tokens(self) -> int:
        """Codes generated per request: one image, or every frame of a video."""
        return self.frames * self.grid * self.grid

    @property
    def prompt_length(self) -> int:
        """Tokens before the first image code: BOS, the condition slots and BOI."""
        return self.prefix_length + 2

    @property
    def sequence_length(self) -> int:
        return self.prompt_length + self.image_tokens

    def word_id(self, word: str) -> int:
        index = self._index().get(_normalise(word))
        if index is None:
            examples = ", ".join(repr(p) for p in EXAMPLE_PROMPTS[:4])
            raise InvalidRequest(f"unknown word {word!r} in the image prompt; prompts use colours, letters, digits "
                                 f"and photo names, e.g. {examples}")
        return self.num_codes + len(SPECIALS) + index

    def condition_ids(self, prompt: str) -> list[int]:
        """The condition word ids of `prompt` (no BOS/BOI, no padding)."""
        words = prompt.split()
        if not words:
            raise InvalidRequest("the image prompt is empty; give e.g. 'red K on blue' or 'photo of coffee'")
        if len(words) > self.prefix_length:
            raise InvalidRequest(f"the image prompt has {len(words)} words; at most {self.prefix_length} fit")
        return [self.word_id(w) for w in words]

    def prompt_ids(self, prompt: str) -> torch.Tensor:
        """[BOS, condition tokens padded to prefix_length, BOI] as int64."""
        ids = self.condition_ids(prompt)
        return torch.tensor([self.bos, *ids, *[self.pad] * (self.prefix_length - len(ids)), self.boi],
                            dtype=torch.long)

    def uncond_ids(self) -> torch.Tensor:
        """[BOS, NULL * prefix_length, BOI]: the same length as any prompt, so CFG rows align."""
        return torch.tensor([self.bos, *[self.null] * self.prefix_length, self.boi], dtype=torch.long)

    def words_of(self, ids) -> list[str]:
        """Condition words back from ids (specials are skipped, image codes raise)."""
        base = self.num_codes + len(SPECIALS)
        out = []
        for i in (int(v) for v in ids):
            if i < self.num_codes or i >= self.vocab_size:
                raise InvalidRequest(f"token {i} is not a condition token")
            if i >= base:
                out.append(self.words[i - base])
        return out

    def _index(self) -> dict[str, int]:
        cached = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {w: k for k, w in enumerate(self.words)}
            object.__setattr__(self, "_index_cache", cached)  # frozen dataclass: cache outside the fields
        return cached

    def to_dict(self) -> dict:
        return {"num_codes": self.num_codes, "words": list(self.words), "prefix_length": self.prefix_length,
                "grid": self.grid, "frames": self.frames, "specials": {s: getattr(self, s) for s in SPECIALS}}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ImageVocab:
        path = Path(path)
        if path.is_dir():
            path = path / "vocab.json"
        if not path.exists():
            raise ModelNotFound(f"no image vocabulary at {str(path)!r}")
        d = json.loads(path.read_text())
        return cls(num_codes=int(d["num_codes"]), words=tuple(d["words"]), prefix_length=int(d["prefix_length"]),
                   grid=int(d.get("grid", 16)), frames=int(d.get("frames", 1)))
