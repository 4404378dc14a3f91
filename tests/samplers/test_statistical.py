"""Layer 2 and 3: the whole loop (drafter, target, rule, ragged batch) samples the target's distribution,
checked by chi-square against the exact joint; deliberately biased variants must fail the same test."""

import pytest
import torch

from specgen import kernels
from specgen.samplers.acceptance import ChainRejection, TreeRejection
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.loop import generate
from specgen.samplers.oracle import target_joint
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableDrafter, TableLM, TableTarget, TableTreeDrafter
from specgen.samplers.types import Verdict

VOCAB, HORIZON = 4, 3
TARGET = TableLM(VOCAB, order=1, seed=31)
DRAFT = TARGET.mixed_with(TableLM(VOCAB, order=1, seed=32, scale=3.0), 0.7)
PLAIN = Processing()
PROMPTS = ([1, 2], [3, 0, 1, 2, 3])  # ragged: different lengths in one batch
SAMPLES = 12_000  # per prompt
P_PASS, P_FAIL = 1e-4, 1e-6  # a lossless run must not look this unlikely; a control must look far less likely


def run_batch(drafter, rule, *, seed=5, k=3, processing=PLAIN):
    prompts = [torch.tensor(PROMPTS[i % 2]) for i in range(2 * SAMPLES)]
    result = generate(TableTarget(TARGET), drafter, rule, prompts, processing=processing,
                      max_new_tokens=HORIZON, policy=FixedLength(k), seed=seed)
    return result


def fits(result, processing=PLAIN):
    out = []
    for parity, prompt in enumerate(PROMPTS):
        samples = [tuple(t) for t in result.tokens[parity::2]]
        out.append(goodness_of_fit(samples, target_joint(TARGET, processing, prompt, HORIZON)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name,drafter,rule", [
    ("chain", TableDrafter(DRAFT, PLAIN), ChainRejection()),
    ("hot-draft", TableDrafter(DRAFT, Processing(temperature=1.6)), ChainRejection()),
    ("point-mass", TableDrafter(DRAFT, PLAIN, point_mass=True), ChainRejection()),
    ("tree-without-replacement", TableTreeDrafter(DRAFT, PLAIN, (2, 2)), TreeRejection("without_replacement")),
    ("tree-iid", TableTreeDrafter(DRAFT, PLAIN, (2, 1), "with_replacement"), TreeRejection("with_replacement")),
    ("plain", None, ChainRejection()),
])
def test_loop_samples_the_target(name, drafter, rule):
    result = run_batch(drafter, rule)
    for fit in fits(result):
        assert fit.p_value > P_PASS, (name, fit)
    if drafter is not None:
        assert result.stats["tau"] > 1.3  # the draft is good enough that the test exercises acceptance


def test_plain_decoding_under_warping_samples_the_target():
    warped = Processing(temperature=0.7, top_k=3)
    for fit in fits(run_batch(TableDrafter(DRAFT, warped), ChainRejection(), processing=warped), warped):
        assert fit.p_value > P_PASS, fit


# ---- negative controls ---------------------------------------------------------------------------------

class StaleDrafter(TableDrafter):
    """Bug: samples each token from the right law but reports the law of the previous position."""

    def propose(self, ctx, budget):
        draft = super().propose(ctx, budget)
        stale = torch.stack([torch.stack([self.law(row.tolist()[:len(row) - 1 + d]) for d in range(budget)])
                             for row in ctx.tokens])
        return type(draft)(draft.tokens, stale)


class UnnormalisedResidual(ChainRejection):
    """Bug: the recovered token is drawn from relu(target - draft) as if it summed to one; the missing mass
    lands on the last token the target allows."""

    def __call__(self, draft, target_probs, noise):
        verdict = super().__call__(draft, target_probs, noise)
        if draft.length == 0:
            return verdict
        rows = torch.arange(draft.batch_size)
        n = verdict.num_accepted
        rejected = n < draft.drafted()
        stop = n.clamp(max=draft.length - 1)
        weights = (target_probs[rows, stop].double() - draft.draft_probs[rows, stop].double()).clamp(min=0)
        u = noise.emit_uniform[rows, n]
        index = torch.searchsorted(weights.cumsum(-1), u[:, None], right=True).squeeze(-1)
        fallback = target_probs.shape[-1] - 1 - (target_probs[rows, stop] > 0).flip(-1).int().argmax(-1)
        buggy = torch.where(index >= target_probs.shape[-1], fallback, index)
        tokens = verdict.tokens.clone()
        tokens[rows[rejected], n[rejected]] = buggy[rejected]
        return Verdict.from_chain(tokens, n, draft.drafted())


def test_stale_draft_distribution_is_caught():
    worst = min(f.p_value for f in fits(run_batch(StaleDrafter(DRAFT, PLAIN), ChainRejection())))
    assert worst < P_FAIL


def test_unnormalised_residual_is_caught():
    worst = min(f.p_value for f in fits(run_batch(TableDrafter(DRAFT, PLAIN), UnnormalisedResidual())))
    assert worst < P_FAIL


def min_synchronised_samples(prompt, pairs, k, seed):
    """Bug: batches of two rows commit only the batch-minimum number of accepted tokens; a row that accepted
    more keeps its accepted-but-uncommitted drafts and re-verifies them next step with their old draft law."""
    generator = torch.Generator().manual_seed(seed)
    target_law = lambda ctx: PLAIN(TARGET.logits(ctx))
    draft_law = lambda ctx: PLAIN(DRAFT.logits(ctx))
    outputs = []
    for _ in range(pairs):
        context = [list(prompt), list(prompt)]
        leftover = [[], []]  # (token, draft law it was drawn from)
        while min(len(c) for c in context) < len(prompt) + HORIZON:
            accepted, emitted, drafts = [], [], []
            for r in range(2):
                draft = list(leftover[r])
                while len(draft) < k:
                    q = draft_law(context[r] + [t for t, _ in draft])
                    draft.append((int(torch.multinomial(q, 1, generator=generator)), q))
                n = 0
                for t, q in draft:
                    p = target_law(context[r] + [x for x, _ in draft[:n]])
                    if torch.rand((), generator=generator, dtype=torch.float64) < p[t] / q[t]:
                        n += 1
                        continue
                    break
                p = target_law(context[r] + [x for x, _ in draft[:n]])
                law = kernels.residual_probs(p, draft[n][1]) if n < k else p.double()
                emitted.append(int(torch.multinomial(law, 1, generator=generator)))
                accepted.append(n)
                drafts.append(draft)
            m = min(accepted)
            for r in range(2):
                context[r] += [t for t, _ in drafts[r][:m]]
                if accepted[r] == m:
                    context[r].append(emitted[r])
                    leftover[r] = []
                else:
                    leftover[r] = drafts[r][m:accepted[r]]
        outputs += [tuple(c[len(prompt):len(prompt) + HORIZON]) for c in context]
    return outputs


@pytest.mark.slow
def test_batch_synchronised_to_its_minimum_is_caught():
    prompt = PROMPTS[0]
    samples = min_synchronised_samples(prompt, pairs=SAMPLES // 4, k=3, seed=7)  # p ~ 1e-11 at 2,000 pairs
    fit = goodness_of_fit(samples, target_joint(TARGET, PLAIN, prompt, HORIZON))
    assert fit.p_value < P_FAIL, fit


def test_a_drafter_with_bad_output_gets_a_clear_error():
    from specgen.errors import InvalidRequest
    from specgen.samplers.types import Draft

    class OutOfVocabulary:
        def propose(self, ctx, budget):
            return Draft(torch.full((len(ctx.tokens), budget), VOCAB, dtype=torch.long))

        def observe(self, verdict):
            pass

    with pytest.raises(InvalidRequest, match="outside the target vocabulary"):
        generate(TableTarget(TARGET), OutOfVocabulary(), ChainRejection(), [torch.tensor([1])], processing=PLAIN,
                 max_new_tokens=4)


def test_a_tree_sample_does_not_depend_on_its_batch():
    """Near the end of a row, the tree gets a per-row depth limit, so sample i alone equals sample i in a batch."""
    target = TableLM(5, order=2, seed=1)
    draft = target.mixed_with(TableLM(5, order=2, seed=2), 0.5)
    prompts = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([0, 4, 1])]

    def run(batch, ids, seed):
        return generate(TableTarget(target), TableTreeDrafter(draft, PLAIN, (2, 2, 1)), TreeRejection(), batch,
                        processing=PLAIN, max_new_tokens=7, seed=seed, sample_ids=ids).tokens

    for seed in range(8):
        together = run(prompts, [0, 1, 2], seed)
        assert [run([p], [i], seed)[0] for i, p in enumerate(prompts)] == together
