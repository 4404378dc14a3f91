"""Phonemes for the speech models: English text to espeak-ng's phoneme symbols, one unit per sound.

A model reading letters must also learn English spelling ("though", "rough", "knight") from a few thousand
sentences; a model reading phonemes only has to learn how each sound is spoken. espeak-ng (already a corpus voice)
gives each word's phonemes offline: `espeak-ng -q -x --sep=_ -v en-us` writes Kirshenbaum-style symbols
(`T_r_'u:` for "through"). Stress marks (`'` primary, `,` secondary) are dropped: the units are sounds only.
The punctuation marks `,.?!-` stay as units of their own (a pause, or the sentence's end). Every voice, flite's
included, is transcribed with espeak-ng's US English, so a unit names a sound class, not a voice's exact sound.

Words are transcribed once each (a process-wide lexicon; one espeak-ng call for a whole list of new words).
A symbol the model's inventory lacks (a rare espeak variant) is replaced by its letters-only form when the
inventory has that, and dropped otherwise.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from specgen.errors import InvalidRequest, MissingExtra

ESPEAK_VOICE = "en-us"
PUNCTUATION = ",.?!-"
_TOKEN = re.compile(r"[a-z0-9']+|[,.?!-]")
_STRESS = str.maketrans("", "", "',")
_LEXICON: dict[str, tuple[str, ...]] = {}


def _espeak(lines: list[str]) -> list[str]:
    if shutil.which("espeak-ng") is None:
        raise MissingExtra("phoneme input needs espeak-ng (apt-get install espeak-ng)")
    done = subprocess.run(["espeak-ng", "-q", "-x", "--sep=_", "-v", ESPEAK_VOICE], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, check=True)
    return done.stdout.split("\n")[:len(lines)] if done.stdout.count("\n") == len(lines) else []  # one a word


def _symbols(line: str) -> tuple[str, ...]:
    """'l_'aI_f I_z' -> ('l', 'aI', 'f', 'I', 'z'): stress dropped, word gaps dropped."""
    return tuple(s for chunk in line.split() for s in (p.translate(_STRESS) for p in chunk.split("_")) if s)


def transcribe(words: list[str]) -> dict[str, tuple[str, ...]]:
    """Each word's phonemes, from the lexicon or from one espeak-ng call for the new ones (one word a line; when
    the lines do not match up, one call per word). A word without sounds (a lone apostrophe) gets none."""
    new = sorted({w for w in words if w not in _LEXICON})
    if new:
        lines = _espeak(new)
        if len(lines) != len(new):
            lines = [" ".join(_espeak([w])) for w in new]
        _LEXICON.update((w, _symbols(line)) for w, line in zip(new, lines))
    return {w: _LEXICON[w] for w in words}


def text_units(text: str) -> list[str]:
    """Normalised text -> its phonemes and punctuation marks, in order."""
    tokens = _TOKEN.findall(text)
    words = transcribe([t for t in tokens if t not in PUNCTUATION])
    units = [u for t in tokens for u in ((t,) if t in PUNCTUATION else words[t])]
    if not any(u not in PUNCTUATION for u in units):
        raise InvalidRequest(f"the text {text!r} has no sounds to speak")
    return units


def fit_to_inventory(units: list[str], inventory) -> list[str]:
    """Units the inventory lacks become their letters-only form ('a#' -> 'a') when it has that; else dropped."""
    known = set(inventory)
    out = []
    for unit in units:
        if unit not in known:
            unit = re.sub(r"[^A-Za-z@]", "", unit)
        if unit in known:
            out.append(unit)
    return out


def corpus_units(texts) -> list[list[str]]:
    """Every text's units, its words transcribed in one espeak-ng call."""
    transcribe([t for text in texts for t in _TOKEN.findall(text) if t not in PUNCTUATION])
    return [text_units(text) for text in texts]


def inventory(units) -> tuple[str, ...]:
    """The sorted units of a corpus' unit lists (punctuation marks always included)."""
    return tuple(sorted({u for seq in units for u in seq} | set(PUNCTUATION)))
