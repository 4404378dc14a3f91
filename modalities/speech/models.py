"""The speech token models: text (characters or phonemes) in, acoustic tokens out, as plain `LlamaForCausalLM`s.

Two sequence layouts (`SpeechVocab.layout`):
- `prefix`: [BOS, voice, text characters, BOA, acoustic tokens, EOS]; the model must find the alignment itself.
- `interleaved`: [BOS, voice, text characters, BOA, c1, frames of c1, c2, frames of c2, ..., cn, frames, EOS]:
  each character is spoken again at the frame where it starts (durations: `training/alignment.py`), so the model always
  sees which character it is saying. While generating, `SpokenInOrder` allows only the text's next character
  (or a frame, or EOS after the last character's frames), so the model chooses *when* to move on, never *where*.
The text is read as characters, or as phonemes (`SpeechVocab.units`, `phonemes.py`: espeak-ng's transcription,
one unit per sound and punctuation mark; the unit list is the model's `vocab.json` "chars"), and the "characters"
of both layouts are then those units. Acoustic tokens keep their codebook ids (0 .. num_tokens-1); the special
tokens, the voice tokens and the characters follow them. The loss is taken on everything after BOA. Shipped models
live in `assets/speech/{codec,target,draft}` (`SPECGEN_ASSETS` overrides the assets folder as it does for text and
image); each model folder carries its `vocab.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from specgen.errors import InvalidRequest, ModelNotFound

SPECIALS = ("bos", "boa", "eos", "pad")
LAYOUTS = ("prefix", "interleaved")
UNITS = ("characters", "phonemes")  # what the text is read as (`phonemes.py` for the second)
MAX_POSITIONS = 1024
MAX_TEXT_CHARS = 200
DEFAULT_VOICE = "slt"
# The model's example request (the demo's first text), and with it the sentences `auto`'s calibration measures each
# candidate on, none of them a bench prompt: a short run from each, so a candidate's acceptance and measured speedup
# rest neither on one sentence nor on whichever request came first (one run of `sd` read 0.98-1.02x plain decoding
# where it runs 1.1-1.3x on most sentences, and auto then decoded every speech request plainly)
EXAMPLE_TEXT = "The quick brown fox jumps over the lazy dog."
CALIBRATION_TEXTS = ("She opened the window, and the cold air filled the room.",
                     "Please call me back when you get this message.",
                     "Seven tired sailors rowed slowly toward the harbour lights.")
# role -> LlamaConfig fields (untied heads: the input table mixes characters and acoustic tokens).
ARCHITECTURES = {
    "target": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=6, num_attention_heads=4,
                   num_key_value_heads=4),
    "draft": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4),
}


def _normalise(text: str) -> str:
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u2014", "-")
    return " ".join(text.lower().split())


@dataclass(frozen=True)
class SpeechVocab:
    num_tokens: int  # acoustic tokens are ids 0 .. num_tokens-1
    voices: tuple[str, ...]
    chars: str | tuple[str, ...]  # the text units: characters, or phoneme symbols when units == "phonemes"
    layout: str = "prefix"  # or "interleaved" (module docstring)
    units: str = "characters"

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise InvalidRequest(f"speech layout must be one of {', '.join(LAYOUTS)}, not {self.layout!r}")
        if self.units not in UNITS:
            raise InvalidRequest(f"speech text units must be one of {', '.join(UNITS)}, not {self.units!r}")

    @property
    def char_base(self) -> int:
        return self.num_tokens + len(SPECIALS) + len(self.voices)

    @property
    def bos(self) -> int:
        return self.num_tokens

    @property
    def boa(self) -> int:
        return self.num_tokens + 1

    @property
    def eos(self) -> int:
        return self.num_tokens + 2

    @property
    def pad(self) -> int:
        return self.num_tokens + 3

    @property
    def vocab_size(self) -> int:
        return self.num_tokens + len(SPECIALS) + len(self.voices) + len(self.chars)

    def voice_id(self, voice: str) -> int:
        if voice not in self.voices:
            raise InvalidRequest(f"unknown voice {voice!r}; choose from: {', '.join(self.voices)}")
        return self.num_tokens + len(SPECIALS) + self.voices.index(voice)

    def char_ids(self, text: str) -> list[int]:
        """The text's unit ids: one per character, or per phoneme and punctuation mark."""
        from specgen.modalities.speech.voices import ALPHABET

        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("the text to speak is empty")
        text = _normalise(text)
        readable = self.chars if self.units == "characters" else ALPHABET
        bad = sorted({c for c in text if c not in readable})
        if bad:
            marks = "".join(c for c in readable if not c.isalnum() and c != " ")
            raise InvalidRequest(f"the text has characters the speech model cannot read: {''.join(bad)!r}; "
                                 f"use letters, digits, spaces and {marks!r}")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidRequest(f"the text has {len(text)} characters; at most {MAX_TEXT_CHARS} fit")
        units = text if self.units == "characters" else self._phonemes(text)
        return [self.char_base + self.chars.index(c) for c in units]

    def _phonemes(self, text: str) -> list[str]:
        from specgen.modalities.speech import phonemes

        units = phonemes.fit_to_inventory(phonemes.text_units(text), self.chars)
        if not units:
            raise InvalidRequest(f"none of the sounds of {text!r} is in the speech model's phoneme inventory")
        return units

    def prompt_ids(self, text: str, voice: str = DEFAULT_VOICE) -> torch.Tensor:
        """[BOS, voice, characters, BOA] as int64."""
        return torch.tensor([self.bos, self.voice_id(voice), *self.char_ids(text), self.boa], dtype=torch.long)

    def sequence(self, text: str, voice: str, frames, durations=None) -> tuple[list[int], int]:
        """A training sequence in this layout and its prompt length. frames: the acoustic tokens; durations: the
        frames of each character (interleaved layout only; they must sum to len(frames))."""
        prompt = self.prompt_ids(text, voice).tolist()
        frames = [int(f) for f in frames]
        if self.layout == "prefix":
            return prompt + frames + [self.eos], len(prompt)
        chars = prompt[2:-1]  # [BOS, voice, characters, BOA]: the text read once, not again
        if durations is None or len(durations) != len(chars) or sum(durations) != len(frames) or min(durations) < 1:
            raise InvalidRequest("the interleaved layout needs one duration >= 1 per character, summing to the frames")
        body, at = [], 0
        for char, count in zip(chars, durations):
            body += [char, *frames[at:at + int(count)]]
            at += int(count)
        return prompt + body + [self.eos], len(prompt)

    def acoustic(self, tokens) -> list[int]:
        """The acoustic tokens of a generated sequence (characters and EOS dropped)."""
        return [int(t) for t in tokens if int(t) < self.num_tokens]

    def acoustic_tags(self, tokens, tags) -> list:
        """Per-token tags (pcg's groups) of the acoustic tokens only, aligned with `acoustic(tokens)`."""
        return [tag for t, tag in zip(tokens, tags) if int(t) < self.num_tokens]

    def to_dict(self) -> dict:
        return {"num_tokens": self.num_tokens, "voices": list(self.voices), "chars": self.chars,
                "layout": self.layout, "units": self.units, "specials": {s: getattr(self, s) for s in SPECIALS},
                "vocab_size": self.vocab_size}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> SpeechVocab:
        path = Path(path)
        if path.is_dir():
            path = path / "vocab.json"
        if not path.exists():
            raise ModelNotFound(f"no speech vocabulary at {str(path)!r}")
        d = json.loads(path.read_text())
        units = str(d.get("units", "characters"))
        chars = str(d["chars"]) if units == "characters" else tuple(d["chars"])
        return cls(num_tokens=int(d["num_tokens"]), voices=tuple(d["voices"]), chars=chars,
                   layout=str(d.get("layout", "prefix")), units=units)


def default_vocab(num_tokens: int = 1024, layout: str = "prefix", inventory: tuple[str, ...] | None = None
                  ) -> SpeechVocab:
    """The corpus voices with characters, or with a phoneme inventory (`phonemes.inventory`) when given."""
    from specgen.modalities.speech.voices import ALPHABET, VOICES

    if inventory:
        return SpeechVocab(num_tokens=num_tokens, voices=tuple(VOICES), chars=tuple(inventory), layout=layout,
                           units="phonemes")
    return SpeechVocab(num_tokens=num_tokens, voices=tuple(VOICES), chars=ALPHABET, layout=layout)


def assets_dir() -> Path:
    from specgen.modalities.assets import assets_dir as root

    return root() / "speech"


def default_paths() -> dict[str, Path]:
    base = assets_dir()
    return {"codec": base / "codec", "target": base / "target", "draft": base / "draft"}


def speech_model_config(role: str, vocab: SpeechVocab, **overrides):
    from transformers import LlamaConfig

    if role not in ARCHITECTURES:
        raise InvalidRequest(f"speech model role must be one of {', '.join(ARCHITECTURES)}, not {role!r}")
    fields = {**ARCHITECTURES[role], **overrides}
    return LlamaConfig(vocab_size=vocab.vocab_size, max_position_embeddings=fields.pop("max_position_embeddings",
                                                                                      MAX_POSITIONS),
                       rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       bos_token_id=vocab.bos, eos_token_id=vocab.eos, pad_token_id=vocab.pad,
                       tie_word_embeddings=False, **fields)


def build_speech_lm(role: str, vocab: SpeechVocab, **overrides):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(speech_model_config(role, vocab, **overrides))


def _require(path: str | Path, what: str, files: tuple[str, ...]) -> Path:
    path = Path(path)
    if not path.is_dir() or not all((path / f).exists() for f in files):
        raise ModelNotFound(f"no speech {what} in {str(path)!r} (expected {', '.join(files)}); train it with "
                            "`python -m specgen.modalities.speech.training.recipe`")
    return path


def load_speech_vocab(path: str | Path) -> SpeechVocab:
    path = Path(path)
    return SpeechVocab.load(path if path.suffix == ".json" else _require(path, "vocabulary", ("vocab.json",)))


def load_speech_lm(path: str | Path, dtype=torch.float32):
    """The `LlamaForCausalLM` saved in folder `path`, in eval mode."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    path = _require(path, "token model", ("config.json", "model.safetensors", "vocab.json"))
    hf_logging.disable_progress_bar()
    return LlamaForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).eval()
