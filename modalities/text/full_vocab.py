"""A reduced-vocabulary draft seen through the target's full vocabulary, for Hugging Face assisted generation.

Our drafter maps a reduced draft's law into target ids itself (`ModelDrafter(vocab_ids=...)`). Hugging Face's
assisted generation expects an assistant that reads and scores target ids, so the bench hands it this view:
the same module and weights, reading target ids through the id map (tokens outside the vocabulary read the
draft's <unk> row) and returning logits over the whole target vocabulary, -inf outside the draft's. Only the
last dimension of the logits grows; the draft's own computation, and so its cost, is unchanged.
"""

from __future__ import annotations

import copy

import torch


def draft_index(vocab_ids: torch.Tensor, size: int, outside: int) -> torch.Tensor:
    """[size] the draft row of every target id below `size`: its index in `vocab_ids`, `outside` for the rest
    (a reduced draft's <unk> row, len(vocab_ids), or -1 to mark them)."""
    vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long)
    index = torch.full((size,), outside, dtype=torch.long)
    index[vocab_ids] = torch.arange(len(vocab_ids))
    return index


def full_vocab_view(draft, vocab_ids: torch.Tensor, target_vocab_size: int):
    """A shallow copy of `draft` (shared weights) that takes target ids and returns target-vocabulary logits."""
    vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long)
    to_draft = draft_index(vocab_ids, target_vocab_size, len(vocab_ids))  # outside -> the <unk> row
    base = type(draft)

    class FullVocabDraft(base):
        def forward(self, input_ids=None, *args, **kwargs):
            out = base.forward(self, to_draft[input_ids] if input_ids is not None else None, *args, **kwargs)
            inside = out.logits[..., :len(vocab_ids)]  # the <unk> row is never proposed
            logits = inside.new_full((*inside.shape[:-1], target_vocab_size), float("-inf"))
            logits[..., vocab_ids] = inside
            out.logits = logits
            return out

    FullVocabDraft.__name__ = FullVocabDraft.__qualname__ = f"FullVocab{base.__name__}"
    view = copy.copy(draft)  # the module dicts are copied, the submodules and parameters shared
    view.__dict__["_modules"] = dict(draft._modules)
    view.config = copy.deepcopy(draft.config)
    view.config.vocab_size = target_vocab_size
    view.generation_config = copy.deepcopy(draft.generation_config)
    view.__class__ = FullVocabDraft
    return view
