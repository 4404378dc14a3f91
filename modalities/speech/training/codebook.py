"""The speech tokenizer's data (roles codec and tokens): a k-means codebook fitted on the corpus' log-mel frames,
and the corpus encoded with it once into `tokens.npz` (acoustic tokens, texts, voices; about 1 MB, so it ships
and the token models retrain without the audio).

    python -m specgen.modalities.speech.training.recipe --role codec --corpus runs/speech-corpus \
        --out assets/speech/codec
    python -m specgen.modalities.speech.training.recipe --role tokens --corpus runs/speech-corpus \
        --out assets/speech/corpus
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.training import file_sha256, write_npz

VAL_UTTERANCES = 96  # the last utterances of the token file are held out
CORPUS_MODULE = "specgen.modalities.speech.training.spoken_corpus"


def fit_codec(corpus: Path, out: Path, *, k: int = 1024, max_frames: int = 200_000, iters: int = 25,
              seed: int = 0) -> dict:
    """k-means over log-mel frames of the corpus' training utterances (a seeded subsample of max_frames)."""
    import torch

    from specgen.modalities.speech import codec
    from specgen.modalities.speech.training.spoken_corpus import read_manifest

    utts = read_manifest(corpus)[:-VAL_UTTERANCES]
    if not utts:
        raise InvalidRequest(f"no utterances in {corpus} (build it with python -m {CORPUS_MODULE})")
    started = time.perf_counter()
    frames = torch.cat([codec.log_mel(codec.read_wav(corpus / u.file)) for u in utts])
    mel_s = time.perf_counter() - started
    g = torch.Generator().manual_seed(seed)
    sample = frames[torch.randperm(len(frames), generator=g)[:max_frames]]
    started = time.perf_counter()
    centroids, report = codec.fit_kmeans(sample, k, iters=iters, seed=seed)
    report |= {"kmeans_s": round(time.perf_counter() - started, 1), "log_mel_s": round(mel_s, 1),
               "corpus_frames": len(frames), "utterances": len(utts), "seed": seed}
    codec.AcousticCodec(centroids).save(out)
    (out / "fit.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def encode_corpus(corpus: Path | list[Path], codec_dir: Path, out: Path, append: Path | None = None) -> dict:
    """tokens.npz in out: every utterance's acoustic tokens (concatenated uint16 + offsets), text and voice, of
    one corpus folder or several in order; `append`: a tokens folder encoded with the same codebook (a corpus whose
    audio is gone) put after them, so its held-out last utterances stay last."""
    import numpy as np

    from specgen.modalities.speech import codec
    from specgen.modalities.speech.training.spoken_corpus import read_manifest

    cd = codec.AcousticCodec.load(codec_dir)
    codebook_sha = file_sha256(Path(codec_dir) / "codebook.safetensors")
    rows = []  # (tokens, text, voice, id)
    for folder in ([corpus] if isinstance(corpus, (str, Path)) else corpus):
        rows += [(cd.encode(codec.read_wav(Path(folder) / u.file)).numpy().astype(np.uint16), u.text, u.voice, u.id)
                 for u in read_manifest(Path(folder))]
    if append is not None:
        old = load_tokens(append)
        if json.loads((Path(append) / "tokens.json").read_text()).get("codebook_sha256") != codebook_sha:
            raise InvalidRequest(f"the tokens in {str(append)!r} were encoded with another codebook")
        bounds = old["offsets"]
        rows += [(old["tokens"][bounds[i]:bounds[i + 1]], str(t), str(v), str(k))
                 for i, (t, v, k) in enumerate(zip(old["texts"], old["voices"], old["ids"]))]
    tokens = [r[0] for r in rows]
    offsets = np.cumsum([0] + [len(t) for t in tokens]).astype(np.int64)
    out.mkdir(parents=True, exist_ok=True)
    blob = {"tokens": np.concatenate(tokens), "offsets": offsets, "texts": np.array([r[1] for r in rows]),
            "voices": np.array([r[2] for r in rows]), "ids": np.array([r[3] for r in rows])}
    write_npz(out / "tokens.npz", blob, compressed=True)
    info = {"utterances": len(rows), "tokens": int(offsets[-1]), "num_tokens": cd.num_tokens,
            "codebook_sha256": codebook_sha, "val_utterances": VAL_UTTERANCES}
    (out / "tokens.json").write_text(json.dumps(info, indent=1) + "\n")
    for p in out.iterdir():
        p.chmod(0o644)
    return info


def load_tokens(path: Path) -> dict:
    import numpy as np

    path = Path(path)
    if path.is_dir():
        path = path / "tokens.npz"
    if not path.exists():
        raise ModelNotFound(f"no token file at {str(path)!r} (make it with --role tokens)")
    blob = np.load(path)
    return {k: blob[k] for k in blob.files}
