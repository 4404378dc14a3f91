"""The model tree drafter (sequoia, dyspec, eagle2) on tiny random transformers pairs: the laws it stores are the
draft's laws at each node's context, greedy output equals plain decoding token for token, sampling is
reproducible, and sampled outputs follow the target's distribution (chi-square)."""

import pytest
import torch

from tiny_models import HFTable, save_tiny_pair
from specgen.modalities.drafters.model import ModelDrafter
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.modalities.drafters.tree import TreeDrafter, parse_accept_probs, tree_drafter
from specgen.errors import InvalidRequest
from specgen.samplers import trees
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers.processing import Processing
from specgen.samplers.registry import get_method
from specgen.samplers.types import DecodeContext

TREE_METHODS = ("sequoia", "dyspec", "eagle2")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("tree-models"), wide=True)


@pytest.fixture(scope="module")
def generator(pair):
    return TextGenerator(*pair)


@pytest.mark.parametrize("construction", ["static", "dyspec", "eagle2"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_stored_laws_are_the_draft_laws_at_each_node(pair, construction, temperature):
    """Every node's law comes from one tree-masked forward; it must equal a plain forward over context + path."""
    draft = load_causal_lm(pair[1])
    processing = Processing(temperature=temperature)
    drafter = TreeDrafter(draft, processing, construction=construction, shape=trees.k_ary_shape(2, 2), budget=6,
                          top_k=2, depth=3, max_depth=4)
    contexts = [torch.tensor([0, 5, 6, 7, 8]), torch.tensor([0, 9, 3])]  # ragged rows
    ctx = DecodeContext(contexts, torch.arange(2), torch.arange(2), seed=3)
    laws = {}
    original = drafter._score_trees

    def spy(ctx_, builders, index, requests):
        out = original(ctx_, builders, index, requests)
        for b, i, got in zip(builders, index, out):
            for node, law in got.items():
                laws[(i, tuple(b.path(node)))] = law
        return out

    drafter._score_trees = spy
    tree = drafter.propose(ctx, 4)
    assert laws, "the tree grew past the root"
    ranking = processing if temperature > 0 else Processing(temperature=1.0)
    for (i, path), law in laws.items():
        ids = torch.cat([contexts[i], torch.tensor(path, dtype=torch.long)])[None]
        with torch.no_grad():
            expected = ranking(draft(input_ids=ids).logits[0, -1])
        assert torch.allclose(law, expected, atol=1e-5), (i, path)
    assert tree.tokens[:, 0].tolist() == [8, 3]
    if temperature > 0 and construction != "eagle2":
        assert drafter.siblings == "without_replacement" and tree.draft_probs is not None
    else:
        assert drafter.siblings == "deterministic"


@pytest.mark.parametrize("method,params", [("sequoia", {}), ("sequoia", {"shape": "eagle"}), ("dyspec", {}),
                                           ("eagle2", {}), ("dyspec", {"tree_budget": 3, "max_depth": 2}),
                                           ("dyspec", {"rank_temperature": 1.0, "per_round": 1})])
def test_greedy_tree_methods_equal_plain_decoding(generator, method, params):
    plain = generator.generate("abc abc abc (x", method="ar", max_new_tokens=40)
    spec = generator.generate("abc abc abc (x", method=method, max_new_tokens=40, **params)
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.stats["lossless"] and spec.stats["steps"] <= plain.stats["steps"]


def test_a_sharper_ranking_law_grows_dyspec_along_the_likely_path(pair):
    """At temperature 0 DySpec ranks candidates by the draft's path probabilities at `rank_temperature`: a sharper
    law (0.1) gives the draft's first choices more weight than their siblings, so the same budget goes deeper."""
    draft = load_causal_lm(pair[1])
    contexts = [torch.tensor([0, 5, 6, 7, 8]), torch.tensor([0, 9, 3])]
    depths = {}
    for rank_temperature in (1.0, 0.1):
        drafter = TreeDrafter(draft, Processing(temperature=0.0), construction="dyspec", budget=8, max_depth=8,
                              rank_temperature=rank_temperature, per_round=1)
        tree = drafter.propose(DecodeContext(contexts, torch.arange(2), torch.arange(2), seed=0), 8)
        depths[rank_temperature] = sum(max(trees.depths_of(row)) for row in tree.parents.tolist())
    assert depths[0.1] > depths[1.0], depths


def test_greedy_batch_rows_equal_plain_decoding(generator):
    plain = generator.generate("ab", method="ar", max_new_tokens=30)
    spec = generator.generate("ab", method="dyspec", max_new_tokens=30, num_samples=3)
    assert all(s["tokens"] == plain.tokens for s in spec.samples)


@pytest.mark.parametrize("method", TREE_METHODS)
def test_sampling_is_reproducible(generator, method):
    first = generator.generate("ab", method=method, temperature=1.0, seed=3, num_samples=3, max_new_tokens=12)
    again = generator.generate("ab", method=method, temperature=1.0, seed=3, num_samples=3, max_new_tokens=12)
    assert [s["tokens"] for s in first.samples] == [s["tokens"] for s in again.samples]
    assert len({tuple(s["tokens"]) for s in first.samples}) > 1


def test_knobs_are_checked(generator):
    with pytest.raises(InvalidRequest):
        generator.generate("ab", method="sequoia", shape="bush", max_new_tokens=4)
    with pytest.raises(InvalidRequest):
        generator.generate("ab", method="sequoia", accept_probs="0.9,0.5", max_new_tokens=4)
    with pytest.raises(InvalidRequest):
        generator.generate("ab", method="dyspec", tree_budget=0, max_new_tokens=4)
    for bad in ({"rank_temperature": 0.0}, {"per_round": -1}):
        with pytest.raises(InvalidRequest):
            generator.generate("ab", method="dyspec", max_new_tokens=4, **bad)
    assert parse_accept_probs("0.5, 0.2") == [0.5, 0.2]
    knobs = get_method("text", "sequoia").resolve_knobs({"tree_budget": 7})
    drafter = tree_drafter("tree-static", generator.draft_model, Processing(), knobs)
    assert len(drafter.shape) == 8 and drafter.max_nodes == 8


@pytest.mark.slow
@pytest.mark.parametrize("method", TREE_METHODS)
def test_sampled_tree_methods_follow_the_target(generator, method):
    processing = Processing(temperature=1.0, top_k=4)  # few cells: a strong test with few samples
    samples = 2000
    result = generator.generate("ab", method=method, temperature=1.0, top_k=4, seed=11, num_samples=samples,
                                max_new_tokens=3)
    prompt = generator.encode("ab").tolist()
    expected = target_joint(HFTable(generator.model), processing, prompt, 3)
    fit = goodness_of_fit([tuple(s["tokens"]) for s in result.samples], expected)
    assert fit.p_value > 1e-4, fit
    assert result.stats["tau"] > 1.05  # drafts are accepted: the test exercises the tree rule


# ---- adaptive draft length: policies change how much is drafted, never what is committed ---------------------

SCHEDULES = ("svip", "kangaroo", "cost", "heuristic")


def test_svip_method_equals_plain_decoding_and_drafts_less(generator):
    plain = generator.generate("abc abc abc (x", method="ar", max_new_tokens=40)
    svip = generator.generate("abc abc abc (x", method="svip", max_new_tokens=40)
    capped = generator.generate("abc abc abc (x", method="draft", max_new_tokens=40, num_draft_tokens=12)
    assert svip.tokens == plain.tokens and svip.stats["lossless"]
    assert svip.stats["mean_draft_length"] < capped.stats["mean_draft_length"]
    sampled = generator.generate("ab", method="svip", temperature=1.0, seed=3, num_samples=2, max_new_tokens=12,
                                 entropy_threshold=2.0)
    assert sampled.stats["drafted"] > 0


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_greedy_output_is_the_same_with_every_length_schedule(generator, schedule):
    plain = generator.generate("abc abc abc (x", method="ar", max_new_tokens=40)
    spec = generator.generate("abc abc abc (x", method="draft", max_new_tokens=40, length_schedule=schedule,
                              num_draft_tokens=6)
    assert spec.tokens == plain.tokens
    batch = generator.generate("abc abc abc (x", method="draft", max_new_tokens=40, length_schedule=schedule,
                               num_draft_tokens=6, num_samples=2)
    assert all(s["tokens"] == plain.tokens for s in batch.samples)


def test_stopping_drafter_is_ragged_and_respects_the_policy(pair):
    from specgen.modalities.drafters.tree import StoppingModelDrafter

    class StopRowOneAfterTwo:
        def stop(self, law, previous_law, index):
            return torch.tensor([False, index >= 2])

    drafter = StoppingModelDrafter(load_causal_lm(pair[1]), Processing(temperature=0), StopRowOneAfterTwo())
    ctx = DecodeContext([torch.tensor([0, 5, 6]), torch.tensor([0, 7])], torch.arange(2), torch.arange(2))
    draft = drafter.propose(ctx, 5)
    assert draft.drafted().tolist() == [5, 2]
    plain = ModelDrafter(load_causal_lm(pair[1]), Processing(temperature=0)).propose(ctx, 5)
    assert torch.equal(draft.tokens, plain.tokens)  # the same greedy chain, cut per row


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["svip", "kangaroo", "cost"])
def test_sampled_length_schedules_follow_the_target(generator, schedule):
    processing = Processing(temperature=1.0, top_k=4)
    result = generator.generate("ab", method="draft", temperature=1.0, top_k=4, seed=13, num_samples=2000,
                                max_new_tokens=3, length_schedule=schedule, num_draft_tokens=3)
    expected = target_joint(HFTable(generator.model), processing, generator.encode("ab").tolist(), 3)
    fit = goodness_of_fit([tuple(s["tokens"]) for s in result.samples], expected)
    assert fit.p_value > 1e-4, fit
