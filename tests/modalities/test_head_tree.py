"""EAGLE-2's dynamic tree over a feature head (`eagle2` with `head` 'eagle' or 'mtp', modalities/drafters/
head_tree.py) on a tiny random target with a head fitted for seconds: every scored node's law is the head's law
computed the reference way and each step's tree is EAGLE-2's built from it (a tree whose nodes read the root's
feature instead of their parent's fails the first check); greedy output equals plain decoding alone, in ragged
batches and under continuous batching; sampled output follows the target (chi-square), and a rule that takes the root's first
candidate on trust fails the same test."""

import pytest
import torch

from chain_checks import Recorder, queued_and_alone
from feature_heads import PROMPT, HeadLaw, fitted_head
from tiny_models import HFTable, save_tiny
from specgen.errors import ModelNotFound
from specgen.modalities.drafters.head_tree import HeadTreeDrafter
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.samplers.acceptance import TreeRejection
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers import trees
from specgen.samplers.processing import Processing

HEADS = ("eagle", "mtp")
TREE = {"tree_budget": 6, "expand_top_k": 3, "depth": 3}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("head-tree") / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    heads = {"eagle": fitted_head(model, folder)[0], "mtp": fitted_head(model, folder, mtp=True)[0]}
    return TextGenerator(str(folder)), model, heads


class StaleTree(HeadTreeDrafter):
    """Bug: every node's pair reads the root's predicted feature, not its parent's."""

    @staticmethod
    def _read_features(known, nodes):
        return torch.stack([known[0] for _ in nodes])


def tree_gaps(generator, model, head, name, stale=False) -> tuple[float, int]:
    """Over a two-row greedy run: the largest gap between a node's law as the drafter scored it and the head's law
    computed the reference way (afresh over the node's path), and how many steps' trees differ from EAGLE-2's tree
    built from the reference law."""
    pipeline = generator.pipeline("eagle2", [generator.encode(PROMPT)], max_new_tokens=20,
                                  params={**TREE, "head": name})
    drafter = pipeline.drafter
    if stale:
        drafter.__class__ = StaleTree
    reference, rank, worst = HeadLaw(model, head), Processing(temperature=1.0), [0.0]
    score = drafter._score

    def checked(ctx, builders, features, index, requests):
        laws = score(ctx, builders, features, index, requests)
        for i, builder, row_laws in zip(index, builders, laws):
            for node, law in row_laws.items():
                wanted = rank(reference.logits(ctx.tokens[i].tolist(), builder.path(node)))
                worst[0] = max(worst[0], float((law.double() - wanted).abs().max()))
        return laws

    drafter._score = checked
    recorder = Recorder(drafter)
    pipeline.drafter = recorder
    list(pipeline.run([generator.encode(PROMPT), generator.encode("ab (")]))
    differ = 0
    for contexts, tree in recorder.seen:
        for row, context in enumerate(contexts):
            builder = trees.Eagle2Builder(context[-1], lambda node, law, width: trees.top_order(law, width),
                                          TREE["tree_budget"], TREE["expand_top_k"], TREE["depth"])
            trees.run_builders([builder], lambda requests: [
                {n: rank(reference.logits(context, builder.path(n))) for n in requests[0]}])
            size = len(builder.tokens)
            differ += (tree.tokens[row, :size].tolist() != builder.tokens
                       or tree.parents[row, :size].tolist() != builder.parents)
    assert len(recorder.seen) > 2
    return worst[0], differ


@pytest.mark.parametrize("name", HEADS)
def test_every_tree_is_eagle2s_from_the_reference_law(tiny, name):
    generator, model, heads = tiny
    assert tree_gaps(generator, model, heads[name], name) == (pytest.approx(0.0, abs=1e-4), 0)
    assert tree_gaps(generator, model, heads[name], name, stale=True)[0] > 1e-3


@pytest.mark.parametrize("name", HEADS)
def test_greedy_head_trees_equal_plain_decoding(tiny, name):
    generator = tiny[0]
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=40)
    spec = generator.generate(PROMPT, method="eagle2", max_new_tokens=40, head=name, **TREE)
    assert spec.tokens == plain.tokens and spec.stats["tau"] > 1.0
    prompts = [generator.encode(p) for p in (PROMPT, "x", "ab (ab")] + [torch.tensor([3])]  # one token: no pair
    alone = [generator.pipeline("ar", [p], max_new_tokens=24).generate([p]).tokens[0] for p in prompts]
    together = generator.pipeline("eagle2", prompts, max_new_tokens=24, params={**TREE, "head": name})
    assert together.generate(prompts).tokens == alone
    served, alone = queued_and_alone(generator, "eagle2", {**TREE, "head": name})
    assert served == alone


class TrustedFirstCandidate(TreeRejection):
    """Bug: the root's first candidate is taken as if the target had drawn it (its law put on that token)."""

    def __call__(self, tree, target_probs, noise):
        if tree.__class__.__name__ == "DraftTree":
            target_probs = target_probs.clone()
            first = tree.tokens[:, 1]
            target_probs[:, 0] = torch.nn.functional.one_hot(first, target_probs.shape[-1]).to(target_probs.dtype)
        return super().__call__(tree, target_probs, noise)


def sampled_fit(generator, name, rule=None):
    processing = Processing(temperature=1.0, top_k=4)
    pipeline = generator.pipeline("eagle2", [generator.encode("ab")], max_new_tokens=3,
                                  sampling={"temperature": 1.0, "top_k": 4}, params={**TREE, "head": name})
    if rule is not None:
        pipeline.rule = rule
    result = pipeline.generate([generator.encode("ab")] * 2000, seed=11)
    expected = target_joint(HFTable(generator.model), processing, generator.encode("ab").tolist(), 3)
    return goodness_of_fit([tuple(t) for t in result.tokens], expected), result.stats


@pytest.mark.parametrize("name", HEADS)
def test_sampled_head_trees_follow_the_target(tiny, name):
    fit, stats = sampled_fit(tiny[0], name)
    assert fit.p_value > 1e-4, fit
    assert stats["tau"] > 1.05


def test_a_rule_trusting_the_first_candidate_fails_the_same_test(tiny):
    fit, _ = sampled_fit(tiny[0], "eagle", TrustedFirstCandidate("deterministic"))
    assert fit.p_value < 1e-6, fit


def test_a_head_the_target_lacks_is_named(tmp_path):
    folder = tmp_path / "other"
    save_tiny(folder, 1, layers=2, hidden=32, wide=True)
    with pytest.raises(ModelNotFound, match="train head --method mtp"):
        TextGenerator(str(folder)).generate("ab", method="eagle2", head="mtp", max_new_tokens=2)
