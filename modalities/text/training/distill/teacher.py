"""The target's next-token distributions over a data set, cached compactly, and reduced draft vocabularies.

A dense cache of a 4,096-token vocabulary is 16 KB per position in float32 (1 MB per 64 positions); top-k
log-probabilities plus the exact log tail mass keep what the divergences need in k * 4 bytes + 4 (k = 64: 260 B).

Reduced vocabulary (FR-Spec, FastMTP's vocabulary compression): the draft's output layer covers the N most
frequent tokens of target-generated text. The teacher is the target restricted to those N tokens and
renormalised; `coverage` = Σ_{v in vocab} target(v) is the ceiling on the acceptance rate at that position.
Verification still runs on the full vocabulary, so decoding stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specgen.modalities.text.full_vocab import draft_index
from specgen.modalities.training import write_npz
from specgen.modalities.text.training.distill.divergences import TeacherTopK, teacher_top_k


@dataclass(frozen=True)
class TeacherCache:
    top_ids: np.ndarray  # [n, positions, k] int16/int32 indices (draft-vocabulary indices for a reduced draft)
    top_logp: np.ndarray  # [n, positions, k] float16
    tail_logp: np.ndarray  # [n, positions] float32 (-inf when k covers the vocabulary)
    coverage: np.ndarray  # [n, positions] float32 target mass inside the draft vocabulary (1 for a full one)

    def select(self, rows: np.ndarray, mask: np.ndarray) -> TeacherTopK:
        """The teacher at the masked positions ([len(rows), positions] bool) of `rows`, flattened in order."""
        pick = mask.astype(bool)
        return TeacherTopK(torch.from_numpy(self.top_ids[rows][pick].astype(np.int64)),
                           torch.from_numpy(self.top_logp[rows][pick].astype(np.float32)),
                           torch.from_numpy(self.tail_logp[rows][pick]))

    def save(self, path) -> None:
        write_npz(Path(path), {"top_ids": self.top_ids, "top_logp": self.top_logp, "tail_logp": self.tail_logp,
                               "coverage": self.coverage})

    @classmethod
    def load(cls, path) -> "TeacherCache":
        with np.load(path) as blob:
            return cls(*(blob[name] for name in ("top_ids", "top_logp", "tail_logp", "coverage")))


def restrict(logits: torch.Tensor, vocab_ids: torch.Tensor | None, temperature: float = 1.0):
    """(logits over the draft vocabulary [.., N], log coverage [..]) — the target renormalised on `vocab_ids`."""
    if vocab_ids is None:
        return logits, torch.zeros(logits.shape[:-1])
    scaled = logits.float() / temperature
    inside = scaled[..., vocab_ids]
    return inside * temperature, inside.logsumexp(-1) - scaled.logsumexp(-1)


@torch.no_grad()
def target_top_k(target, tokens: torch.Tensor, k: int, temperature: float = 1.0,
                 vocab_ids: torch.Tensor | None = None) -> tuple[TeacherTopK, torch.Tensor]:
    """The target's law after every input position of `tokens` [n, length]: flattened top-k ([n * length] rows)
    and log coverage [n, length]."""
    logits = target(input_ids=tokens).logits.float()  # [n, length, vocab]
    logits, log_coverage = restrict(logits, vocab_ids, temperature)
    return teacher_top_k(logits.reshape(-1, logits.shape[-1]), k, temperature), log_coverage


def score_windows(target, tokens: np.ndarray, k: int, temperature: float = 1.0, vocab_ids: torch.Tensor | None = None,
                  batch_size: int = 16) -> TeacherCache:
    """Cache the target's law after each of the first length - 1 positions of every window [n, length]."""
    import sys

    from tqdm import tqdm

    inputs = torch.from_numpy(tokens[:, :-1])
    vocab = len(vocab_ids) if vocab_ids is not None else target.config.vocab_size
    id_type = np.int16 if vocab <= np.iinfo(np.int16).max + 1 else np.int32
    parts: dict[str, list] = {"top_ids": [], "top_logp": [], "tail_logp": [], "coverage": []}
    starts = range(0, len(inputs), batch_size)
    for start in tqdm(starts, desc="target scoring", unit="batch", file=sys.stderr, disable=len(starts) < 4,
                      dynamic_ncols=True):
        chunk = inputs[start:start + batch_size]
        teacher, log_coverage = target_top_k(target, chunk, k, temperature, vocab_ids)
        shape = chunk.shape
        parts["top_ids"].append(teacher.top_ids.reshape(*shape, -1).numpy().astype(id_type))
        parts["top_logp"].append(teacher.top_logp.reshape(*shape, -1).numpy().astype(np.float16))
        parts["tail_logp"].append(teacher.tail_logp.reshape(shape).numpy().astype(np.float32))
        parts["coverage"].append(log_coverage.exp().numpy().astype(np.float32))
    return TeacherCache(**{name: np.concatenate(arrays) for name, arrays in parts.items()})


def restrict_cache(cache: TeacherCache, vocab_ids: torch.Tensor) -> TeacherCache:
    """A full-vocabulary top-k cache restricted to a reduced draft vocabulary, renormalised.

    The top-k entries inside the vocabulary keep their order and move to draft indices; the entries outside it
    become empty buckets (id 0, the always-kept padding token, with log-probability -inf). The true in-vocabulary
    mass is unknown past the top k, so it is taken as (top-k mass inside) + (the whole tail): an upper bound, which
    leaves the kept entries slightly light and the tail bucket slightly heavy. That only shapes the training
    signal; verification runs on the full vocabulary, so decoding stays exact. `coverage` holds the lower bound
    (top-k mass inside the vocabulary); held-out coverage is measured exactly on full logits."""
    vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long)
    top_ids = torch.from_numpy(cache.top_ids.astype(np.int64))
    size = max(int(top_ids.max()), int(vocab_ids.max())) + 1
    mapped = draft_index(vocab_ids, size, -1)[top_ids]  # [n, positions, k]
    inside = mapped >= 0
    top_logp = torch.from_numpy(cache.top_logp.astype(np.float32))
    inside_mass = torch.where(inside, top_logp.exp(), torch.zeros(())).sum(-1)  # [n, positions]
    tail = torch.from_numpy(cache.tail_logp.astype(np.float32))
    log_norm = torch.logaddexp(inside_mass.clamp_min(1e-30).log(), tail)
    new_logp = torch.where(inside, top_logp - log_norm[..., None], torch.tensor(float("-inf")))
    id_type = np.int16 if len(vocab_ids) <= np.iinfo(np.int16).max + 1 else np.int32
    return TeacherCache(torch.where(inside, mapped, 0).numpy().astype(id_type), new_logp.numpy().astype(np.float16),
                        (tail - log_norm).numpy().astype(np.float32),
                        (inside_mass.numpy() * cache.coverage).astype(np.float32))


def frequent_vocab(token_arrays, size: int, always=(0, 1, 2)) -> np.ndarray:
    """Target ids of a reduced vocabulary: the special ids `always` first, then the most frequent tokens of
    `token_arrays` (ties broken by id, so the choice is deterministic), `size` ids in all."""
    if size <= len(always):
        raise ValueError(f"a reduced vocabulary needs more than the {len(always)} special tokens, got {size}")
    counts = np.bincount(np.concatenate([np.asarray(a).ravel() for a in token_arrays]).astype(np.int64))
    order = np.lexsort((np.arange(len(counts)), -counts))  # most frequent first, then lowest id
    rest = [int(i) for i in order if i not in set(always) and counts[i] > 0][:size - len(always)]
    return np.array([*always, *rest], dtype=np.int64)


def shrink_vocab(model, vocab_ids: torch.Tensor):
    """Cut `model`'s embeddings (and untied head) to the rows of `vocab_ids`, plus one last row for every other
    target token (its input embedding is the mean; it is never proposed). In place; returns the model."""
    vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long)
    inputs = model.get_input_embeddings().weight.detach().clone()  # [vocab, hidden]
    head = model.get_output_embeddings().weight.detach().clone()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    model.resize_token_embeddings(len(vocab_ids) + 1, mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[:-1] = inputs[vocab_ids]
        model.get_input_embeddings().weight[-1] = inputs.mean(0)
        if not tied:
            model.get_output_embeddings().weight[:-1] = head[vocab_ids]
            model.get_output_embeddings().weight[-1] = head.mean(0)
    model.config.vocab_size = len(vocab_ids) + 1
    return model
