"""STAND's n-gram law store and stochastic trees on TableLMs: exact enumeration of the output distribution (the
store's draft law included) to 1e-9, chi-square through the loop, and the negative controls that must fail."""

import pytest
import torch

from specgen.modalities.drafters.stand import LawStore, StandBuilder, StandDrafter
from specgen.samplers import trees
from specgen.samplers.acceptance import TreeRejection
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.loop import generate
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableLM, TableTarget

TARGET = TableLM(3, order=2, seed=41)
PLAIN = Processing(temperature=1.0)
WARPED = Processing(temperature=0.8, top_k=2)
PROMPT, HORIZON = (1, 2, 0, 1, 2, 2, 1), 3
BUILDER = lambda root, order: StandBuilder(root, order, 3, max_depth=2)  # noqa: E731


def store_after(prefix, processing, top_k=2):
    """The store a single-sample StandDrafter holds after committing `prefix` (prompt n-grams as point masses, the
    target's law at every generated position)."""
    store = LawStore(TARGET.vocab_size, max_ngram=2, top_k=top_k)
    store.add_text(PROMPT)
    for t in range(len(PROMPT), len(prefix)):
        store.add_law(list(prefix[:t]), processing(TARGET.logits(list(prefix[:t]))))
    return store


def exact(processing, siblings="without_replacement", rule=None, attach_laws=False, horizon=HORIZON):
    def proposals(prefix):
        store = store_after(prefix, processing)
        for prob, tree in trees.enumerate_builder(BUILDER, store.dense_law, prefix, siblings):
            if attach_laws:  # the store's law recorded at every node, though the children were its top tokens
                contexts = [list(prefix) + tree.tokens[0, tree.ancestor_mask[0, n].nonzero().flatten()[1:]].tolist()
                            for n in range(tree.num_nodes)]
                tree = type(tree)(tree.tokens, tree.parents, torch.stack([store.dense_law(c) for c in contexts])[None])
            yield prob, tree

    out = exact_output(TARGET, processing, rule or TreeRejection(siblings), proposals, PROMPT, horizon)
    return max_abs_diff(out, target_joint(TARGET, processing, PROMPT, horizon))


def test_store_answers_from_the_longest_key_and_keeps_top_k():
    store = LawStore(5, max_ngram=2, top_k=2)
    store.add_text([0, 1, 2, 0, 1, 3, 4, 1, 2])
    law = store.law([4, 0, 1])  # key (0, 1) was followed by 2 and 3 once each
    assert sorted(law.tokens.tolist()) == [2, 3] and law.probs.sum().item() == pytest.approx(1.0)
    assert store.law([3, 4, 1]).tokens.tolist() == [2]  # (4, 1) -> 2
    store.add_law([0, 1], torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4]))
    assert len(store.table[(0, 1)]) <= 4 and store.law([9]) is None


def test_enumerated_stand_proposals_are_distributions():
    store = store_after(PROMPT, PLAIN)
    total = sum(p for p, _ in trees.enumerate_builder(BUILDER, store.dense_law, PROMPT, "without_replacement"))
    assert total == pytest.approx(1.0, abs=1e-12)


def test_stand_trees_are_exact():
    assert exact(PLAIN) < 1e-9


def test_stand_trees_with_a_value_floor_are_exact():
    """Candidates below min_value are never tried: decided from the law's ranked probabilities, not the token."""
    floored = lambda root, order: StandBuilder(root, order, 3, max_depth=2, min_value=0.3)  # noqa: E731

    def proposals(prefix):
        return trees.enumerate_builder(floored, store_after(prefix, PLAIN).dense_law, prefix, "without_replacement")

    out = exact_output(TARGET, PLAIN, TreeRejection("without_replacement"), proposals, PROMPT, HORIZON)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, HORIZON)) < 1e-9


def test_stand_trees_under_warping_are_exact():
    assert exact(WARPED) < 1e-9


def test_greedy_stand_gives_the_greedy_sequence():
    greedy = Processing(temperature=0)
    assert exact(greedy, "deterministic", rule=trees.GreedyTreeMatch()) < 1e-12


def test_point_mass_verification_of_stochastic_drafts_stays_exact():
    """Not a bug, a theorem: candidates drawn independently of the target's noise and verified as point masses (the
    deterministic rule) are exact for every candidate set, so the mixture is too; it only accepts less."""
    assert exact(PLAIN, "without_replacement", rule=TreeRejection("deterministic")) < 1e-9


def test_store_law_claimed_for_top_token_drafts_fails_the_oracle():
    """Negative control: the store's most probable tokens (point masses) verified with the store's law as q (as if
    they had been drawn from it): min(1, target/q) over-accepts them."""
    assert exact(PLAIN, "deterministic", rule=TreeRejection("without_replacement"), attach_laws=True) > 1e-3


def test_stale_store_law_fails_the_oracle():
    """Negative control: children drawn from the store's law but the recorded q sharpened (a stale draft law)."""
    def proposals(prefix):
        store = store_after(prefix, PLAIN)
        for prob, tree in trees.enumerate_builder(BUILDER, store.dense_law, prefix, "without_replacement"):
            sharp = tree.draft_probs ** 3
            sharp = torch.where(sharp.sum(-1, keepdim=True) > 0, sharp / sharp.sum(-1, keepdim=True).clamp(min=1e-300),
                                sharp)
            yield prob, type(tree)(tree.tokens, tree.parents, sharp)

    out = exact_output(TARGET, PLAIN, TreeRejection("without_replacement"), proposals, PROMPT, 2)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, 2)) > 1e-3


# ---- through the loop ------------------------------------------------------------------------------------------

LOOP_TARGET = TableLM(4, order=1, seed=31)
LOOP_PROMPT = [1, 2, 3, 1, 2, 0, 1, 2]
SAMPLES = 2000


class PointMassStand(StandDrafter):
    """Negative control: the store's top-ranked tokens (point masses) offered as if drawn from the store's law."""

    def propose(self, ctx, budget):
        self.sampled = False
        tree = super().propose(ctx, budget)
        if tree.tokens.shape[1] < 2:
            return tree
        laws = torch.zeros(*tree.tokens.shape, self.vocab)
        for i, context in enumerate(ctx.tokens):
            store = self.store_for(int(ctx.sample_ids[i]))
            for n in range(tree.num_nodes):
                path = tree.ancestor_mask[i, n].nonzero().flatten()[1:]
                laws[i, n] = store.dense_law(context.tolist() + tree.tokens[i, path].tolist()).float()
        return type(tree)(tree.tokens, tree.parents, laws)


def loop_fit(drafter, rule, seed=3):
    prompts = [torch.tensor(LOOP_PROMPT)] * SAMPLES
    result = generate(TableTarget(LOOP_TARGET), drafter, rule, prompts, processing=PLAIN, max_new_tokens=3,
                      policy=FixedLength(3), seed=seed)
    samples = [tuple(t) for t in result.tokens]
    return result, goodness_of_fit(samples, target_joint(LOOP_TARGET, PLAIN, LOOP_PROMPT, 3))


@pytest.mark.parametrize("share", ["samples", "none"])
def test_stand_in_the_loop_samples_the_target(share):
    drafter = StandDrafter(4, PLAIN, tree_budget=4, max_depth=3, max_ngram=2, top_k=3, share=share)
    result, fit = loop_fit(drafter, TreeRejection(drafter.siblings))
    assert fit.p_value > 1e-4, fit
    assert result.stats["tau"] > 1.3


def test_stand_in_the_loop_with_a_claimed_law_for_point_masses_fails():
    drafter = PointMassStand(4, PLAIN, tree_budget=4, max_depth=3, max_ngram=2, top_k=3)
    _, fit = loop_fit(drafter, TreeRejection("without_replacement"))
    assert fit.p_value < 1e-6, fit
