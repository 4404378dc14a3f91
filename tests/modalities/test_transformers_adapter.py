"""The transformers adapter: a position-indexed cache that rolls back and compacts exactly (float64, tiny
random Llama and Gemma 3 configs, sliding window 8 over 40+ tokens), ragged batches equal rows run alone,
and the whole loop on a tiny random model: greedy equality and a chi-square test against the exact target."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tiny_models

from specgen.modalities.drafters.model import ModelDrafter
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.samplers.acceptance import ChainRejection, GreedyMatch
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.loop import generate
from specgen.samplers.oracle import target_joint
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing

VOCAB = 48


def tiny_llama(seed=0, vocab=VOCAB, layers=2, hidden=32):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).double().eval()


def tiny_gemma3(seed=0):
    return tiny_models.tiny_gemma3(seed, vocab=VOCAB, hidden=32, head_dim=8, dtype=torch.float64)


def full_logits(model, tokens):
    with torch.inference_mode():
        return model(torch.as_tensor(tokens)[None]).logits[0]


@pytest.mark.parametrize("make,fast", [(tiny_llama, True), (tiny_llama, False), (tiny_gemma3, True),
                                       (tiny_gemma3, False)])
def test_rollback_and_continue_equals_a_fresh_forward(make, fast):
    """fast=True runs Llama and Gemma 3 through our compact runners; fast=False through transformers' modules."""
    model = make()
    sequence = torch.randint(0, VOCAB, (46,), generator=torch.Generator().manual_seed(1))
    reference = full_logits(model, sequence)
    target = TransformersTarget(model, fast=fast)
    assert (target.runner is not None) == fast
    target.prefill([sequence[:5]])
    position, row = 4, torch.tensor([0])
    while position < len(sequence) - 1:
        n = min(5, len(sequence) - position)
        logits = target.score(sequence[position:position + n][None], torch.arange(position, position + n)[None], row)
        assert torch.allclose(logits[0], reference[position:position + n], atol=1e-10)
        keep = min(2, n)  # roll back the rest
        target.commit(torch.arange(n)[None] < keep, row)
        position += keep
    assert position >= 44


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_tree_scoring_and_compaction(make):
    model = make()
    prompt = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(2))
    target, tree, logits, contexts = tiny_models.score_tree(model, prompt)
    for node, context in enumerate(contexts):
        assert torch.allclose(logits[0, node], full_logits(model, context)[-1], atol=1e-10)
    accepted_path = torch.tensor([[0, 1, 4]])  # keep root -> 1 -> 4 (node 4 is not adjacent to node 1)
    target.commit(tree.kept_slots(accepted_path), torch.tensor([0]))
    context = prompt.tolist() + [5, 11, 3]
    after = target.score(torch.tensor([[3]]), torch.tensor([[len(context) - 1]]), torch.tensor([0]))
    assert torch.allclose(after[0, 0], full_logits(model, context)[-1], atol=1e-10)


def test_ragged_batch_equals_rows_alone():
    model = tiny_gemma3(3)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator) for n in (3, 11, 7)]
    drafts = torch.randint(0, VOCAB, (3, 4), generator=generator)
    batch = TransformersTarget(model)
    batch.prefill(prompts)
    alone = [TransformersTarget(model) for _ in prompts]
    for target, prompt in zip(alone, prompts):
        target.prefill([prompt])
    pending = torch.tensor([int(p[-1]) for p in prompts])
    starts = torch.tensor([len(p) - 1 for p in prompts])
    accepted = torch.tensor([0, 3, 1])  # different acceptance counts per row
    for step in range(3):
        tokens = torch.cat([pending[:, None], drafts], 1)
        positions = starts[:, None] + torch.arange(5)
        logits = batch.score(tokens, positions, torch.arange(3))
        kept = torch.arange(5) < (accepted + 1)[:, None]
        batch.commit(kept, torch.arange(3))
        for r, target in enumerate(alone):
            single = target.score(tokens[r:r + 1], positions[r:r + 1], torch.tensor([0]))
            assert torch.allclose(single[0], logits[r], atol=1e-10), (step, r)
            target.commit(kept[r:r + 1], torch.tensor([0]))
        pending = tokens.gather(1, (accepted + 1)[:, None]).squeeze(1)
        starts = starts + accepted + 1
        accepted = (accepted + 1) % 4


def test_greedy_speculative_equals_plain_greedy_on_a_random_model():
    target_model, draft_model = tiny_llama(4), tiny_llama(5, layers=1, hidden=16)
    greedy = Processing(temperature=0)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([7]), torch.tensor([4, 4, 9, 10, 11])]
    plain = generate(TransformersTarget(target_model), None, GreedyMatch(), prompts, processing=greedy,
                     max_new_tokens=24)
    spec = generate(TransformersTarget(target_model), ModelDrafter(draft_model, Processing()), GreedyMatch(), prompts,
                    processing=greedy, max_new_tokens=24, policy=FixedLength(4))
    assert spec.tokens == plain.tokens
    # the target as its own (greedy) draft: everything is accepted, 5 tokens per step
    self_draft = generate(TransformersTarget(target_model), ModelDrafter(target_model, greedy), GreedyMatch(),
                          prompts, processing=greedy, max_new_tokens=24, policy=FixedLength(4))
    assert self_draft.tokens == plain.tokens and self_draft.stats["steps"] == 5


def test_self_draft_accepts_everything():
    """draft == target: every drafted token is accepted, at any temperature."""
    model = tiny_llama(6)
    processing = Processing(temperature=0.9)
    result = generate(TransformersTarget(model), ModelDrafter(model, processing), ChainRejection(),
                      [torch.tensor([3, 1])], processing=processing, max_new_tokens=20, policy=FixedLength(4))
    assert result.stats["accepted"] == result.stats["drafted"] > 0


class _ScoredByTransformers:
    """`target_joint` scores any `logits(context)`; here a plain transformers forward."""

    def __init__(self, model):
        self.model = model

    def logits(self, context):
        return full_logits(self.model, context)[-1]


@pytest.mark.slow
def test_sampling_matches_the_target_on_a_random_model():
    """Chi-square of 3-token continuations from a tiny random Llama (vocabulary 6) against its exact joint."""
    target_model, draft_model = tiny_llama(7, vocab=6), tiny_llama(8, vocab=6, layers=1, hidden=16)
    processing = Processing(temperature=1.0)
    prompt = [1, 2]
    samples = 3000
    expected = target_joint(_ScoredByTransformers(target_model), processing, prompt, 3)
    for rule, drafter in ((ChainRejection(), ModelDrafter(draft_model, Processing(temperature=1.3))),
                          (ChainRejection(), None)):
        result = generate(TransformersTarget(target_model), drafter, rule, [torch.tensor(prompt)] * samples,
                          processing=processing, max_new_tokens=3, policy=FixedLength(3), seed=11)
        fit = goodness_of_fit([tuple(t) for t in result.tokens], expected)
        assert fit.p_value > 1e-4, fit


def test_bfloat16_linears_score_a_window_as_single_steps_do(monkeypatch):
    """Where this CPU's bfloat16 matmuls are batch-invariant (AVX-512 BF16: oneDNN), a window's logits equal
    the same tokens scored one per forward bit for bit, so verification stays exact; they stay close to
    float32's. SPECGEN_MATMUL=float32 turns the choice off; a model our Llama runner does not serve is refused."""
    from specgen.errors import InvalidRequest
    from specgen.modalities.runtime import llama_runner as llama_runner

    model = tiny_llama(seed=3, hidden=64).float()
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    if not llama_runner.bf16_batch_invariant(shapes):
        pytest.skip("bfloat16 matmuls are not batch-invariant on this CPU")
    choice = torch.bfloat16
    tokens = torch.randint(0, VOCAB, (1, 30))
    served, plain = TransformersTarget(model, matmul_dtype=choice), TransformersTarget(model)
    rows = torch.arange(1)
    for target in (served, plain):
        target.prefill([tokens[0, :10]])
    window = served.score(tokens[:, 9:30], torch.arange(9, 30)[None], rows)
    one_by_one = []
    served.prefill([tokens[0, :10]])
    for position in range(9, 30):
        one_by_one.append(served.score(tokens[:, position:position + 1], torch.tensor([[position]]), rows)[:, 0])
        served.commit(torch.ones(1, 1, dtype=torch.bool), rows)
    assert torch.equal(window[0], torch.cat(one_by_one))
    reference = plain.score(tokens[:, 9:30], torch.arange(9, 30)[None], rows)
    assert torch.allclose(window, reference, atol=0.05, rtol=0.05) and not torch.equal(window, reference)
    monkeypatch.setenv("SPECGEN_MATMUL", "float32")
    assert llama_runner.fast_matmul_dtype(model) is None
    with pytest.raises(InvalidRequest, match="Llama"):
        TransformersTarget(tiny_gemma3(), matmul_dtype=torch.bfloat16)


def test_the_runner_reuses_prepared_weights_until_the_model_changes():
    # each request builds a runner; the fused weights are made once per model and rebuilt after any in-place update
    # (a draft trained while serving), so a new runner always scores with the current weights
    model = tiny_llama(seed=9).float()
    first, second = TransformersTarget(model).runner, TransformersTarget(model).runner
    assert first.layers[0]["qkv"] is second.layers[0]["qkv"]
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(3.0)  # q/k/v are fused into a copy
    fresh = TransformersTarget(model)
    assert fresh.runner.layers[0]["qkv"] is not first.layers[0]["qkv"]
    tokens = torch.tensor([[1, 2, 3]])
    fresh.prefill([tokens[0]])  # caches tokens 1 and 2: the last token's attention depends on q
    scored = fresh.score(tokens[:, 2:], torch.tensor([[2]]), torch.tensor([0]))
    assert torch.allclose(scored[0, 0], model(tokens).logits[0, 2].detach(), atol=1e-5)
