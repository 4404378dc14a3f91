"""The draft's compiled decoding step (`kernels.decode_step`) against its torch twin, the runner's own forward."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specgen.kernels import decode_step
from specgen.modalities.runtime.transformers_adapter import TransformersTarget

pytestmark = pytest.mark.skipif(not decode_step.available(), reason="the CPU kernel does not build here")


def _model(kv_heads: int, layers: int, dtype=torch.float32, heads: int = 4, hidden: int = 128) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, vocab_size=50, max_position_embeddings=256)
    return LlamaForCausalLM(config).to(dtype).eval()


def _engine(model, kernel: bool) -> TransformersTarget:
    engine = TransformersTarget(model, capacity=256, decode_kernel=kernel)
    engine.prefill([torch.randint(0, 50, (7,), generator=torch.Generator().manual_seed(row)) for row in range(3)])
    return engine


def _run(engine, window: int, steps: int):
    """`steps` forwards of `window` new tokens per row, committing 1..window of them (all rows alike)."""
    logits = []
    for step in range(steps):
        tokens = torch.randint(0, 50, (3, window), generator=torch.Generator().manual_seed(100 + step))
        positions = engine.cache.lengths[:, None] + torch.arange(window)
        logits.append(engine.score(tokens, positions, torch.arange(3)))
        kept = (torch.arange(window) <= step % window).expand(3, window)
        engine.commit(kept, torch.arange(3))
    return torch.stack(logits), engine.cache


@pytest.mark.parametrize("kv_heads,layers,window,heads,hidden", [
    (1, 1, 1, 4, 128), (4, 2, 1, 4, 128), (2, 3, 1, 4, 128), (2, 2, 4, 4, 128),
    (1, 2, 3, 2, 128),  # head size 64
    (4, 1, 3, 8, 128),  # 16: the attention's run-time head size
    (2, 1, 3, 8, 96),  # 12: not a multiple of 8, one key at a time
])
def test_kernel_matches_the_torch_forward(kv_heads, layers, window, heads, hidden):
    model = _model(kv_heads, layers, heads=heads, hidden=hidden)
    (fast, fast_cache), (slow, slow_cache) = (_run(_engine(model, kernel), window, 40) for kernel in (True, False))
    assert torch.allclose(fast, slow, atol=2e-5, rtol=0), (fast - slow).abs().max()
    length = int(slow_cache.lengths.max())
    for layer in range(layers):  # the keys and values it wrote are the ones the torch path writes
        assert torch.allclose(fast_cache.keys[layer][:, :, :length], slow_cache.keys[layer][:, :, :length], atol=2e-5)
        assert torch.allclose(fast_cache.values[layer][:, :, :length], slow_cache.values[layer][:, :, :length],
                              atol=2e-5)


def test_a_layer_without_an_mlp_matches_the_torch_forward_and_adds_nothing():
    """A layer whose MLP has width 0 (a Kangaroo adapter) beside full layers: the kernel skips it, torch's empty
    product adds 0.0, and both equal the same layer with an all-zero MLP."""
    model = _model(2, 3)
    engines = {kind: (_engine(model, True), _engine(model, False)) for kind in ("empty", "zeros")}
    for kind, pair in engines.items():
        for engine in pair:
            layer = engine.runner.layers[1]
            width = 0 if kind == "empty" else layer["down"].shape[1]
            engine.runner.layers[1] = dict(layer, gate_up=torch.zeros(2 * width, 128), down=torch.zeros(128, width))
            engine.runner._decode_arguments = None  # the kernel's copy of the weights, made at the prefill
    results = {kind: [_run(engine, 3, 12)[0] for engine in pair] for kind, pair in engines.items()}
    assert torch.allclose(results["empty"][0], results["empty"][1], atol=2e-5, rtol=0)  # kernel against torch
    assert torch.equal(results["empty"][0], results["zeros"][0])  # kernel: skipped = all-zero MLP, bit for bit
    assert torch.equal(results["empty"][1], results["zeros"][1])  # torch: the same


def test_a_stack_cut_at_kept_layers_gives_the_same_bits_and_their_states():
    """`keep_layers` runs the compiled stack in segments: the logits are bit for bit one call's, and the kept
    states are the torch path's residual stream after those layers."""
    model = _model(2, 3)
    whole, cut, slow = _engine(model, True), _engine(model, True), _engine(model, False)
    for engine in (cut, slow):
        engine.runner.keep_layers = (1, 2)
    tokens = torch.randint(0, 50, (3, 4), generator=torch.Generator().manual_seed(5))
    positions = whole.cache.lengths[:, None] + torch.arange(4)
    assert torch.equal(whole.score(tokens, positions, torch.arange(3)), cut.score(tokens, positions, torch.arange(3)))
    slow.score(tokens, positions, torch.arange(3))
    for layer in (1, 2):
        assert torch.allclose(cut.runner.layer_hidden[layer], slow.runner.layer_hidden[layer], atol=2e-5)


@pytest.mark.parametrize("window", [1, 3])
def test_rows_at_different_lengths_each_write_and_read_their_own_slots(window):
    """Rows at different lengths, a subset of the batch in another order: the kernel (no mask) against the
    torch path's explicit mask."""
    model = _model(2, 2)
    engines = [_engine(model, kernel) for kernel in (True, False)]
    kept = torch.tensor([[True, True, True], [True, False, False], [True, True, False]])
    rows = torch.tensor([2, 0])
    outputs = []
    for engine in engines:
        tokens = torch.randint(0, 50, (3, 3), generator=torch.Generator().manual_seed(7))
        engine.score(tokens, engine.cache.lengths[:, None] + torch.arange(3), torch.arange(3))
        engine.commit(kept, torch.arange(3))
        hidden = torch.randint(0, 50, (2, window), generator=torch.Generator().manual_seed(8))
        outputs.append(engine.score(hidden, engine.cache.lengths[rows][:, None] + torch.arange(window), rows))
        engine.commit(torch.ones(2, window, dtype=torch.bool), rows)
    assert torch.allclose(*outputs, atol=2e-5)
    fast, slow = (engine.cache for engine in engines)
    assert torch.equal(fast.lengths, slow.lengths)
    for row, length in enumerate(slow.lengths.tolist()):
        assert torch.allclose(fast.keys[1][row, :, :length], slow.keys[1][row, :, :length], atol=2e-5)


@pytest.mark.parametrize("heads", [4, 2])  # head sizes 32 and 64
def test_a_ragged_window_skips_its_padding_and_scores_the_same_bits(heads):
    """Rows drafting different numbers of tokens: with `valid`, only the real slots go through the kernel (each as a
    one-slot row at its own cache slot), bit for bit as in the padded window, padding scored zero; the keys kept
    afterwards are the same, and so is the next step."""
    model = _model(2, 2, heads=heads)
    engines = [_engine(model, True) for _ in range(2)]
    valid = torch.tensor([5, 2, 1])
    kept = torch.arange(5) < torch.tensor([4, 2, 1])[:, None]
    outputs = []
    for engine, packed in zip(engines, (True, False)):
        step = []
        for seed in (9, 10):
            tokens = torch.randint(0, 50, (3, 5), generator=torch.Generator().manual_seed(seed))
            positions = engine.cache.lengths[:, None] + torch.arange(5)
            step.append(engine.score(tokens, positions, torch.arange(3), None, valid if packed else None))
            engine.commit(kept, torch.arange(3))
        outputs.append(torch.stack(step))
    packed, padded = outputs
    real = torch.arange(5) < valid[:, None]  # [rows, 5]
    assert torch.equal(packed[:, real], padded[:, real])
    assert not packed[:, ~real].any()
    fast, slow = (engine.cache for engine in engines)
    assert torch.equal(fast.lengths, slow.lengths)
    for row, length in enumerate(slow.lengths.tolist()):
        assert torch.equal(fast.keys[1][row, :, :length], slow.keys[1][row, :, :length])


def test_only_float32_runners_that_opt_in_use_it():
    model = _model(2, 1)
    plain = TransformersTarget(model, capacity=64)
    assert not decode_step.usable(plain.runner, torch.float32, None)  # an engine that did not opt in
    draft = TransformersTarget(model, capacity=64, decode_kernel=True)
    assert decode_step.usable(draft.runner, torch.float32, None)
    assert not decode_step.usable(draft.runner, torch.float32, torch.zeros(1, 1, 1, 1))  # an explicit mask
    assert not decode_step.usable(draft.runner, torch.float32, None, decode_step.MAX_SLOTS + 1)  # past the cap
    assert not decode_step.usable(TransformersTarget(_model(2, 1, torch.float64), capacity=64,
                                                     decode_kernel=True).runner, torch.float64, None)


def test_every_token_gets_the_same_bits_alone_in_a_window_in_a_tree_and_in_a_batch():
    """The kernel's arithmetic per token does not depend on the call: a window of 6 equals 6 single steps, a tree
    node equals the chain of its path, and a row of a ragged batch equals the row alone, bit for bit."""
    model = _model(2, 2)
    prompt = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(3))
    rest = torch.randint(0, 50, (6,), generator=torch.Generator().manual_seed(4))

    def engine(prompts):
        target = TransformersTarget(model, capacity=64, decode_kernel=True)
        target.prefill(prompts)
        return target

    window = engine([prompt]).score(torch.cat([prompt[-1:], rest[:5]])[None], (11 + torch.arange(6))[None],
                                    torch.tensor([0]))
    alone, singles = engine([prompt]), []
    for j, token in enumerate(torch.cat([prompt[-1:], rest[:5]]).tolist()):
        singles.append(alone.score(torch.tensor([[token]]), torch.tensor([[11 + j]]), torch.tensor([0]))[:, 0])
        alone.commit(torch.ones(1, 1, dtype=torch.bool), torch.tensor([0]))
    assert torch.equal(window[0], torch.stack(singles, 1)[0])

    from specgen.samplers.types import DraftTree

    tree = DraftTree(torch.cat([prompt[-1:], rest[:3]])[None], torch.tensor([[-1, 0, 0, 2]]))  # 1 and 2 siblings
    scored = engine([prompt]).score(tree.tokens, 11 + tree.depths, torch.tensor([0]), tree.ancestor_mask)
    path = engine([prompt]).score(tree.tokens[:, [0, 2, 3]], (11 + torch.arange(3))[None], torch.tensor([0]))
    assert torch.equal(scored[0, [0, 2, 3]], path[0])

    other = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(5))
    batch = engine([other, prompt]).score(torch.stack([other[-1:], prompt[-1:]]), torch.tensor([[8], [11]]),
                                          torch.tensor([0, 1]))
    assert torch.equal(batch[1], window[0, :1])


def test_tree_windows_match_the_torch_mask_path_and_rows_linear_is_row_invariant():
    model = _model(2, 2)
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 1, 0]])
    from specgen.samplers.types import DraftTree

    tree = DraftTree(torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(6)), parents)
    outputs = []
    for kernel in (True, False):
        engine = _engine(model, kernel)
        rows = torch.tensor([0, 2])
        outputs.append(engine.score(tree.tokens, engine.cache.lengths[rows][:, None] + tree.depths, rows,
                                    tree.ancestor_mask))
    assert torch.allclose(*outputs, atol=2e-5)
    x, weight = torch.randn(7, 130), torch.randn(33, 130)
    together = decode_step.linear_rows(x, weight)
    assert torch.allclose(together, x @ weight.T, atol=1e-4)
    assert all(torch.equal(decode_step.linear_rows(x[i:i + 1], weight)[0], together[i]) for i in range(7))


@pytest.mark.parametrize("ins", [16, 130, 384])
def test_tiled_rows_product_gives_each_row_its_own_bits_at_every_row_count(ins):
    """Row groups of 4, 3, 2 and 1 against output tiles with a remainder (37 outputs) and an input tail (130):
    each row equals itself alone, for every row count up to 13 (a verified chain of 12 drafts)."""
    generator = torch.Generator().manual_seed(ins)
    x, weight = torch.randn(13, ins, generator=generator), torch.randn(37, ins, generator=generator)
    alone = torch.stack([decode_step.linear_rows(x[i:i + 1], weight)[0] for i in range(13)])
    assert torch.allclose(alone, x @ weight.T, atol=1e-4)
    for rows in range(2, 14):
        assert torch.equal(decode_step.linear_rows(x[:rows], weight), alone[:rows]), rows


def test_text_targets_score_a_window_as_single_steps_bit_for_bit(tmp_path):
    """A text target serves every forward through the kernel: after a prompt longer than a draft's old cap
    (64 slots), a verified window of 13 gets the logits 13 plain steps get, and a second batch row changes none."""
    from specgen.modalities.text.generator import TextGenerator
    from tests.tiny_models import save_tiny_pair

    generator = TextGenerator(*save_tiny_pair(tmp_path))
    target = generator.target(256)
    assert target.runner.decode_kernel
    vocab = generator.model.config.vocab_size
    prompt = torch.randint(0, vocab, (90,), generator=torch.Generator().manual_seed(1))
    window = torch.randint(0, vocab, (13,), generator=torch.Generator().manual_seed(2))
    target.prefill([prompt])
    scored = target.score(window[None], (90 + torch.arange(13))[None], torch.tensor([0]))[0]
    singles = generator.target(256)
    singles.prefill([prompt])
    for j, token in enumerate(window.tolist()):
        logits = singles.score(torch.tensor([[token]]), torch.tensor([[90 + j]]), torch.tensor([0]))[0, 0]
        assert torch.equal(logits, scored[j]), j
        singles.commit(torch.ones(1, 1, dtype=torch.bool), torch.tensor([0]))
    other = torch.randint(0, vocab, (40,), generator=torch.Generator().manual_seed(3))
    batch = generator.target(256)
    batch.prefill([other, prompt])
    both = batch.score(torch.stack([window, window]), torch.stack([40 + torch.arange(13), 90 + torch.arange(13)]),
                       torch.tensor([0, 1]))
    assert torch.equal(both[1], scored)


def test_rows_rms_norm_matches_torch_and_gives_each_row_its_own_bits():
    generator = torch.Generator().manual_seed(9)
    x, scale = torch.randn(2, 5, 3, 256, generator=generator), 1 + torch.randn(256, generator=generator)
    normed = decode_step.rms_norm(x, scale, 1e-6)
    assert torch.allclose(normed, torch.nn.functional.rms_norm(x, (256,), scale, 1e-6), atol=1e-5)
    alone = decode_step.rms_norm(x[1, 3:4, 2:3], scale, 1e-6)
    assert torch.equal(alone[0, 0], normed[1, 3, 2])


# ---- early exit's pieces (modalities/text/early_exit.py) ---------------------------------------------------------


def test_layer_ranges_chain_to_the_whole_stacks_bits_on_both_paths():
    """A forward run layer by layer (an early exit's) gives the one call's bits with the kernel, and its torch twin
    the torch forward's; both write the same keys."""
    model = _model(2, 3)
    hidden = torch.randn(3, 1, 128, generator=torch.Generator().manual_seed(5))
    outputs = {}
    for kernel in (True, False):
        whole, split = _engine(model, kernel), _engine(model, kernel)
        positions = whole.cache.lengths[:, None].clone()
        for engine in (whole, split):
            engine.cache.begin(torch.arange(3), 1)
        one = whole.runner.forward_hidden(hidden, positions, whole.cache, None)
        stepped = hidden
        for index in range(3):
            stepped = split.runner.forward_hidden(stepped, positions, split.cache, None, layers=range(index, index + 1))
        assert torch.equal(stepped, one)
        for index in range(3):
            assert torch.equal(split.cache.keys[index][:, :, :8], whole.cache.keys[index][:, :, :8])
        outputs[kernel] = one
    torch.testing.assert_close(outputs[True], outputs[False], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("rows,controller", [(1, 64), (3, 8)])
def test_the_controller_kernel_matches_its_torch_twin(rows, controller):
    from specgen.modalities.text.early_exit import ExitModules

    model = _model(2, 3)
    modules = ExitModules.from_target(model, controller_size=controller).eval().requires_grad_(False)
    hidden = 3 * torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    for layer in (1, 3):
        twin = modules.action_logits(layer, hidden).softmax(-1)
        torch.testing.assert_close(modules.action_probs(layer, hidden), twin, atol=1e-6, rtol=1e-5)


def test_state_copying_kernel_matches_its_torch_twin():
    """The keys and values of layers 1..2 written from one frozen state: the compiled call and the torch ops."""
    from specgen.modalities.text.early_exit import EarlyExitTarget, ExitModules

    model = _model(2, 3)
    modules = ExitModules.from_target(model, controller_size=8)
    frozen = torch.randn(3, 1, 128, generator=torch.Generator().manual_seed(9))
    caches = []
    for kernel in (True, False):
        engine = _engine(model, kernel)
        target = EarlyExitTarget(engine, modules, exit_threshold=0.5, stop_threshold=1.0, stop_token=None)
        positions = engine.cache.lengths[:, None].clone()
        engine.cache.begin(torch.arange(3), 1)
        target._copy_states(frozen, positions, engine.cache, range(1, 3))
        caches.append(engine.cache)
    for index in (1, 2):
        for kernel_store, torch_store in ((caches[0].keys, caches[1].keys), (caches[0].values, caches[1].values)):
            assert kernel_store[index][:, :, 6].abs().max() > 0  # the slot after the 6 cached prompt tokens
            torch.testing.assert_close(kernel_store[index][:, :, :8], torch_store[index][:, :, :8], atol=1e-5,
                                       rtol=1e-4)
