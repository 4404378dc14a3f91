"""Layer 1: every lossless rule reproduces the target's joint distribution exactly (to 1e-9), by enumeration;
the negative controls must miss it by far more."""


import pytest
import torch

from specgen.samplers.oracle import (chain_proposals, exact_output, max_abs_diff, target_joint, target_probs_for,
                                     tree_proposals)
from specgen.samplers.acceptance import ChainRejection, GreedyMatch, TreeRejection
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableLM
from specgen.samplers.types import Decisions

VOCAB, HORIZON, PROMPT = 4, 3, (1, 2)
TARGET = TableLM(VOCAB, order=2, seed=11)
DRAFT = TARGET.mixed_with(TableLM(VOCAB, order=2, seed=12), 0.6)
# Trees multiply the enumeration, so they use a 3-token vocabulary.
TREE_TARGET = TableLM(3, order=2, seed=21)
TREE_DRAFT = TREE_TARGET.mixed_with(TableLM(3, order=2, seed=22, scale=4.0), 0.7)
PLAIN = Processing(temperature=1.0)
WARPED = Processing(temperature=0.8, top_k=3, top_p=0.9)  # zeros on both sides exercise the q = 0 guard


def law(lm, processing):
    cache = {}

    def at(context):
        key = tuple(context)
        if key not in cache:
            cache[key] = processing(lm.logits(context))
        return cache[key]

    return at


@pytest.mark.parametrize("target_processing,draft_processing", [
    (PLAIN, PLAIN), (WARPED, WARPED), (Processing(temperature=0.7), Processing(temperature=1.5)),  # hotter draft
])
@pytest.mark.parametrize("k", [1, 3])
def test_chain_rejection_is_exact(target_processing, draft_processing, k):
    proposals = lambda prefix: chain_proposals(law(DRAFT, draft_processing), prefix, k)
    out = exact_output(TARGET, target_processing, ChainRejection(), proposals, PROMPT, HORIZON)
    assert max_abs_diff(out, target_joint(TARGET, target_processing, PROMPT, HORIZON)) < 1e-9


def test_point_mass_chain_is_exact():
    proposals = lambda prefix: chain_proposals(law(DRAFT, PLAIN), prefix, 2, point_mass=True)
    out = exact_output(TARGET, PLAIN, ChainRejection(), proposals, PROMPT, HORIZON)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, HORIZON)) < 1e-9


def test_greedy_match_gives_the_greedy_sequence():
    greedy = Processing(temperature=0)
    proposals = lambda prefix: chain_proposals(law(DRAFT, PLAIN), prefix, 2)  # a sampled draft, greedy target
    out = exact_output(TARGET, greedy, GreedyMatch(), proposals, PROMPT, HORIZON)
    expected = target_joint(TARGET, greedy, PROMPT, HORIZON)
    assert len(expected) == 1 and max_abs_diff(out, expected) < 1e-12


@pytest.mark.parametrize("siblings,branching", [
    ("with_replacement", (2, 1)), ("without_replacement", (3, 1)), ("without_replacement", (2, 2)),
    ("deterministic", (2, 2)),
])
def test_tree_rules_are_exact(siblings, branching):
    draft_law = law(TREE_DRAFT, PLAIN)
    proposals = lambda prefix: tree_proposals(draft_law, prefix, branching, siblings)
    out = exact_output(TREE_TARGET, PLAIN, TreeRejection(siblings), proposals, PROMPT, HORIZON)
    assert max_abs_diff(out, target_joint(TREE_TARGET, PLAIN, PROMPT, HORIZON)) < 1e-9


def test_tree_rules_under_warping_and_greedy():
    for processing in (WARPED, Processing(temperature=0)):
        draft_law = law(TREE_DRAFT, PLAIN)
        proposals = lambda prefix: tree_proposals(draft_law, prefix, (2, 1), "without_replacement")
        out = exact_output(TREE_TARGET, processing, TreeRejection("without_replacement"), proposals, PROMPT, HORIZON)
        assert max_abs_diff(out, target_joint(TREE_TARGET, processing, PROMPT, HORIZON)) < 1e-9


def test_tree_children_beyond_the_draft_support_are_exact():
    """A sparse draft law (top-k 2 of 3) with 3 children per node: the third child has draft probability 0
    and must act as if it was never drawn."""
    sparse_law = law(TREE_DRAFT, Processing(top_k=2))
    proposals = lambda prefix: tree_proposals(sparse_law, prefix, (3, 1), "without_replacement")
    out = exact_output(TREE_TARGET, PLAIN, TreeRejection("without_replacement"), proposals, PROMPT, HORIZON)
    assert max_abs_diff(out, target_joint(TREE_TARGET, PLAIN, PROMPT, HORIZON)) < 1e-9


def test_reduced_draft_vocabulary_is_exact():
    """A draft over a sub-vocabulary (target ids 0, 2, 3) mapped into target ids stays exact."""
    vocab_ids = torch.tensor([0, 2, 3])

    def reduced(prefix):
        for prob, draft in chain_proposals(law(DRAFT, PLAIN), prefix, 2):
            restricted = draft.draft_probs[..., vocab_ids]
            restricted = restricted / restricted.sum(-1, keepdim=True)
            if bool(torch.isin(draft.tokens, vocab_ids).all()):
                # probability of this chain under the restricted law
                context, p = list(prefix), 1.0
                for token in draft.tokens[0].tolist():
                    row = law(DRAFT, PLAIN)(context)[vocab_ids]
                    p *= float((row / row.sum())[vocab_ids.tolist().index(token)])
                    context.append(token)
                yield p, type(draft)(draft.tokens, restricted, vocab_ids=vocab_ids)

    out = exact_output(TARGET, PLAIN, ChainRejection(), reduced, PROMPT, HORIZON)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, HORIZON)) < 1e-9


def test_chain_equals_tree_on_a_chain():
    """A chain-shaped tree verified by any tree rule gives the same decisions as the chain rule."""
    for prob, draft in list(chain_proposals(law(DRAFT, PLAIN), PROMPT, 3))[:20]:
        target_probs = target_probs_for(draft, TARGET, PLAIN, PROMPT)
        chain = ChainRejection().decision_probs(draft, target_probs)
        tree = draft.as_tree(torch.tensor([PROMPT[-1]]))
        for siblings in ("with_replacement", "without_replacement"):
            decided = TreeRejection(siblings).decision_probs(tree, target_probs)
            assert torch.allclose(decided.accept_probs[:, 1:], chain.accept_probs, atol=1e-15)
            assert torch.allclose(decided.emit_probs, chain.emit_probs, atol=1e-15)


# ---- negative controls: each must miss the target by far more than 1e-9 ---------------------------------

class UnnormalisedResidual(ChainRejection):
    """Bug: recovers from relu(target - draft) without renormalising."""

    def decision_probs(self, draft, target_probs):
        decided = super().decision_probs(draft, target_probs)
        k = draft.length
        raw = (target_probs[:, :k].double() - draft.draft_probs.double()).clamp(min=0)
        emit = decided.emit_probs.clone()
        emit[:, :k] = raw
        return Decisions(decided.accept_probs, emit)


class RecoverFromTarget(ChainRejection):
    """Bug: samples the correction from the target instead of the residual."""

    def decision_probs(self, draft, target_probs):
        decided = super().decision_probs(draft, target_probs)
        return Decisions(decided.accept_probs, target_probs.double())


def _stale(context):
    """The law at the prefix without its last token: a draft distribution one position out of date."""
    return law(DRAFT, PLAIN)(context[:-1])


@pytest.mark.parametrize("rule,reported", [
    (ChainRejection(), _stale),  # stale draft distribution
    (UnnormalisedResidual(), None),
    (RecoverFromTarget(), None),
])
def test_negative_controls_fail_the_oracle(rule, reported):
    proposals = lambda prefix: chain_proposals(law(DRAFT, PLAIN), prefix, 2, reported_law=reported)
    out = exact_output(TARGET, PLAIN, rule, proposals, PROMPT, HORIZON)
    assert max_abs_diff(out, target_joint(TARGET, PLAIN, PROMPT, HORIZON)) > 1e-3


def test_wrong_sibling_mode_fails_the_oracle():
    """Verifying without-replacement children as if they were i.i.d. is biased."""
    draft_law = law(TREE_DRAFT, PLAIN)
    proposals = lambda prefix: tree_proposals(draft_law, prefix, (3, 1), "without_replacement")
    out = exact_output(TREE_TARGET, PLAIN, TreeRejection("with_replacement"), proposals, PROMPT, HORIZON)
    assert max_abs_diff(out, target_joint(TREE_TARGET, PLAIN, PROMPT, HORIZON)) > 1e-3
