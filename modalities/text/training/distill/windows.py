"""Training windows for draft distillation: a prompt followed by a continuation that the loss covers.

Every window is `prompt_len` tokens of real text and `new_tokens` tokens of continuation, and only the positions
predicting the continuation carry a loss, so all data sources give the same tokens-with-gradient per window:
- `corpus`: the continuation is the real text that followed (a fixed corpus);
- `target`: the target's own samples at the decoding temperature (generated once, cached, resumable);
- `draft`: on-policy samples from the draft being trained, drawn fresh every step (DistillSpec).
Prompts come from the code corpus (train split for training, validation split for evaluation) at starts chosen
by a seed, so a data set is a pure function of (corpus, tokenizer, seed, sizes).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specgen.modalities.training import file_sha256, write_npy, write_npz

SOURCES = ("corpus", "target", "draft", "mix")


@dataclass(frozen=True)
class Windows:
    tokens: np.ndarray  # [n, prompt_len + new_tokens] int64 target ids
    prompt_len: int

    @property
    def loss_mask(self) -> np.ndarray:
        return continuation_mask(len(self.tokens), self.prompt_len, self.tokens.shape[1] - self.prompt_len)


def continuation_mask(rows: int, prompt_len: int, new_tokens: int) -> np.ndarray:
    """[rows, prompt_len + new_tokens - 1] bool: the input positions whose next token is a continuation token."""
    mask = np.zeros((rows, prompt_len + new_tokens - 1), dtype=bool)
    mask[:, prompt_len - 1:] = True
    return mask


def model_sha256(folder: str | Path) -> str:
    """A short identity of a saved model folder (its weights and config), for cache keys."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        if path.suffix in (".safetensors", ".json", ".bin"):
            digest.update(path.name.encode() + bytes.fromhex(file_sha256(path)))
    return digest.hexdigest()[:16]


def cache_folder(target_path: str | Path, override: str | Path | None = None) -> Path:
    """Where the data and teacher caches for a target live: `override`, else $SPECGEN_HOME/distill/<target id>."""
    from specgen.modalities.assets import cache_dir

    return Path(override) if override else cache_dir() / "distill" / model_sha256(target_path)


def corpus_stream(tokenizer, split: str, max_files: int | None, cache: Path) -> np.ndarray:
    """The corpus split as one token stream (each file <bos> text <eos>), cached per corpus and tokenizer."""
    from specgen.modalities.text.training.stdlib_corpus import load_corpus

    corpus = load_corpus(max_files=max_files)
    key = hashlib.sha256(json.dumps([corpus.sha256, tokenizer.backend_tokenizer.to_str()]).encode()).hexdigest()[:16]
    path = cache / f"stream-{split}-{key}.npy"
    if not path.exists():
        encoded = tokenizer.backend_tokenizer.encode_batch(corpus.texts(split), add_special_tokens=False)
        dtype = np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32  # Gemma's ids go up to 262,143
        stream = np.fromiter((i for e in encoded for i in (tokenizer.bos_token_id, *e.ids, tokenizer.eos_token_id)),
                             dtype=dtype)
        write_npy(path, stream)  # a kill mid-write leaves no partial file
    return np.load(path)


def corpus_windows(stream: np.ndarray, count: int, prompt_len: int, new_tokens: int, seed: int) -> Windows:
    """`count` windows of real text at starts drawn by `seed`."""
    length = prompt_len + new_tokens
    if len(stream) <= length:
        raise ValueError(f"the corpus has {len(stream)} tokens, fewer than one window of {length + 1}")
    starts = np.random.default_rng(seed).integers(0, len(stream) - length, size=count)
    return Windows(np.stack([stream[s:s + length] for s in starts]).astype(np.int64), prompt_len)


@torch.no_grad()
def sample_continuations(model, prompts: torch.Tensor, new_tokens: int, temperature: float, seed: int,
                         teacher_k: int | None = None, teacher_temperature: float = 1.0):
    """[n, prompt_len + new_tokens]: `model` continues each prompt for exactly `new_tokens` tokens (ancestral
    sampling at `temperature`, or greedy at 0; end-of-text does not stop it), reproducibly from `seed`.

    With `teacher_k`, also returns the model's law before each continuation token at `teacher_temperature` as a
    top-k TeacherTopK ([n * new_tokens] rows, row-major): the logits sampling computed anyway, so a teacher cache
    of the samples costs no second pass over them."""
    from specgen.modalities.text.training.distill.divergences import TeacherTopK, teacher_top_k

    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    cache, feed, out, teachers = None, prompts, [], []
    for _ in range(new_tokens):
        # only the last position's logits are needed: on a 262,144-token vocabulary the prompt's would dominate
        result = model(input_ids=feed, cache=cache, use_cache=True, logits_to_keep=1)
        cache, logits = result.cache, result.logits[:, -1].float()  # [n, vocab]
        if teacher_k is not None:
            teachers.append(teacher_top_k(logits, teacher_k, teacher_temperature))
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial((logits / temperature).softmax(-1), 1, generator=generator)[:, 0]
        out.append(nxt)
        feed = nxt[:, None]
    model.train(was_training)
    tokens = torch.cat([prompts, torch.stack(out, 1)], 1)
    if teacher_k is None:
        return tokens
    teacher = TeacherTopK(*(torch.stack([getattr(t, name) for t in teachers], 1).flatten(0, 1)
                            for name in ("top_ids", "top_logp", "tail_logp")))  # [n * new_tokens, ...]
    return tokens, teacher


def target_windows(target, prompts: Windows, new_tokens: int, temperature: float, seed: int, folder: Path,
                   chunk: int = 32, teacher_k: int | None = None, teacher_temperature: float = 1.0):
    """The target's own continuations of `prompts`, generated chunk by chunk into `folder` (a killed run
    resumes at the first missing chunk; each chunk is seeded by (seed, chunk index)).

    With `teacher_k`, every chunk also keeps the target's top-k law before each continuation token (captured
    while sampling) and the seconds it took; returns (Windows, TeacherCache over all length - 1 input
    positions, the prompt positions empty) and writes `samples.json` (size and generation throughput)."""
    import sys

    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    heads = torch.from_numpy(prompts.tokens[:, :prompts.prompt_len])
    parts, teachers, wall_s = [], [], 0.0
    starts = range(0, len(heads), chunk)
    for index, start in enumerate(tqdm(starts, desc="target samples", unit="chunk", file=sys.stderr,
                                       disable=len(starts) < 4, dynamic_ncols=True)):
        if teacher_k is None:
            path = folder / f"chunk-{index:05d}.npy"
            if not path.exists():
                rows = sample_continuations(target, heads[start:start + chunk], new_tokens, temperature,
                                            seed=seed * 100_003 + index)
                write_npy(path, rows.numpy())
            parts.append(np.load(path))
            continue
        path = folder / f"chunk-{index:05d}-k{teacher_k}.npz"
        if not path.exists():
            began = time.perf_counter()
            rows, teacher = sample_continuations(target, heads[start:start + chunk], new_tokens, temperature,
                                                 seed=seed * 100_003 + index, teacher_k=teacher_k,
                                                 teacher_temperature=teacher_temperature)
            _save_chunk(path, rows, teacher, new_tokens, time.perf_counter() - began)
        with np.load(path) as blob:
            parts.append(blob["tokens"])
            teachers.append({name: blob[name] for name in ("top_ids", "top_logp", "tail_logp")})
            wall_s += float(blob["wall_s"])
    windows = Windows(np.concatenate(parts).astype(np.int64), prompts.prompt_len)
    if teacher_k is None:
        return windows
    teacher = _padded_teacher(teachers, prompts.prompt_len)
    tokens = windows.tokens.shape[0] * new_tokens
    summary = {"windows": int(windows.tokens.shape[0]), "prompt_len": prompts.prompt_len, "new_tokens": new_tokens,
               "temperature": temperature, "teacher_temperature": teacher_temperature, "teacher_k": teacher_k,
               "generated_tokens": tokens, "bytes": sum(p.stat().st_size for p in folder.glob("chunk-*.npz")),
               "generation_s": round(wall_s, 1), "tokens_per_s": round(tokens / wall_s, 1) if wall_s else None,
               "threads": torch.get_num_threads()}
    (folder / "samples.json").write_text(json.dumps(summary, indent=1) + "\n")
    return windows, teacher


def _save_chunk(path: Path, rows: torch.Tensor, teacher, new_tokens: int, wall_s: float) -> None:
    shape = (len(rows), new_tokens, -1)
    write_npz(path, {"tokens": rows.numpy().astype(np.int64),
                     "top_ids": teacher.top_ids.reshape(shape).numpy().astype(np.int32),
                     "top_logp": teacher.top_logp.reshape(shape).numpy().astype(np.float16),
                     "tail_logp": teacher.tail_logp.reshape(shape[:2]).numpy().astype(np.float32), "wall_s": wall_s})


def _padded_teacher(chunks: list[dict], prompt_len: int):
    """One TeacherCache over all input positions of the windows: the continuation positions from `chunks`,
    the prompt positions (no loss there) empty."""
    from specgen.modalities.text.training.distill.teacher import TeacherCache

    top_ids, top_logp, tail = (np.concatenate([c[name] for c in chunks]) for name in ("top_ids", "top_logp",
                                                                                       "tail_logp"))
    pad = prompt_len - 1
    return TeacherCache(np.pad(top_ids, ((0, 0), (pad, 0), (0, 0))), np.pad(top_logp, ((0, 0), (pad, 0), (0, 0))),
                        np.pad(tail, ((0, 0), (pad, 0))),
                        np.pad(np.ones(tail.shape, np.float32), ((0, 0), (pad, 0))))
