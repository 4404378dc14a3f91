"""The acoustic tokenizer and its vocoder: log-mel frames quantised by a k-means codebook, and back to audio.

audio (16 kHz) -> |STFT| (n_fft 1024, hop 256: 62.5 frames/s) -> 80-bin mel -> natural log -> nearest of K
centroids (Euclidean) = one token per frame. Decoding looks the centroids up, undoes the log, maps the mel back
to a linear magnitude with torchaudio's `InverseMelScale` (non-negative least squares) and recovers a phase with
Griffin-Lim. Training-free apart from k-means; the codebook ships as `assets/speech/codec/` (`codebook.safetensors`
and `config.json`). WAV I/O goes through soundfile (torchaudio's load/save need torchcodec).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from specgen.errors import InvalidRequest, ModelNotFound

LOG_FLOOR = 1e-5


@dataclass(frozen=True)
class MelConfig:
    sample_rate: int = 16000
    n_fft: int = 1024
    hop_length: int = 256
    n_mels: int = 80
    f_min: float = 0.0
    f_max: float = 8000.0
    griffin_lim_iters: int = 48

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.hop_length


def _mel_transform(cfg: MelConfig):
    import torchaudio.transforms as T

    return T.MelSpectrogram(sample_rate=cfg.sample_rate, n_fft=cfg.n_fft, hop_length=cfg.hop_length,
                            f_min=cfg.f_min, f_max=cfg.f_max, n_mels=cfg.n_mels, power=1.0)


def log_mel(audio, cfg: MelConfig = MelConfig()) -> torch.Tensor:
    """float mono audio [samples] at cfg.sample_rate -> log-mel frames [frames, n_mels] (float32)."""
    x = torch.as_tensor(np.asarray(audio, dtype=np.float32) if not isinstance(audio, torch.Tensor) else audio).float()
    if x.dim() != 1 or x.numel() < cfg.n_fft // 2 + 1:
        raise InvalidRequest(f"audio must be mono [samples] with at least {cfg.n_fft // 2 + 1} samples, "
                             f"got shape {list(x.shape)}")
    with torch.no_grad():
        mel = _mel_transform(cfg)(x)  # [n_mels, frames]
    return mel.clamp(min=LOG_FLOOR).log().T.contiguous()


@torch.no_grad()
def vocode(log_mel_frames: torch.Tensor, cfg: MelConfig = MelConfig()) -> np.ndarray:
    """log-mel frames [frames, n_mels] -> float32 audio: InverseMelScale, then Griffin-Lim (zero initial phase,
    so the same frames always give the same audio)."""
    import torchaudio.transforms as T

    frames = torch.as_tensor(log_mel_frames).float()
    if frames.dim() != 2 or frames.shape[1] != cfg.n_mels:
        raise InvalidRequest(f"log-mel frames must be [frames, {cfg.n_mels}], got {list(frames.shape)}")
    if len(frames) == 0:
        return np.zeros(0, np.float32)
    # Griffin-Lim's STFT pads its signal by reflection, which needs more than n_fft / 2 samples: a very short
    # utterance (a sampled EOS after a frame or two) is vocoded with quiet frames after it, then cut back
    keep = max(len(frames) - 1, 1) * cfg.hop_length
    shortest = cfg.n_fft // (2 * cfg.hop_length) + 3
    if len(frames) < shortest:
        frames = torch.cat([frames, frames.min().expand(shortest - len(frames), cfg.n_mels)])
    mel = frames.exp().T  # [n_mels, frames]
    linear = T.InverseMelScale(n_stft=cfg.n_fft // 2 + 1, n_mels=cfg.n_mels, sample_rate=cfg.sample_rate,
                               f_min=cfg.f_min, f_max=cfg.f_max)(mel)
    gl = T.GriffinLim(n_fft=cfg.n_fft, hop_length=cfg.hop_length, power=1.0, n_iter=cfg.griffin_lim_iters,
                      rand_init=False)
    audio = gl(linear)
    peak = float(audio.abs().max())
    if peak > 0.99:  # keep within 16-bit range
        audio = audio * (0.99 / peak)
    return audio[:keep].numpy().astype(np.float32)


class AcousticCodec:
    """A k-means codebook over log-mel frames: `encode` audio -> tokens, `decode` tokens -> audio."""

    def __init__(self, centroids: torch.Tensor, cfg: MelConfig = MelConfig()):
        self.centroids = torch.as_tensor(centroids).float()  # [K, n_mels]
        if self.centroids.dim() != 2 or self.centroids.shape[1] != cfg.n_mels:
            raise InvalidRequest(f"centroids must be [K, {cfg.n_mels}], got {list(self.centroids.shape)}")
        self.cfg = cfg

    @property
    def num_tokens(self) -> int:
        return len(self.centroids)

    def quantise(self, frames: torch.Tensor) -> torch.Tensor:
        """log-mel frames [N, n_mels] -> tokens [N] int64 (nearest centroid)."""
        return nearest(torch.as_tensor(frames).float(), self.centroids)

    def encode(self, audio) -> torch.Tensor:
        return self.quantise(log_mel(audio, self.cfg))

    def frames(self, tokens) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.num_tokens):
            raise InvalidRequest(f"acoustic tokens must lie in 0..{self.num_tokens - 1}")
        return self.centroids[tokens]

    def decode(self, tokens) -> np.ndarray:
        return vocode(self.frames(tokens), self.cfg)

    def save(self, folder: str | Path) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"centroids": self.centroids.contiguous()}, str(folder / "codebook.safetensors"))
        (folder / "config.json").write_text(json.dumps({**asdict(self.cfg), "num_tokens": self.num_tokens}, indent=1)
                                            + "\n")
        for p in folder.iterdir():
            p.chmod(0o644)
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> AcousticCodec:
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / "codebook.safetensors").exists() or not (folder / "config.json").exists():
            raise ModelNotFound(f"no acoustic codebook in {str(folder)!r} (expected codebook.safetensors and "
                                "config.json; fit one with "
                                "`python -m specgen.modalities.speech.training.recipe --role codec`)")
        d = json.loads((folder / "config.json").read_text())
        cfg = MelConfig(**{k: d[k] for k in MelConfig.__dataclass_fields__ if k in d})
        return cls(load_file(str(folder / "codebook.safetensors"))["centroids"], cfg)


def nearest(frames: torch.Tensor, centroids: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    """Index of the nearest centroid (squared Euclidean) for every row of frames [N, D]."""
    c_norm = (centroids ** 2).sum(-1)
    out = []
    for i in range(0, len(frames), chunk):
        x = frames[i:i + chunk]
        out.append((c_norm[None] - 2 * x @ centroids.T).argmin(-1))  # |x|^2 is the same for every centroid
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def fit_kmeans(frames: torch.Tensor, k: int, *, iters: int = 25, seed: int = 0) -> tuple[torch.Tensor, dict]:
    """Lloyd's k-means on frames [N, D] from a k-means++ start; an emptied cluster restarts on the frame
    farthest from its centroid. Returns the centroids [k, D] and a report (inertia per iteration, cluster sizes)."""
    frames = torch.as_tensor(frames).float()
    if len(frames) < k:
        raise InvalidRequest(f"k-means needs at least k={k} frames, got {len(frames)}")
    centroids = kmeans_plus_plus(frames, k, seed)
    inertia = []
    for _ in range(iters):
        assign = nearest(frames, centroids)
        dist = ((frames - centroids[assign]) ** 2).sum(-1)
        inertia.append(float(dist.mean()))
        sums = torch.zeros_like(centroids).index_add_(0, assign, frames)
        counts = torch.bincount(assign, minlength=k)
        empty = (counts == 0).nonzero().flatten()
        centroids = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], centroids)
        if len(empty):
            centroids[empty] = frames[dist.topk(len(empty)).indices]
    counts = torch.bincount(nearest(frames, centroids), minlength=k)
    return centroids, {"inertia": [round(v, 4) for v in inertia], "frames": len(frames), "k": k, "iters": iters,
                       "empty_clusters": int((counts == 0).sum()), "largest_cluster": int(counts.max())}


def kmeans_plus_plus(frames: torch.Tensor, k: int, seed: int = 0) -> torch.Tensor:
    """k-means++ seeding: each next centroid is a frame drawn with probability proportional to its squared
    distance from the nearest centroid so far."""
    g = torch.Generator().manual_seed(seed)
    first = int(torch.randint(len(frames), (1,), generator=g))
    chosen = [first]
    dist = ((frames - frames[first]) ** 2).sum(-1).double()
    for _ in range(k - 1):
        weights = dist if float(dist.sum()) > 0 else torch.ones_like(dist)
        pick = int(torch.multinomial(weights, 1, generator=g))
        chosen.append(pick)
        dist = torch.minimum(dist, ((frames - frames[pick]) ** 2).sum(-1).double())
    return frames[chosen].clone()


def read_wav(path: str | Path, sample_rate: int = 16000) -> np.ndarray:
    """Mono float32 audio at `sample_rate` (resampled if needed)."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise InvalidRequest(f"no such audio file: {path}")
    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if rate != sample_rate:
        import torchaudio.functional as AF

        audio = AF.resample(torch.from_numpy(audio), rate, sample_rate).numpy()
    return audio


def write_wav(path: str | Path, audio, sample_rate: int = 16000) -> Path:
    """16-bit PCM WAV, written to a temporary name and moved into place."""
    import soundfile as sf

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    sf.write(str(tmp), np.clip(np.asarray(audio, np.float32), -1, 1), sample_rate, subtype="PCM_16", format="WAV")
    os.replace(tmp, path)
    return path


def mel_distance(reference: torch.Tensor, other: torch.Tensor) -> float:
    """Mean absolute difference of two log-mel sequences [frames, n_mels] (natural log), over the shorter length."""
    n = min(len(reference), len(other))
    if n == 0:
        raise InvalidRequest("mel_distance needs two non-empty frame sequences")
    return float((reference[:n] - other[:n]).abs().mean())


def dtw_mel_distance(reference: torch.Tensor, other: torch.Tensor) -> float:
    """Mean absolute log-mel difference along the best monotonic alignment (dynamic time warping, steps (1,0),
    (0,1), (1,1)), divided by the path length: for signals of different timing, such as generated speech."""
    a, b = torch.as_tensor(reference).double(), torch.as_tensor(other).double()
    if len(a) == 0 or len(b) == 0:
        raise InvalidRequest("dtw_mel_distance needs two non-empty frame sequences")
    cost = torch.cdist(a, b, p=1).numpy() / a.shape[1]  # [n, m] mean |difference| per bin
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    steps = np.zeros((n + 1, m + 1))
    total[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            moves = ((total[i - 1, j - 1], steps[i - 1, j - 1]), (total[i - 1, j], steps[i - 1, j]),
                     (total[i, j - 1], steps[i, j - 1]))
            best, length = min(moves, key=lambda t: t[0])
            total[i, j], steps[i, j] = best + cost[i - 1, j - 1], length + 1
    return float(total[n, m] / steps[n, m])
