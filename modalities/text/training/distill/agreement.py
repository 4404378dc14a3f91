"""How well a draft agrees with its target: teacher-forced on held-out target samples, and in real decoding.

- α (teacher-forced, at the decoding temperature) = mean over positions of Σ_v min(target(v), draft(v)), the
  acceptance probability of one drafted token under exact speculative sampling (1 − total variation);
- greedy agreement = how often the two argmaxes match (the acceptance rate of greedy decoding);
- forward KL(target ‖ draft).
Held-out prompts come from the validation split; their continuations are the target's own samples, which is the
context a draft meets while decoding. A reduced-vocabulary draft puts zero mass outside its vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specgen.modalities.text.training.distill.windows import Windows, corpus_stream, corpus_windows, target_windows


@dataclass(frozen=True)
class HeldOut:
    windows: Windows
    # [positions, vocab] float32 log-probabilities at the masked positions, in order; for a reduced draft only
    # the columns of its vocabulary (`vocab_ids`), unnormalised, which is all α needs (the draft is 0 elsewhere)
    # and keeps a 262,144-token target's held-out set small
    target_logp: torch.Tensor
    temperature: float
    target_argmax: torch.Tensor  # [positions] the target's greedy token (full vocabulary)
    vocab_ids: torch.Tensor | None = None

    def vocab_logp(self, vocab_ids: torch.Tensor) -> torch.Tensor:
        """[positions, len(vocab_ids)] the target's log-probabilities on a reduced vocabulary."""
        if self.vocab_ids is None:
            return self.target_logp[:, vocab_ids]
        if not torch.equal(torch.as_tensor(vocab_ids), self.vocab_ids):
            raise ValueError("this held-out set was restricted to another vocabulary")
        return self.target_logp


_HELDOUT: dict[tuple, HeldOut] = {}  # per process: the cache folder is keyed by the target's weights


def heldout_set(target, tokenizer, cache: Path, *, count: int = 128, prompt_len: int = 32, new_tokens: int = 64,
                temperature: float = 1.0, seed: int = 1, max_files: int | None = None,
                vocab_ids: torch.Tensor | None = None) -> HeldOut:
    """Held-out target samples with the target's law at their continuation positions (kept only on `vocab_ids`
    when given, so it fits in memory for large vocabularies)."""
    vocab_key = None if vocab_ids is None else tuple(torch.as_tensor(vocab_ids).tolist())
    key = (str(cache), count, prompt_len, new_tokens, temperature, seed, max_files, vocab_key)
    if key not in _HELDOUT:
        _HELDOUT[key] = _heldout(target, tokenizer, cache, count, prompt_len, new_tokens, temperature, seed, max_files,
                                 vocab_ids)
    return _HELDOUT[key]


def _heldout(target, tokenizer, cache, count, prompt_len, new_tokens, temperature, seed, max_files,
             vocab_ids) -> HeldOut:
    stream = corpus_stream(tokenizer, "val", max_files, cache)
    prompts = corpus_windows(stream, count, prompt_len, new_tokens, seed)
    folder = cache / f"heldout-t{temperature:g}-n{count}-p{prompt_len}-c{new_tokens}-s{seed}"
    windows = target_windows(target, prompts, new_tokens, temperature, seed, folder)
    scale = temperature if temperature > 0 else 1.0
    vocab_ids = None if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.long)
    logp, argmax = [], []
    for logits in _masked_logits(target, torch.from_numpy(windows.tokens[:, :-1]), windows):
        full = torch.log_softmax(logits / scale, -1)
        argmax.append(full.argmax(-1))
        logp.append(full if vocab_ids is None else full[:, vocab_ids])
    return HeldOut(windows, torch.cat(logp), temperature, torch.cat(argmax), vocab_ids)


@torch.no_grad()
def _masked_logits(model, inputs: torch.Tensor, windows: Windows, batch_size: int = 16):
    """[positions, vocab] float32 logits at the windows' continuation positions, batch by batch, in order (so
    the whole [n, length, vocab] block is never held)."""
    mask = torch.from_numpy(windows.loss_mask)
    for i in range(0, len(inputs), batch_size):
        yield model(input_ids=inputs[i:i + batch_size]).logits.float()[mask[i:i + batch_size]]


@torch.no_grad()
def teacher_forced(draft, heldout: HeldOut, vocab_ids: torch.Tensor | None = None, to_draft=None,
                   batch_size: int = 16) -> dict:
    """α, greedy agreement and KL(target ‖ draft) of `draft` on `heldout` (a reduced draft reads target ids
    through `to_draft` and puts its law on `vocab_ids`, zero elsewhere)."""
    was_training = draft.training
    draft.eval()
    inputs = torch.from_numpy(heldout.windows.tokens[:, :-1])
    if to_draft is not None:
        inputs = to_draft[inputs]
    logits = torch.cat(list(_masked_logits(draft, inputs, heldout.windows, batch_size)))  # [positions, draft_vocab]
    draft.train(was_training)
    scale = heldout.temperature if heldout.temperature > 0 else 1.0
    if vocab_ids is None:
        target_logp = heldout.target_logp
        draft_logp = torch.log_softmax(logits / scale, -1)
        draft_argmax = draft_logp.argmax(-1)
        fkl = float((target_logp.exp() * (target_logp - draft_logp)).sum(-1).mean())
    else:  # KL(target || draft) is infinite outside the vocabulary: report it for the renormalised restriction
        vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long)
        target_logp = heldout.vocab_logp(vocab_ids)
        draft_logp = torch.log_softmax(logits[:, :len(vocab_ids)] / scale, -1)
        draft_argmax = vocab_ids[draft_logp.argmax(-1)]
        inside = torch.log_softmax(target_logp, -1)
        fkl = float((inside.exp() * (inside - draft_logp)).sum(-1).mean())
    return {"alpha": float(torch.minimum(target_logp.exp(), draft_logp.exp()).sum(-1).mean()),
            "greedy_agreement": float((heldout.target_argmax == draft_argmax).float().mean()),
            "fkl" if vocab_ids is None else "fkl_in_vocab": fkl, "positions": int(len(target_logp))}


def speculative_alpha(generator, prompts: list[str], *, temperature: float, num_draft_tokens: int = 4,
                      max_new_tokens: int = 64, seed: int = 0) -> dict:
    """Acceptance in real speculative decoding with `generator`'s current draft, pooled over `prompts`."""
    drafted = accepted = rejections = steps = committed = 0
    wall_s = 0.0
    for i, prompt in enumerate(prompts):
        result = generator.generate(prompt, method="draft", temperature=temperature, seed=seed + i,
                                    max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens)
        stats = result.stats
        drafted += stats["drafted"]
        accepted += stats["accepted"]
        rejections += stats["rejections"]
        steps += stats["steps"]
        committed += stats["committed"]
        wall_s += stats["wall_s"]
    return {"acceptance_rate": accepted / max(drafted, 1), "alpha_hat": accepted / max(accepted + rejections, 1),
            "tau": committed / max(steps, 1), "steps": steps, "prompts": len(prompts),
            "tokens_per_s": committed / wall_s if wall_s else None}
