"""Self-distillation data for the head: the target's own samples (at the guidance it decodes with by default) and its
features over them, for the conditioned row and the unconditioned twin alike (guided decoding drafts both).

Chunks are written atomically under RUN/samples/, so an interrupted run resumes at the next missing chunk; a chunk
is a pure function of (seed, chunk index)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specgen.modalities.training import atomic_write
from specgen.modalities.image.conditions import ImageVocab

CHUNK = 64  # prompts per chunk


def chunk_prompts(index: int, seed: int, size: int = CHUNK) -> list[str]:
    """The chunk's prompts, drawn like the target's training conditions: full prompts, one in ten the class."""
    from specgen.modalities.image.training.images import make_item

    items = [make_item(index * size + i, seed=seed + 1000) for i in range(size)]
    return [item.cls if (index * size + i) % 10 == 9 else item.prompt for i, item in enumerate(items)]


@torch.no_grad()
def target_features(model, ids: torch.Tensor) -> torch.Tensor:
    """The target's final-normed hidden states over whole sequences: [rows, T, d]."""
    return model.model(input_ids=ids).last_hidden_state


def sequences(vocab: ImageVocab, prompts: list[str], codes: torch.Tensor) -> torch.Tensor:
    """[2B, P + 256]: the conditioned rows, then their unconditioned twins, each followed by the codes."""
    cond = torch.stack([vocab.prompt_ids(p) for p in prompts])
    uncond = vocab.uncond_ids().expand(len(prompts), -1)
    flat = codes.reshape(len(prompts), -1).long()
    return torch.cat([torch.cat([cond, flat], 1), torch.cat([uncond, flat], 1)])


def make_chunks(model, vocab: ImageVocab, folder: Path, chunks: int, seed: int, *, size: int = CHUNK,
                guidance: float = 3.0, top_k: int = 50) -> list[Path]:
    """Write (or find) `chunks` chunk files of `size` prompts: prompts, ids [2 size, T] (conditioned rows, then
    their unconditioned twins) and fp16 features [2 size, T, d]."""
    from tqdm import tqdm

    from specgen.modalities.image.models import sample_codes

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"chunk-{i:05d}.pt" for i in range(chunks)]
    missing = [i for i, p in enumerate(paths) if not p.exists()]
    for i in tqdm(missing, desc="target samples", file=sys.stderr, disable=not missing):
        prompts = chunk_prompts(i, seed, size)
        generator = torch.Generator().manual_seed(seed * 100_003 + i)
        codes = sample_codes(model, vocab, prompts, guidance=guidance, top_k=top_k, generator=generator)
        ids = sequences(vocab, prompts, codes)
        features = target_features(model, ids).half()
        blob = {"prompts": prompts, "ids": ids.short(), "features": features}
        atomic_write(paths[i], lambda p: torch.save(blob, p))
    return paths
