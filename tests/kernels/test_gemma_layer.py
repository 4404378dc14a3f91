"""The served Gemma's compiled layer glue (`kernels.gemma_layer`) against its torch twin, the runner's own loop:
the same logits bit for bit for prompts, chain windows, a tree and a ragged batch."""

import pytest
import torch

from specgen.kernels import ancestor_mask, gemma_layer
from specgen.modalities.runtime.int8_linear import quantize_model
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.samplers import trees
from tiny_models import tiny_gemma3

LENGTHS = (6, 13, 9)  # ragged rows, the longest past the sliding window of 8

pytestmark = pytest.mark.skipif(not gemma_layer.available(), reason="the CPU kernel does not build here")


def _prompt(model, length: int) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(length))


def _engine(model, glue: bool) -> TransformersTarget:
    engine = TransformersTarget(model, capacity=128)
    assert engine.runner.uses_glue()
    engine.runner._glue = glue
    engine.prefill([_prompt(model, length) for length in LENGTHS])
    return engine


def _forwards(engine) -> list[torch.Tensor]:
    """Chain windows of 1, 3 and 5 slots over all rows, committing a different prefix per row, then a tree."""
    vocab, rows, out = engine.vocab_size, torch.arange(3), []
    for step, window in enumerate((1, 3, 5, 2)):
        tokens = torch.randint(0, vocab, (3, window), generator=torch.Generator().manual_seed(50 + step))
        positions = engine.cache.lengths[:, None] + torch.arange(window)
        out.append(engine.score(tokens, positions, rows))
        engine.commit(torch.arange(window)[None] <= torch.tensor([[0], [window - 1], [window // 2]]), rows)
    # a tree: node 0 the pending token, 1 and 2 its children, 3 a child of 2
    parents = [-1, 0, 0, 2]
    mask = ancestor_mask(torch.tensor([parents])).expand(3, 4, 4)
    tokens = torch.randint(0, vocab, (3, 4), generator=torch.Generator().manual_seed(9))
    depth = torch.tensor(trees.depths_of(parents))
    out.append(engine.score(tokens, engine.cache.lengths[:, None] + depth, rows, mask))
    return out


def test_the_glue_scores_every_slot_as_the_torch_loop_bit_for_bit():
    model = quantize_model(tiny_gemma3(5))
    compiled, plain = _forwards(_engine(model, True)), _forwards(_engine(model, False))
    for a, b in zip(compiled, plain):
        assert torch.equal(a, b)


def test_a_row_gets_the_same_bits_alone_as_in_the_batch():
    model = quantize_model(tiny_gemma3(6))
    batch = _engine(model, True)
    tokens = torch.randint(0, model.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(3))
    positions = batch.cache.lengths[:, None] + torch.arange(4)
    scored = batch.score(tokens, positions, torch.arange(3))
    for row in range(3):
        alone = TransformersTarget(model, capacity=128)
        alone.runner._glue = True
        alone.prefill([_prompt(model, LENGTHS[row])])
        for slot in range(4):  # one slot at a time, as plain decoding scores them
            logits = alone.score(tokens[row:row + 1, slot:slot + 1], positions[row:row + 1, slot:slot + 1],
                                 torch.tensor([0]))
            alone.commit(torch.ones(1, 1, dtype=torch.bool), torch.tensor([0]))
            assert torch.equal(logits[0, 0], scored[row, slot]), (row, slot)


def test_dense_layers_keep_the_torch_loop():
    assert not TransformersTarget(tiny_gemma3(7)).runner.uses_glue()
