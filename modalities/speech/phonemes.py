"""Phonemes for the speech models: English text to espeak-ng's phoneme symbols, one unit per sound.

A model reading letters must also learn English spelling ("though", "rough", "knight") from a few thousand
sentences; a model reading phonemes only has to learn how each sound is spoken. espeak-ng (already a corpus voice)
gives each word's phonemes offline as Kirshenbaum-style symbols (`T_r_'u:` for "through"), the ones
`espeak-ng -q -x --sep=_ -v en-us` prints. Stress marks (`'` primary, `,` secondary) are dropped: the units are
sounds only. The punctuation marks `,.?!-` stay as units of their own (a pause, or the sentence's end). Every voice,
flite's included, is transcribed with espeak-ng's US English, so a unit names a sound class, not a voice's exact sound.

Where the transcription comes from (`SPECGEN_ESPEAK`, read whenever new words are transcribed):
- `auto` (default): libespeak-ng from the `espeakng-loader` wheel, called in-process through ctypes, so a pip
  install alone speaks; the espeak-ng program on PATH only when that library cannot be loaded.
- `library`: the wheel's library only. `binary`: the espeak-ng program only (one call for all new words).
Both give the same symbols for every word of the shipped corpus (they differ only in stress marks, which are
dropped: the program stresses a function word spoken alone, "and" -> `'a_n_d`, the library does not).

Words are transcribed once each (a process-wide lexicon). A symbol the model's inventory lacks (a rare espeak
variant) is replaced by its letters-only form when the inventory has that, and dropped otherwise.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import threading

from specgen import settings
from specgen.errors import InvalidRequest, MissingExtra, SpecgenError

ESPEAK_VOICE = "en-us"
BACKEND_ENV = "SPECGEN_ESPEAK"
BACKENDS = ("auto", "library", "binary")
PUNCTUATION = ",.?!-"
_TOKEN = re.compile(r"[a-z0-9']+|[,.?!-]")
_STRESS = str.maketrans("", "", "',")
_LEXICON: dict[str, tuple[str, ...]] = {}

# speak_lib.h: synchronous output with no audio device; don't exit() the process when the data is missing;
# phoneme mode = ASCII names (bit 1 clear) with the separator character in bits 8-23, as `-x --sep=_` prints.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_PHONEMES_ASCII_SEP = ord("_") << 8
_lock = threading.Lock()  # libespeak-ng keeps one global translator: not reentrant
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None


class EspeakFailed(SpecgenError):
    """The espeak-ng program ran and failed (a broken install): one line, not a subprocess traceback."""


def _load_library() -> ctypes.CDLL:
    """The wheel's libespeak-ng, initialised with US English (call with _lock held)."""
    try:
        import espeakng_loader
    except ImportError:
        raise MissingExtra("the espeakng-loader package is not installed (pip install espeakng-loader)") from None
    try:
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        data = espeakng_loader.get_data_path()
    except (OSError, RuntimeError) as exc:
        raise MissingExtra(f"libespeak-ng from espeakng-loader cannot be loaded: {exc}") from None
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
    lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
    if lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data.encode(), _INITIALIZE_DONT_EXIT) <= 0:
        raise MissingExtra(f"libespeak-ng cannot read its data at {data}")
    if lib.espeak_SetVoiceByName(ESPEAK_VOICE.encode()) != 0:
        raise MissingExtra(f"libespeak-ng has no {ESPEAK_VOICE} voice in {data}")
    return lib


def _library() -> ctypes.CDLL:
    """The initialised library, loaded at the first call of the process; a failure is remembered, not retried."""
    global _lib, _lib_error
    with _lock:
        if _lib is None and _lib_error is None:
            try:
                _lib = _load_library()
            except MissingExtra as exc:
                _lib_error = str(exc)
        if _lib is None:
            raise MissingExtra(_lib_error)
        return _lib


def _espeak_library(words: list[str]) -> list[str]:
    lib = _library()
    lines = []
    with _lock:
        for word in words:
            text = ctypes.create_string_buffer(word.encode())
            cursor = ctypes.c_void_p(ctypes.addressof(text))
            clauses = []
            while cursor.value:  # one clause per call; the library moves the cursor on, to NULL at the end
                clause = lib.espeak_TextToPhonemes(ctypes.byref(cursor), _CHARS_UTF8, _PHONEMES_ASCII_SEP)
                if clause is None:  # undecodable text: the cursor did not move
                    break
                clauses.append(clause)
            lines.append(b" ".join(clauses).decode())
    return lines


def _espeak_binary(words: list[str]) -> list[str]:
    """One espeak-ng call, one word a line; [] when the output lines do not match up with the words."""
    if shutil.which("espeak-ng") is None:
        raise MissingExtra("phoneme input needs libespeak-ng (pip install espeakng-loader) or the espeak-ng program "
                           "(apt-get install espeak-ng)")
    try:
        done = subprocess.run(["espeak-ng", "-q", "-x", "--sep=_", "-v", ESPEAK_VOICE],
                              input="\n".join(words) + "\n", capture_output=True, text=True)
    except OSError as exc:
        raise EspeakFailed(f"the espeak-ng program cannot run: {exc}") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise EspeakFailed(f"the espeak-ng program failed (exit {done.returncode}: {reason}); "
                           f"unset {BACKEND_ENV} to use the bundled libespeak-ng")
    return done.stdout.split("\n")[:len(words)] if done.stdout.count("\n") == len(words) else []


def _espeak(words: list[str]) -> list[str]:
    """Each word's espeak-ng line from the backend `SPECGEN_ESPEAK` names (module docstring)."""
    backend = settings.get(BACKEND_ENV).lower()
    if backend not in BACKENDS:
        raise InvalidRequest(f"{BACKEND_ENV} must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if backend == "binary":
        return _espeak_binary(words)
    try:
        return _espeak_library(words)
    except MissingExtra as exc:
        if backend == "library" or shutil.which("espeak-ng") is None:
            raise MissingExtra(f"phoneme input needs libespeak-ng or the espeak-ng program (apt-get install "
                               f"espeak-ng): {exc}") from None
    return _espeak_binary(words)


def _symbols(line: str) -> tuple[str, ...]:
    """'l_'aI_f I_z' -> ('l', 'aI', 'f', 'I', 'z'): stress dropped, word gaps dropped."""
    return tuple(s for chunk in line.split() for s in (p.translate(_STRESS) for p in chunk.split("_")) if s)


def transcribe(words: list[str]) -> dict[str, tuple[str, ...]]:
    """Each word's phonemes, from the lexicon or from espeak-ng for the new ones (the program: one call, one word a
    line; when the lines do not match up, one call per word). A word without sounds (a lone apostrophe) gets none."""
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
    """Every text's units, its new words transcribed in one batch."""
    transcribe([t for text in texts for t in _TOKEN.findall(text) if t not in PUNCTUATION])
    return [text_units(text) for text in texts]


def inventory(units) -> tuple[str, ...]:
    """The sorted units of a corpus' unit lists (punctuation marks always included)."""
    return tuple(sorted({u for seq in units for u in seq} | set(PUNCTUATION)))
