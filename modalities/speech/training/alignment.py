"""Character durations for the speech corpus: which acoustic frames each character of a sentence is spoken in.

The token models learn text-to-sound alignment far faster when the alignment is given (the interleaved layout of
the speech `models.py`), so the corpus carries one: every character gets a run of at least one frame, in order. It is
found without any outside model, by Viterbi training on the corpus' own frames (the frame's codebook centroid,
log-mel):

1. flat start: frames spread evenly over the characters;
2. a Gaussian per (voice, character) with one shared diagonal variance, re-estimated from the current alignment,
   then the best monotonic alignment under it (a dynamic program over characters x frames), `gaussian_rounds`
   times;
3. a small frame classifier (11 frames of context and the voice -> character) trained on the current alignment;
   its log-posteriors, less half the log character prior, score the next alignment, `network_rounds` times.

    python -m specgen.modalities.speech.training.alignment --tokens assets/speech/corpus

writes `durations.npz` beside `tokens.npz`: per utterance, its characters' frame counts (concatenated uint8, with
each utterance's character count; they sum to the utterance's frame count). Held-out utterances are aligned but
never fitted on. With `--units phonemes` the same procedure aligns the frames to each sentence's phonemes and
punctuation marks (the speech `phonemes.py`) instead of its characters, and `durations.json` records the phoneme
inventory the models then use.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

CONTEXT = 5  # frames either side of the classified frame
HIDDEN = 256


def best_alignment(scores: np.ndarray) -> np.ndarray:
    """scores [chars, frames] (log-likelihood of frame t under character n) -> [frames] character index: the
    monotonic path from (0, 0) to (chars - 1, frames - 1) moving one frame per step, staying or advancing by one
    character, that maximises the summed score. Needs frames >= chars."""
    chars, frames = scores.shape
    if frames < chars:
        raise ValueError(f"{frames} frames cannot hold {chars} characters (each needs one)")
    total = np.full(chars, -np.inf)
    total[0] = scores[0, 0]
    advanced = np.zeros((chars, frames), dtype=bool)  # [n, t]: frame t entered character n from n - 1
    for t in range(1, frames):
        move = np.concatenate([[-np.inf], total[:-1]])
        advanced[:, t] = move > total
        total = np.maximum(total, move) + scores[:, t]
    path = np.empty(frames, dtype=np.int64)
    n = chars - 1
    for t in range(frames - 1, -1, -1):
        path[t] = n
        n -= int(advanced[n, t])
    return path


def _even(frames: int, chars: int) -> np.ndarray:
    return np.minimum(np.arange(frames) * chars // frames, chars - 1)


def _gaussian_round(utts, paths, fit: int, voices: int, symbols: int) -> list[np.ndarray]:
    sums, counts = np.zeros((voices, symbols, utts[0][0].shape[1])), np.zeros((voices, symbols))
    for (frames, chars, voice), path in zip(utts[:fit], paths[:fit]):
        np.add.at(sums[voice], chars[path], frames)
        np.add.at(counts[voice], chars[path], 1)
    means = sums / np.maximum(counts, 1)[..., None]
    var = sum(((f - means[v][c[p]]) ** 2).sum(0) for (f, c, v), p in zip(utts[:fit], paths[:fit]))
    var = var / sum(len(f) for f, _, _ in utts[:fit])
    return [best_alignment(-0.5 * (((f[None] - means[v][c][:, None]) ** 2) / var).sum(-1)) for f, c, v in utts]


def _network_round(utts, paths, fit: int, voices: int, symbols: int, seed: int, epochs: int = 3):
    import torch
    import torch.nn as nn

    def windows(frames):
        padded = np.pad(frames, ((CONTEXT, CONTEXT), (0, 0)), mode="edge")
        return np.concatenate([padded[i:i + len(frames)] for i in range(2 * CONTEXT + 1)], 1)

    feats = [torch.tensor(windows(f), dtype=torch.float32) for f, _, _ in utts]
    sample = torch.cat(feats[:min(fit, 500)])
    mean, std = sample.mean(0), sample.std(0).clamp(min=1e-3)
    feats = [(f - mean) / std for f in feats]
    x = torch.cat(feats[:fit])
    y = torch.cat([torch.from_numpy(c[p]) for (_, c, _), p in zip(utts[:fit], paths[:fit])])
    v = torch.cat([torch.full((len(f),), voice) for f, _, voice in utts[:fit]])
    torch.manual_seed(seed)
    voice_bias = nn.Embedding(voices, HIDDEN)
    body = nn.Sequential(nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, symbols))
    first = nn.Linear(x.shape[1], HIDDEN)
    params = [*voice_bias.parameters(), *body.parameters(), *first.parameters()]
    opt = torch.optim.Adam(params, 1e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(order), 512):
            j = order[i:i + 512]
            loss = nn.functional.cross_entropy(body(first(x[j]) + voice_bias(v[j])), y[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
    log_prior = (torch.bincount(y, minlength=symbols).float() / len(y)).clamp(min=1e-6).log()
    new = []
    with torch.no_grad():
        for f, (_, chars, voice) in zip(feats, utts):
            logp = body(first(f) + voice_bias(torch.full((len(f),), voice))).log_softmax(-1) - 0.5 * log_prior
            new.append(best_alignment(logp[:, torch.from_numpy(chars)].T.double().numpy()))
    return new, loss.item()


def align_corpus(tokens_dir: Path, codec_dir: Path, *, held_out: int, gaussian_rounds: int = 4,
                 network_rounds: int = 3, seed: int = 0, units: str = "characters", log=print) -> dict:
    """Align every utterance of tokens_dir/tokens.npz to its characters, or to its phonemes (units="phonemes",
    `phonemes.py`); write durations.npz there and return a report (with the phoneme inventory)."""
    from specgen.modalities.training import atomic_write
    from specgen.modalities.speech import phonemes
    from specgen.modalities.speech.codec import AcousticCodec
    from specgen.modalities.speech.voices import ALPHABET
    from specgen.modalities.speech.training.codebook import load_tokens

    started = time.perf_counter()
    blob = load_tokens(tokens_dir)
    centroids = AcousticCodec.load(codec_dir).centroids.double().numpy()
    offsets, voices = blob["offsets"], sorted(set(str(v) for v in blob["voices"]))
    texts = [str(t) for t in blob["texts"]]
    if units == "phonemes":
        sequences = phonemes.corpus_units(texts)
        symbols = phonemes.inventory(sequences)
    else:
        sequences, symbols = texts, ALPHABET
    utts = []
    for i, (sequence, voice) in enumerate(zip(sequences, blob["voices"])):
        frames = centroids[blob["tokens"][offsets[i]:offsets[i + 1]].astype(np.int64)]
        chars = np.array([symbols.index(c) for c in sequence], dtype=np.int64)
        if len(frames) < len(chars):
            raise ValueError(f"utterance {i} has {len(frames)} frames for {len(chars)} {units}")
        utts.append((frames, chars, voices.index(str(voice))))
    fit = len(utts) - held_out
    paths = [_even(len(f), len(c)) for f, c, _ in utts]
    history = []
    for r in range(gaussian_rounds + network_rounds):
        if r < gaussian_rounds:
            new, note = _gaussian_round(utts, paths, fit, len(voices), len(symbols)), "gaussian"
        else:
            new, loss = _network_round(utts, paths, fit, len(voices), len(symbols), seed + r)
            note = f"network (frame loss {loss:.3f})"
        changed = float(np.mean(np.concatenate([a != b for a, b in zip(paths, new)])))
        paths = new
        history.append({"round": r + 1, "kind": note.split()[0], "frames_changed": round(changed, 4)})
        log(f"align round {r + 1}: {note}, {changed:.1%} of frames moved")
    durations = [np.bincount(p, minlength=len(c)) for p, (_, c, _) in zip(paths, utts)]
    counts = np.concatenate(durations)
    if counts.max() > 255 or max(len(d) for d in durations) > 255:
        raise ValueError("a duration or a sentence is too long for the uint8 storage")
    out = {"durations": counts.astype(np.uint8), "chars": np.array([len(d) for d in durations], dtype=np.uint8)}

    def write(path):
        with open(path, "wb") as f:
            np.savez_compressed(f, **out)

    atomic_write(Path(tokens_dir) / "durations.npz", write)
    (Path(tokens_dir) / "durations.npz").chmod(0o644)
    return {"utterances": len(utts), "fitted_on": fit, "rounds": history, "seed": seed, "units": units,
            **({"inventory": list(symbols)} if units == "phonemes" else {}),
            "mean_frames_per_char": round(float(counts.mean()), 2),
            "one_frame_chars": round(float((counts == 1).mean()), 3),
            "seconds": round(time.perf_counter() - started, 1)}


def load_inventory(tokens_dir: Path) -> tuple[str, ...] | None:
    """The phoneme inventory the corpus' durations were aligned to; None for characters (or no durations)."""
    path = Path(tokens_dir)
    path = (path if path.is_dir() else path.parent) / "durations.json"
    inventory = json.loads(path.read_text()).get("inventory") if path.exists() else None
    return tuple(inventory) if inventory else None


def load_durations(tokens_dir: Path) -> list[np.ndarray] | None:
    """Per utterance, its characters' frame counts; None when the corpus has no durations.npz."""
    path = Path(tokens_dir)
    path = (path if path.is_dir() else path.parent) / "durations.npz"
    if not path.exists():
        return None
    blob = np.load(path)
    counts = blob["durations"].astype(np.int64)  # read once: each access to an npz member decompresses it again
    offsets = np.cumsum(np.concatenate([[0], blob["chars"].astype(np.int64)]))
    return [counts[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def main(argv: list[str] | None = None) -> int:
    from specgen.modalities.speech.models import default_paths
    from specgen.modalities.speech.training.codebook import VAL_UTTERANCES

    p = argparse.ArgumentParser(prog="python -m specgen.modalities.speech.training.alignment",
                                description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=Path, default=None, help="the corpus folder with tokens.npz "
                                                             "(default: assets/speech/corpus)")
    p.add_argument("--codec", type=Path, default=None, help="the codebook folder (default: assets/speech/codec)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--units", choices=("characters", "phonemes"), default="characters",
                   help="align the frames to the text's characters (default) or to its phonemes (espeak-ng's, "
                        "from the libespeak-ng in the espeakng-loader wheel)")
    a = p.parse_args(argv)
    from specgen.settings import use_threads

    use_threads(a.threads)
    paths = default_paths()
    tokens = a.tokens or paths["target"].parent / "corpus"
    report = align_corpus(tokens, a.codec or paths["codec"], held_out=VAL_UTTERANCES, seed=a.seed, units=a.units,
                          log=lambda m: print(m, file=sys.stderr, flush=True))
    report["command"] = "python -m specgen.modalities.speech.training.alignment " + " ".join(argv or sys.argv[1:])
    (Path(tokens) / "durations.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
