"""Quality measures for speech decoded from acoustic tokens, next to pocketsphinx WER (`evaluate.Recogniser`).

**Speaker similarity proxy.** No pretrained speaker encoder can be used offline here (Resemblyzer's wheel cannot be
installed), so a voice is described by utterance-level statistics of its cepstrum: the mean and the standard
deviation, over the utterance's speech frames, of the cepstral coefficients c1..c19 (the orthonormal DCT of the
80-bin natural-log mel of `codec.log_mel`; c0, the loudness, is left out). Each of the 38 statistics is
standardised by its mean and spread over reference utterances of every voice, and a voice's profile is the mean
standardised vector of its references. The similarity of an utterance to a voice is the cosine between its
standardised statistics and that profile. It captures average timbre and spectral spread, not identity as a
trained encoder would; `separation` measures how well it tells the corpus voices apart, and every report carries
that figure. An utterance without speech frames scores 0.

**Token-swap stress test** (PCG): the true token sequence of an utterance has tokens replaced by other members of
their groups (`specgen.samplers.groups.swap_tokens`); both sequences are decoded through the same codec and the
swapped decode is measured against the unswapped one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specgen.errors import InvalidRequest
from specgen.modalities.speech.codec import LOG_FLOOR, AcousticCodec, MelConfig, log_mel, mel_distance
from specgen.samplers.groups import TokenGroups, swap_tokens

CEPSTRA = 20  # c0..c19; c0 is dropped
BOOTSTRAP_RESAMPLES = 2000
SILENCE_NATS = 4.0  # frames whose mean log-mel is this far (about 35 dB) below the loudest frame are silence


@dataclass(frozen=True)
class CorpusUtterance:
    id: str
    text: str
    voice: str
    tokens: np.ndarray  # [frames] int64 acoustic tokens


def load_corpus(path: str | Path) -> list[CorpusUtterance]:
    """The encoded corpus (`tokens.npz` or its folder, as written by `train --role tokens`), in file order."""
    from specgen.modalities.speech.training.codebook import load_tokens

    blob = load_tokens(Path(path))
    offsets = blob["offsets"]
    return [CorpusUtterance(str(blob["ids"][i]), str(blob["texts"][i]), str(blob["voices"][i]),
                            blob["tokens"][offsets[i]:offsets[i + 1]].astype(np.int64))
            for i in range(len(offsets) - 1)]


def split_corpus(utterances: list[CorpusUtterance], held_out: int) -> tuple[list, list]:
    """(training part, held-out part): the last `held_out` utterances are held out (as the trainer holds them out),
    at most half of a small corpus."""
    held_out = min(held_out, len(utterances) // 2)
    return utterances[:len(utterances) - held_out], utterances[len(utterances) - held_out:]


def first_per_voice(utterances: list[CorpusUtterance], per_voice: int) -> list[CorpusUtterance]:
    """The first `per_voice` utterances of every voice, in corpus order."""
    counts: dict[str, int] = {}
    chosen = []
    for u in utterances:
        if counts.get(u.voice, 0) < per_voice:
            counts[u.voice] = counts.get(u.voice, 0) + 1
            chosen.append(u)
    return chosen


def _cepstral_basis(n_mels: int) -> torch.Tensor:
    """[n_mels, CEPSTRA] float64 orthonormal DCT-II basis."""
    from torchaudio.functional import create_dct

    return create_dct(CEPSTRA, n_mels, "ortho").double()


def voice_statistics(audio: np.ndarray, cfg: MelConfig = MelConfig()) -> np.ndarray | None:
    """float mono audio -> [2 * (CEPSTRA - 1)] float64: mean and standard deviation of c1..c19 over speech frames;
    None when fewer than two speech frames exist. Silence and pauses look alike in every voice, so they are left out
    before averaging."""
    if len(audio) < cfg.n_fft // 2 + 1:
        return None
    frames = log_mel(audio, cfg).double()  # [frames, n_mels]
    loudness = frames.mean(-1)
    # speech: near the loudest frame, and above the log floor (digital silence sits exactly on it)
    speech = frames[(loudness > loudness.max() - SILENCE_NATS) & (loudness > math.log(LOG_FLOOR) + 1.0)]
    if len(speech) < 2:
        return None
    cepstra = (speech @ _cepstral_basis(cfg.n_mels))[:, 1:]  # [speech frames, CEPSTRA - 1]
    return torch.cat([cepstra.mean(0), cepstra.std(0)]).numpy()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 0 else 0.0


def decoded_references(codec: AcousticCodec, utterances: list[CorpusUtterance], per_voice: int) -> dict[str, list]:
    """voice -> the audio of its first `per_voice` utterances decoded through `codec` (the profiles' references:
    decoded through the same codec as what they will score)."""
    references: dict[str, list] = {}
    for u in first_per_voice(utterances, per_voice):
        references.setdefault(u.voice, []).append(codec.decode(u.tokens.tolist()))
    return references


@dataclass(frozen=True)
class VoiceProfiles:
    """Standardisation of `voice_statistics` and one profile per voice (module docstring)."""

    centre: np.ndarray  # [D] mean statistics over every reference utterance
    scale: np.ndarray  # [D] their standard deviation (floored: a constant statistic carries no voice)
    profiles: dict  # voice -> [D] mean standardised statistics of its reference utterances
    references: dict  # voice -> number of reference utterances behind its profile

    @classmethod
    def fit(cls, references: dict[str, list[np.ndarray]], cfg: MelConfig = MelConfig()) -> "VoiceProfiles":
        """references: voice -> reference audios of that voice."""
        stats = {voice: [s for s in (voice_statistics(a, cfg) for a in audios) if s is not None]
                 for voice, audios in references.items()}
        stats = {voice: rows for voice, rows in stats.items() if rows}
        if not stats:
            raise InvalidRequest("no reference utterance holds speech: cannot build voice profiles")
        every = np.stack([row for rows in stats.values() for row in rows])  # [references, D]
        centre, scale = every.mean(0), np.maximum(every.std(0), 1e-6)
        profiles = {voice: ((np.stack(rows) - centre) / scale).mean(0) for voice, rows in stats.items()}
        return cls(centre, scale, profiles, {voice: len(rows) for voice, rows in stats.items()})

    def standardised(self, audio: np.ndarray, cfg: MelConfig = MelConfig()) -> np.ndarray | None:
        stats = voice_statistics(audio, cfg)
        return None if stats is None else (stats - self.centre) / self.scale

    def scores(self, audio: np.ndarray, cfg: MelConfig = MelConfig()) -> dict[str, float]:
        """voice -> similarity of `audio` to that voice's profile."""
        point = self.standardised(audio, cfg)
        return {voice: 0.0 if point is None else _cosine(point, profile) for voice, profile in self.profiles.items()}

    def similarity(self, audio: np.ndarray, voice: str, cfg: MelConfig = MelConfig()) -> float:
        if voice not in self.profiles:
            raise InvalidRequest(f"no reference utterances of voice {voice!r} (have: {', '.join(self.profiles)})")
        return self.scores(audio, cfg)[voice]


def separation(profiles: VoiceProfiles, utterances: list[tuple[str, np.ndarray]]) -> dict:
    """How well the proxy tells voices apart on utterances [(voice, audio)] outside the references: mean similarity
    to the own voice's profile and to the other profiles, and the share identified (own profile scores highest)."""
    same, other, identified = [], [], 0
    for voice, audio in utterances:
        scores = profiles.scores(audio)
        same.append(scores[voice])
        other += [s for v, s in scores.items() if v != voice]
        identified += max(scores, key=scores.get) == voice
    return {"utterances": len(utterances), "voices": len(profiles.profiles),
            "same_voice": float(np.mean(same)) if same else None,
            "other_voice": float(np.mean(other)) if other else None,
            "identified": identified / len(utterances) if utterances else None}


# A measurement of one decoded utterance: audio, utterance -> {"edits", "words", "similarity"}.
Measure = Callable[[np.ndarray, CorpusUtterance], dict]


def swap_test(codec: AcousticCodec, utterances: list[CorpusUtterance], groups: dict[float, TokenGroups],
              measure: Measure, *, rate: float = 1.0, seed: int = 0) -> tuple[list[dict], list[tuple[str, np.ndarray]]]:
    """The token-swap stress test at every theta of `groups` (theta -> groups). Returns one row per (utterance,
    theta) with the tokens swapped, `measure` of the swapped and (prefixed `base_`) the unswapped decode, and the
    log-mel L1 between the two decodes (same frames, same timing); and the unswapped decodes as [(voice, audio)]."""
    rows, decoded = [], []
    for n, utterance in enumerate(utterances):
        tokens = torch.from_numpy(utterance.tokens)
        original = codec.decode(tokens)
        decoded.append((utterance.voice, original))
        base = {f"base_{k}": v for k, v in measure(original, utterance).items()}
        original_mel = log_mel(original, codec.cfg)
        for theta, theta_groups in groups.items():
            # the same draws for an utterance at every theta: thetas differ only in their groups
            draws = torch.Generator().manual_seed(seed * 1_000_003 + n)
            swapped = swap_tokens(tokens, theta_groups, rate, draws)
            audio = codec.decode(swapped)
            rows.append({"id": utterance.id, "voice": utterance.voice, "theta": theta, "tokens": int(tokens.numel()),
                         "swapped": int((swapped != tokens).sum()),
                         "mel_l1": mel_distance(original_mel, log_mel(audio, codec.cfg)),
                         **measure(audio, utterance), **base})
    return rows, decoded


def bootstrap_mean_ci(values, weights=None, resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = 0) -> tuple[float, float, float] | None:
    """(weighted mean, 2.5 %, 97.5 %) resampling the (value, weight) pairs with replacement; None without values.
    With weights = words per prompt and values = per-prompt WER change, the mean is the pooled WER change."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return None
    w = np.ones_like(data) if weights is None else np.asarray(weights, dtype=float)
    point = float((data * w).sum() / w.sum())
    picks = np.random.default_rng(seed).integers(0, data.size, size=(resamples, data.size))  # [resamples, n]
    picked_w = w[picks]
    means = (data[picks] * picked_w).sum(1) / np.maximum(picked_w.sum(1), 1e-300)
    return point, float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
