"""Jacobi decoding (SJD, MC-SJD, Gumbel-coupled SJD) is exact under guidance and top-k: by enumeration, by
chi-square through the whole loop, and token for token at temperature 0; stale laws and a batch synchronised
to its minimum are caught."""

import pytest
import torch

from specgen import kernels
from specgen.samplers.acceptance import ChainRejection, GreedyMatch
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.guided import GuidedTarget
from specgen.samplers.jacobi import JacobiDrafter
from specgen.samplers.loop import generate
from specgen.samplers.oracle import jacobi_output, max_abs_diff, target_joint
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.toy import GuidedTableLM, TableLM, TableTarget

VOCAB, SCALE = 3, 3.0
LM = TableLM(VOCAB, order=2, seed=41, scale=0.5)  # flat enough that guidance leaves several likely tokens
PROMPT, UNCOND = (1, 2), (0, 0)
GUIDED = GuidedTableLM(LM, PROMPT, UNCOND, SCALE)
ORACLE_PROCESSING = Processing(top_k=2)  # the oracle's lm is already guided
ENGINE_PROCESSING = Processing(top_k=2, guidance_scale=SCALE)
P_PASS, P_FAIL = 1e-4, 1e-6
STALE = lambda old, new, kept: old if kept else new  # noqa: E731  (the official MC scripts' bookkeeping)


@pytest.mark.parametrize("coupling", ["independent", "maximal"])
@pytest.mark.parametrize("init", ["random", "left"])
@pytest.mark.parametrize("window", [2, 4])
def test_jacobi_is_exact_by_enumeration(coupling, init, window):
    out = jacobi_output(GUIDED, ORACLE_PROCESSING, PROMPT, 4, window=window, coupling=coupling, init=init)
    assert max_abs_diff(out, target_joint(GUIDED, ORACLE_PROCESSING, PROMPT, 4)) < 1e-9


def test_storing_the_old_law_for_kept_drafts_is_caught_by_enumeration():
    out = jacobi_output(GUIDED, ORACLE_PROCESSING, PROMPT, 4, window=3, coupling="maximal", stored_law=STALE)
    assert max_abs_diff(out, target_joint(GUIDED, ORACLE_PROCESSING, PROMPT, 4)) > 1e-2


# The Gumbel coupling shares one noise vector per position across steps; the oracle follows what earlier drafts
# reveal of it exactly for two tokens (where top-k has nothing to cut, so temperature stands in for it).
BINARY = GuidedTableLM(TableLM(2, order=2, seed=7, scale=0.5), (1, 0), UNCOND, SCALE)
BINARY_PROCESSING = Processing(temperature=0.8)


@pytest.mark.parametrize("init", ["random", "left"])
@pytest.mark.parametrize("window", [2, 3, 5])
def test_gumbel_coupling_is_exact_by_enumeration(init, window):
    out = jacobi_output(BINARY, BINARY_PROCESSING, (1, 0), 5, window=window, coupling="gumbel", init=init)
    assert max_abs_diff(out, target_joint(BINARY, BINARY_PROCESSING, (1, 0), 5)) < 1e-9


def test_a_gumbel_draft_stored_with_its_old_law_is_caught_by_enumeration():
    out = jacobi_output(BINARY, BINARY_PROCESSING, (1, 0), 5, window=4, coupling="gumbel", stored_law=STALE)
    assert max_abs_diff(out, target_joint(BINARY, BINARY_PROCESSING, (1, 0), 5)) > 1e-2


def test_gumbel_noise_keyed_by_window_slot_is_caught_by_enumeration():
    # the noise must follow the absolute position: keyed by the slot, a slot reuses after a commit noise that an
    # earlier draw at another position has already conditioned
    out = jacobi_output(BINARY, BINARY_PROCESSING, (1, 0), 5, window=3, coupling="gumbel", noise_keyed_by="slot")
    assert max_abs_diff(out, target_joint(BINARY, BINARY_PROCESSING, (1, 0), 5)) > 1e-3


def test_the_gumbel_enumeration_refuses_larger_vocabularies():
    with pytest.raises(ValueError, match="two-token"):
        jacobi_output(GUIDED, ORACLE_PROCESSING, PROMPT, 2, window=2, coupling="gumbel")


def guided_target(lm=LM):
    return GuidedTarget(TableTarget(lm), lambda prompt: torch.tensor(UNCOND[:1] * len(prompt)))


def run(drafter, samples, *, window=4, horizon=4, seed=3, processing=ENGINE_PROCESSING, rule=None):
    prompts = [torch.tensor(PROMPT)] * samples
    return generate(guided_target(), drafter, rule or ChainRejection(), prompts, processing=processing,
                    max_new_tokens=horizon, policy=FixedLength(window - 1), seed=seed)


def fit(result, horizon=4):
    samples = [tuple(t) for t in result.tokens]
    return goodness_of_fit(samples, target_joint(GUIDED, ORACLE_PROCESSING, PROMPT, horizon))


@pytest.mark.slow
@pytest.mark.parametrize("coupling,init", [("independent", "random"), ("maximal", "random"), ("gumbel", "random"),
                                           ("maximal", "left"), ("gumbel", "left")])
def test_the_loop_samples_the_guided_target(coupling, init):
    result = run(JacobiDrafter(VOCAB, coupling, init), 12_000)
    outcome = fit(result)
    assert outcome.p_value > P_PASS, outcome
    assert result.stats["tau"] > 1.2  # windows are accepted, so the test exercises verification


class StaleLawJacobi(JacobiDrafter):
    """Bug (official MC-SJD Lumina/Janus scripts): a draft kept by the coupling keeps its old law."""

    def observe(self, verdict):
        old = {row: w for row, w in self.windows.items()}
        super().observe(verdict)
        for row, window in list(self.windows.items()):
            before = old.get(row)
            if before is None:
                continue
            shift = window.position - before.position
            laws = window.laws.clone()
            for i in range(len(window.tokens)):
                j = i + shift
                if 0 <= j < len(before.tokens) and int(before.tokens[j]) == int(window.tokens[i]):
                    laws[i] = before.laws[j]
            self.windows[row] = type(window)(window.position, window.tokens, laws)


@pytest.mark.slow
def test_a_stale_law_in_the_loop_is_caught():
    outcome = fit(run(StaleLawJacobi(VOCAB, "maximal", "random"), 12_000))
    assert outcome.p_value < P_FAIL, outcome


def min_synchronised_output(window, horizon, *, stale):
    """Exact output law of one row of the official batched SJD loop, which commits the batch's minimum
    accepted count. The other rows act on this one as an independent cap on how many accepted drafts it may
    commit (uniform here). A row that accepted more keeps its accepted-but-uncommitted drafts and verifies them
    again: with their old law (`stale`, the bug) or re-drafted from this step's target law (sound)."""
    from collections import defaultdict

    uniform = torch.full((VOCAB,), 1.0 / VOCAB, dtype=torch.float64)
    law = lambda ctx: ORACLE_PROCESSING(GUIDED.logits(list(ctx))).double()  # noqa: E731
    memo = {}

    def draws(laws):  # every joint draw from independent laws: (prob, ((token, law), ...))
        combos = [((), 1.0)]
        for q in laws:
            combos = [(c + ((t, q),), p * float(q[t])) for c, p in combos for t in range(VOCAB) if q[t] > 0]
        return [(p, c) for c, p in combos]

    def dist(prefix, drafts, need):
        if need <= 0:
            return {(): 1.0}
        key = (prefix, tuple((t, q.numpy().tobytes()) for t, q in drafts), need)
        if key in memo:
            return memo[key]
        out, k = defaultdict(float), min(window - 1, need - 1)
        for fill_prob, fill in draws([uniform] * max(0, k - len(drafts))):
            full = list(drafts[:k]) + list(fill)
            target = [law(prefix + tuple(t for t, _ in full[:m])) for m in range(k + 1)]
            reach = fill_prob
            for n in range(k + 1):  # n drafts accepted, then this row's own emission at slot n
                accept = float(kernels.accept_probability(target[n][full[n][0]], full[n][1][full[n][0]])) if n < k else 0.0
                emit = kernels.residual_probs(target[n], full[n][1]) if n < k else target[k]
                for cap in range(k + 1):
                    weight = reach * (1 - accept) / (k + 1)
                    if weight == 0:
                        continue
                    if cap >= n:  # this row is the minimum: the usual commit and re-draft
                        outcomes = [(float(emit[t]), tuple(t0 for t0, _ in full[:n]) + (t,), target[n + 1:])
                                    for t in range(VOCAB) if emit[t] > 0]
                        kept = ()
                    else:  # commit cap + 1 accepted drafts; the rest of the accepted ones stay drafts
                        outcomes = [(1.0, tuple(t0 for t0, _ in full[:cap + 1]), target[n:])]
                        kept = tuple(full[cap + 1:n]) if stale else ()
                        if not stale:
                            outcomes = [(1.0, o[1], target[cap + 1:]) for o in outcomes]
                    for p_out, committed, redraw in outcomes:
                        committed = committed[:need]
                        for p_draft, fresh in draws(redraw):
                            tail = dist(prefix + committed, kept + fresh, need - len(committed))
                            for rest, p_rest in tail.items():
                                out[committed + rest] += weight * p_out * p_draft * p_rest
                reach *= accept
        memo[key] = dict(out)
        return memo[key]

    return dist(PROMPT, (), horizon)


def test_a_batch_synchronised_to_its_minimum_is_caught():
    exact = target_joint(GUIDED, ORACLE_PROCESSING, PROMPT, 3)
    assert max_abs_diff(min_synchronised_output(3, 3, stale=False), exact) < 1e-9  # re-drafting from p^t is sound
    assert max_abs_diff(min_synchronised_output(3, 3, stale=True), exact) > 1e-3


@pytest.mark.parametrize("coupling", ["independent", "maximal", "gumbel"])
def test_greedy_jacobi_equals_greedy_decoding(coupling):
    lm = TableLM(6, order=3, seed=5)
    lm.table = lm.table + torch.tensor([2.0, 1.0, 0, 0, 0, 0], dtype=torch.float64)  # some tokens are guessable
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 0, 1]), torch.tensor([5, 5, 2])]
    greedy = Processing(temperature=0, guidance_scale=2.0)

    def decode(drafter, window):
        return generate(GuidedTarget(TableTarget(lm), lambda p: torch.zeros_like(p)), drafter, GreedyMatch(),
                        prompts, processing=greedy, max_new_tokens=13, policy=FixedLength(window - 1))

    plain = decode(None, 1)
    jacobi = decode(JacobiDrafter(6, coupling), 8)
    assert jacobi.tokens == plain.tokens
    assert jacobi.stats["tau"] > 1.2  # the window did commit several tokens per step


@pytest.mark.parametrize("coupling", ["maximal", "gumbel"])
def test_a_sample_does_not_depend_on_its_batch(coupling):
    lm = TableLM(5, order=2, seed=9)
    prompts = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([0, 4, 1])]

    def decode(batch, ids, seed):
        return generate(TableTarget(lm), JacobiDrafter(5, coupling), ChainRejection(), batch, processing=Processing(),
                        max_new_tokens=9, policy=FixedLength(4), seed=seed, sample_ids=ids).tokens

    for seed in range(4):
        together = decode(prompts, [0, 1, 2], seed)
        assert [decode([p], [i], seed)[0] for i, p in enumerate(prompts)] == together


def local_model(vocab=16, seed=0):
    """Flat logits that depend mainly on the previous token: where coupling pays (image.md section 7)."""
    lm = TableLM(vocab, order=2, seed=seed, scale=0.3)
    previous = TableLM(vocab, order=1, seed=seed + 1, scale=1.5)
    lm.table = lm.table + previous.table.repeat(vocab, 1)  # row index = a * vocab + b -> previous token b
    return lm


def test_coupling_settles_the_window():
    lm = local_model()
    steps, changed = {}, {}
    for coupling in ("independent", "maximal", "gumbel"):
        drafter = JacobiDrafter(16, coupling)
        result = generate(TableTarget(lm), drafter, ChainRejection(), [torch.tensor([1])] * 32, processing=Processing(),
                          max_new_tokens=48, policy=FixedLength(15), seed=1)
        steps[coupling], changed[coupling] = result.stats["steps"], sum(drafter.changed)
    assert steps["maximal"] < 0.85 * steps["independent"] and steps["gumbel"] < 0.85 * steps["independent"], steps
    assert changed["maximal"] < changed["independent"], changed


def test_bad_knobs_are_rejected():
    from specgen.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="coupling"):
        JacobiDrafter(4, "optimal")
    with pytest.raises(InvalidRequest, match="initialisation"):
        JacobiDrafter(4, init="zeros")
    with pytest.raises(InvalidRequest, match="allowed"):
        JacobiDrafter(4, allowed=torch.zeros(4, dtype=torch.bool))
