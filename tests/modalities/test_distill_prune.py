"""Pruned self-drafts (modalities/text/training/distill/prune.py): dropping a layer block, choosing it by angular distance."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specgen.errors import InvalidRequest
from specgen.modalities.text.training.distill.prune import angular_distances, drop_layers, least_distance_block, prune_report

torch.set_num_threads(1)
LAYERS, VOCAB = 5, 40


def tiny_llama(seed=0, layers=LAYERS, wide=False):
    """A float64 random Llama shaped like tests/tiny_models.save_tiny (in memory: nothing here needs a folder)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                         bos_token_id=0, eos_token_id=1, **({"initializer_range": 0.2} if wide else {}))
    model = LlamaForCausalLM(config).double().eval()
    if wide:  # as save_tiny(wide=True): clear top-2 margins, and a zero <eos> logit so runs go the full length
        with torch.no_grad():
            model.lm_head.weight[1] = 0
    return model


def random_ids(n, t, seed=0):
    return torch.randint(2, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("start,count", [(0, 1), (1, 2), (2, 3), (3, 2), (4, 1)])
def test_drop_layers_equals_deleting_the_layers(start, count):
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruned = drop_layers(model, start, count)
    reference = copy.deepcopy(model)  # the same computation by hand: the embedding, the kept layers, norm, head
    del reference.model.layers[start:start + count]
    ids = random_ids(3, 17)
    with torch.no_grad():
        assert torch.equal(pruned(input_ids=ids, use_cache=False).logits,
                           reference(input_ids=ids, use_cache=False).logits)
    assert type(pruned) is LlamaForCausalLM and pruned.config is not model.config
    assert pruned.config.num_hidden_layers == len(pruned.model.layers) == LAYERS - count
    assert [layer.self_attn.layer_idx for layer in pruned.model.layers] == list(range(LAYERS - count))
    assert pruned.dtype == torch.float64 and not pruned.training
    # the original is untouched: same layer count, config and values, and no storage shared with the copy
    assert model.config.num_hidden_layers == len(model.model.layers) == LAYERS
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(LAYERS))
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    ours = {p.data_ptr() for p in model.parameters()}
    assert not ours & {p.data_ptr() for p in pruned.parameters()}
    with torch.no_grad():
        next(pruned.parameters()).add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_pruned_model_decodes_with_a_kv_cache_like_full_forwards():
    """Renumbered layer_idx: the cached greedy decode of the pruned model matches its uncached forward passes."""
    pruned = drop_layers(tiny_llama(seed=3, wide=True), 1, 2)
    prompt = random_ids(1, 6, seed=1)
    new_tokens = 16
    out = pruned.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                          return_dict_in_generate=True, output_logits=True, pad_token_id=1)
    sequence = out.sequences[0]
    assert len(sequence) == prompt.shape[1] + new_tokens
    with torch.no_grad():
        for step, cached in enumerate(out.logits):  # [1, V] per step, computed with the cache (cast to float32)
            full = pruned(input_ids=sequence[None, :prompt.shape[1] + step], use_cache=False).logits[0, -1]
            torch.testing.assert_close(cached[0].double(), full, rtol=0, atol=1e-5)
            assert int(full.argmax()) == int(sequence[prompt.shape[1] + step])


def test_drop_layers_trims_per_layer_config_lists():
    """Qwen2 keeps a `layer_types` list (full / sliding attention) that must lose the dropped entries."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    types = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         use_sliding_window=True, sliding_window=3, layer_types=types)
    model = Qwen2ForCausalLM(config).double().eval()
    pruned = drop_layers(model, 1, 1)
    assert pruned.config.layer_types == ["full_attention", "full_attention", "sliding_attention"]
    assert model.config.layer_types == types
    reference = copy.deepcopy(model)
    del reference.model.layers[1]
    reference.config.layer_types = pruned.config.layer_types  # Qwen2Model picks each layer's mask from the config
    ids = random_ids(2, 12)
    with torch.no_grad():
        assert torch.equal(pruned(input_ids=ids, use_cache=False).logits,
                           reference(input_ids=ids, use_cache=False).logits)


def test_drop_layers_rejects_impossible_requests():
    model = tiny_llama(layers=3)
    for start, count in [(0, 0), (0, -1), (0, 3), (0, 4), (-1, 1), (3, 1), (2, 2)]:
        with pytest.raises(InvalidRequest):
            drop_layers(model, start, count)
    assert len(drop_layers(model, 2, 1).model.layers) == 2  # the last layer alone is fine
    with pytest.raises(InvalidRequest):
        angular_distances(model, random_ids(2, 5), block=0)
    with pytest.raises(InvalidRequest):
        angular_distances(model, random_ids(2, 5), block=3)
    with pytest.raises(InvalidRequest):
        angular_distances(model, random_ids(1, 5)[0], block=1)


@pytest.mark.parametrize("identity", [1, LAYERS - 1])
def test_angular_distance_finds_an_identity_layer(identity):
    """A layer with zero o_proj and down_proj adds nothing to the residual stream: d(l, l + 1) = 0 there. The final
    norm gets random weights, so using transformers' post-norm last hidden state for the last block would show."""
    model = tiny_llama(seed=1)
    with torch.no_grad():
        model.model.layers[identity].self_attn.o_proj.weight.zero_()
        model.model.layers[identity].mlp.down_proj.weight.zero_()
        model.model.norm.weight.uniform_(0.2, 3.0)
    model.train()
    windows = random_ids(7, 11, seed=2)
    d = angular_distances(model, windows, block=1, batch_size=3)
    assert d.dtype == torch.float64 and d.shape == (LAYERS,)
    assert model.training and all(p.grad is None for p in model.parameters())  # mode restored, no graph
    assert bool(((d >= 0) & (d <= 1)).all())
    assert float(d[identity]) < 1e-6 and float(torch.cat([d[:identity], d[identity + 1:]]).min()) > 1e-3
    assert least_distance_block(d) == identity
    torch.testing.assert_close(angular_distances(model, windows, block=1, batch_size=16), d, rtol=0, atol=1e-8)
    two = angular_distances(model, windows, block=2)
    assert two.shape == (LAYERS - 1,) and bool(((two >= 0) & (two <= 1)).all())
    report = prune_report(model, windows, block=1)
    assert report["start"] == identity and report["layers_removed"] == [identity]
    assert report["last_block_start"] == LAYERS - 1 and report["num_layers"] == LAYERS
    assert report["distances"] == pytest.approx(d.tolist(), abs=1e-8)


def test_angular_distance_by_hand():
    """d(l, l + n) from the layers' own inputs (pre-hooks, independent of hidden_states), last token, mean."""
    model = tiny_llama(seed=4)
    windows = random_ids(4, 9, seed=3)
    inputs = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: inputs.append(args[0][:, -1].clone()))
             for m in [*model.model.layers, model.model.norm]]
    with torch.no_grad():
        model(input_ids=windows, use_cache=False)
    for hook in hooks:
        hook.remove()
    h = torch.stack(inputs)  # [L + 1, N, H]: input of layer l, and the pre-norm output of the last layer
    for block in (1, 2, 4):
        cos = torch.nn.functional.cosine_similarity(h[:-block], h[block:], dim=-1)  # [L - block + 1, N]
        expected = (torch.arccos(cos) / torch.pi).mean(-1)
        torch.testing.assert_close(angular_distances(model, windows, block), expected, rtol=0, atol=1e-9)


def code_windows(count, length, max_files=5):
    """`count` evenly spaced, non-overlapping windows of the corpus tokenized as in training (<bos> text <eos>)."""
    from specgen.modalities.text.training.stdlib_corpus import load_corpus
    from specgen.modalities.text.models import ASSETS_CODE, load_tokenizer

    tok = load_tokenizer(ASSETS_CODE)
    corpus = load_corpus(max_files=max_files)
    texts = corpus.texts("train") + corpus.texts("val")
    stream = [i for e in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
              for i in (tok.bos_token_id, *e.ids, tok.eos_token_id)]
    stride = len(stream) // count
    assert stride >= length, f"{len(stream)} tokens is too few for {count} windows of {length}"
    return torch.tensor([stream[i * stride:i * stride + length] for i in range(count)])


@pytest.mark.slow  # ~3 s: the real 6-layer checkpoint on 32 x 64 tokens of stdlib code, twice
def test_angular_distances_on_the_shipped_target():
    from specgen.modalities.text.models import ASSETS_CODE

    model = LlamaForCausalLM.from_pretrained(ASSETS_CODE / "target", dtype=torch.float32)
    windows = code_windows(32, 64)
    for block in (2, 4):
        report = prune_report(model, windows, block)
        d = torch.tensor(report["distances"])
        assert d.shape == (6 - block + 1,) and bool(torch.isfinite(d).all()) and bool(((d >= 0) & (d <= 1)).all())
        print(f"\nshipped target, block {block}, 32 x 64 tokens: d = {[round(x, 4) for x in report['distances']]}; "
              f"drop layers {report['layers_removed']} (last-{block} block d = {report['last_block_distance']:.4f})")
