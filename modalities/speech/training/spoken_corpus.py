"""An offline speech corpus: short English sentences spoken by espeak-ng's and flite's voices, as 16 kHz WAV.

    python -m specgen.modalities.speech.training.spoken_corpus --out runs/speech-corpus --sentences 3600
    python -m specgen.modalities.speech.training.spoken_corpus --out runs/speech-ci --sentences 24   # the test subset

Sentences come from the Debian `fortunes` files (one sentence per cookie line, lower-cased, 15-70 characters of
letters, digits, spaces and `,.'?!-`); without them, from the comments and docstrings of Python's standard library.
Sentence i of a (seed) is always the same sentence, and it is spoken by voice `i % len(voices)`, so every voice
covers the same kinds of text. The folder holds `wav/ID.wav`, `manifest.jsonl` (one line per utterance, flushed
as it is written: a rerun skips the ids already there, so a killed run loses nothing) and `corpus.json` (counts,
hours, bytes and synthesis speed per engine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from specgen.errors import InvalidRequest, MissingExtra
from specgen.modalities.speech.voices import ALPHABET, VOICES

SAMPLE_RATE = 16000
MIN_CHARS, MAX_CHARS = 15, 70
FORTUNE_DIR = Path("/usr/share/games/fortunes")
_SILENCE = 0.01  # trim leading/trailing samples below this amplitude, keeping 50 ms around the speech
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Utterance:
    id: str
    text: str
    voice: str
    file: str  # relative to the corpus folder
    seconds: float
    synth_s: float


def normalise(text: str) -> str:
    """Lower case, single spaces, typographic quotes and dashes folded to ASCII."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u2014", "-").replace("--", " - ")
    return " ".join(text.lower().split())


def is_speakable(text: str, min_chars: int = MIN_CHARS, max_chars: int = MAX_CHARS) -> bool:
    return (min_chars <= len(text) <= max_chars and all(c in ALPHABET for c in text)
            and sum(c.isalpha() for c in text) >= 0.6 * len(text) and not text.startswith(("-", "'")))


def _fortune_texts() -> list[str]:
    if not FORTUNE_DIR.is_dir():
        return []
    out = []
    for path in sorted(FORTUNE_DIR.iterdir()):
        if path.suffix in (".dat", ".u8") or not path.is_file():
            continue
        out += path.read_text(errors="ignore").split("\n%\n")
    return out


def _stdlib_texts() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py")):
        for line in path.read_text(errors="ignore").splitlines():
            line = line.strip().lstrip("#").strip()
            if line and not line.startswith(("def ", "class ", "import ", "from ")):
                out.append(line)
    return out


@lru_cache(maxsize=4)
def all_sentences(source: str = "auto") -> tuple[str, ...]:
    """Every distinct speakable sentence of the source ('fortunes', 'stdlib' or 'auto': fortunes when installed),
    in a fixed order."""
    if source not in ("auto", "fortunes", "stdlib"):
        raise InvalidRequest(f"sentence source must be auto, fortunes or stdlib, not {source!r}")
    texts = _fortune_texts() if source in ("auto", "fortunes") else []
    if not texts and source == "fortunes":
        raise MissingExtra(f"no fortunes in {FORTUNE_DIR} (apt-get install fortunes)")
    if not texts:
        texts = _stdlib_texts()
    found = set()
    for block in texts:
        for sentence in _SENTENCE.split(" ".join(block.split())):
            sentence = normalise(sentence)
            if is_speakable(sentence):
                found.add(sentence)
    return tuple(sorted(found))


def sentences(n: int, seed: int = 0, source: str = "auto") -> list[str]:
    """The first n sentences of the corpus order for `seed` (a seeded shuffle of `all_sentences`)."""
    pool = list(all_sentences(source))
    random.Random(seed).shuffle(pool)
    if n > len(pool):
        raise InvalidRequest(f"only {len(pool)} sentences are available, {n} asked for")
    return pool[:n]


def engine_available(engine: str) -> bool:
    return shutil.which(engine) is not None


def _trim(audio: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(audio) > _SILENCE)
    if len(loud) == 0:
        return audio
    margin = SAMPLE_RATE // 20
    return audio[max(0, loud[0] - margin):loud[-1] + margin]


def synthesise(text: str, voice: str) -> np.ndarray:
    """float32 mono audio at 16 kHz of `text` spoken by `voice`, leading and trailing silence trimmed."""
    import soundfile as sf

    if voice not in VOICES:
        raise InvalidRequest(f"unknown voice {voice!r}; choose from: {', '.join(VOICES)}")
    engine, arg = VOICES[voice]
    if not engine_available(engine):
        raise MissingExtra(f"{engine} is not installed (apt-get install {engine})")
    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "out.wav")
        if engine == "flite":
            cmd = ["flite", "-voice", arg, "-t", text, "-o", wav]
        else:  # `--` first: a text such as "-- Emerson" would otherwise parse as options
            cmd = ["espeak-ng", "-v", arg, "-w", wav, "--", text]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        audio, rate = sf.read(wav, dtype="float32", always_2d=False)
    if audio.ndim > 1:
        audio = audio.mean(axis=1)
    if rate != SAMPLE_RATE:
        import torch
        import torchaudio.functional as AF

        audio = AF.resample(torch.from_numpy(audio), rate, SAMPLE_RATE).numpy()
    return _trim(audio).astype(np.float32)


def read_manifest(folder: str | Path) -> list[Utterance]:
    """The utterances of a corpus folder; a last line cut short by a kill is ignored."""
    path = Path(folder) / "manifest.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(Utterance(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return out


def build_corpus(folder: str | Path, n: int, *, voices: tuple[str, ...] = tuple(VOICES), seed: int = 0,
                 source: str = "auto", progress: bool = True, start: int = 0) -> dict:
    """Synthesise sentences start..n-1 into `folder` (resuming), then write and return corpus.json's summary.
    start > 0 makes an evaluation set of sentences no model trained on a corpus of `start` sentences has seen."""
    import soundfile as sf

    folder = Path(folder)
    unknown = [v for v in voices if v not in VOICES]
    if unknown or not voices:
        raise InvalidRequest(f"unknown voice(s) {', '.join(unknown) or '(none given)'}; "
                             f"choose from: {', '.join(VOICES)}")
    if not 0 <= start < n:
        raise InvalidRequest(f"--start must be in [0, {n}), got {start}")
    for engine in sorted({VOICES[v][0] for v in voices}):
        if not engine_available(engine):
            raise MissingExtra(f"{engine} is not installed (apt-get install {engine})")
    (folder / "wav").mkdir(parents=True, exist_ok=True)
    done = {u.id for u in read_manifest(folder)}
    manifest = folder / "manifest.jsonl"
    if manifest.exists():  # drop a torn last line so appends start on a fresh line
        lines = [ln for ln in manifest.read_text().splitlines() if _parses(ln)]
        manifest.write_text("".join(f"{ln}\n" for ln in lines))
    texts = sentences(n, seed, source)
    started = time.monotonic()
    with open(manifest, "a") as f:
        for i, text in enumerate(texts):
            uid = f"{seed}-{i:05d}"
            if uid in done or i < start:
                continue
            voice = voices[i % len(voices)]
            t0 = time.perf_counter()
            audio = synthesise(text, voice)
            synth_s = time.perf_counter() - t0
            rel = f"wav/{uid}.wav"
            sf.write(folder / rel, audio, SAMPLE_RATE, subtype="PCM_16")
            u = Utterance(uid, text, voice, rel, round(len(audio) / SAMPLE_RATE, 4), round(synth_s, 4))
            f.write(json.dumps(u.__dict__) + "\n")
            f.flush()
            os.fsync(f.fileno())
            if progress and (i + 1) % 100 == 0:
                print(f"{i + 1}/{n} utterances, {time.monotonic() - started:.0f} s", file=sys.stderr)
    return summarise(folder, seed=seed, source=source)


def _parses(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


def summarise(folder: str | Path, **extra) -> dict:
    """Counts, duration, bytes and synthesis speed (real-time factor per engine), written to corpus.json."""
    folder = Path(folder)
    utts = read_manifest(folder)
    per_engine: dict[str, list[float]] = {}
    for u in utts:
        e = per_engine.setdefault(VOICES[u.voice][0], [0.0, 0.0, 0])
        e[0] += u.seconds
        e[1] += u.synth_s
        e[2] += 1
    summary = {
        "utterances": len(utts), "hours": round(sum(u.seconds for u in utts) / 3600, 3),
        "bytes": sum((folder / u.file).stat().st_size for u in utts if (folder / u.file).exists()),
        "sample_rate": SAMPLE_RATE, "voices": sorted({u.voice for u in utts}),
        "engines": {e: {"utterances": c, "audio_s": round(a, 1), "synth_s": round(s, 1),
                        "real_time_factor": round(s / a, 4) if a else None, "ms_per_utterance": round(1000 * s / c, 1)}
                    for e, (a, s, c) in per_engine.items()},
        "mean_chars": round(sum(len(u.text) for u in utts) / len(utts), 1) if utts else 0,
        **extra,
    }
    (folder / "corpus.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specgen.modalities.speech.training.spoken_corpus",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="corpus folder (resumed when it holds a manifest)")
    p.add_argument("--sentences", type=int, default=3600, help="number of utterances (default: 3600)")
    p.add_argument("--voices", default=",".join(VOICES), help=f"comma-separated (default: {','.join(VOICES)})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0, help="first sentence index (an evaluation set past a corpus)")
    p.add_argument("--source", choices=("auto", "fortunes", "stdlib"), default="auto")
    a = p.parse_args(argv)
    try:
        summary = build_corpus(a.out, a.sentences, voices=tuple(v.strip() for v in a.voices.split(",")),
                               seed=a.seed, source=a.source, start=a.start)
    except (InvalidRequest, MissingExtra) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
