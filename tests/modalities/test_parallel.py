"""`parallel` (modalities/drafters/parallel.py): the draft model drafting ahead in a process of its own.

Exactness rests on one property, checked first: a window served for a context is exactly what the draft proposes
from that context afresh (same tokens, same laws), whether it was drafted ahead on a branch or on demand. Then
the three layers (enumeration on a toy, chi-square and greedy equality on tiny random models) with a negative
control, and timing: outputs are the same bits under random delays on both sides."""

import random
import time

import pytest
import torch

from chain_checks import LeakyRule, sampled_fit
from tiny_models import save_tiny
from specgen.errors import InvalidRequest
from specgen.modalities.drafters.parallel import Ahead, DraftConfig, ParallelDrafter, build_model_drafter
from specgen.modalities.text.generator import TextGenerator
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint
from specgen.samplers.processing import Processing
from specgen.samplers.toy import TableLM
from specgen.samplers.types import DecodeContext, Draft


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    target = save_tiny(root / "target", 0, wide=True)
    # a draft close to the target (the target's weights: most windows hit a branch) and an unrelated one
    return target, save_tiny(root / "same", 0, wide=True), save_tiny(root / "other", 1, layers=1, hidden=16, wide=True)


@pytest.fixture(scope="module")
def generator(models):
    return TextGenerator(models[0], models[1])


def _config(draft: str, temperature: float = 1.0, branches: int = 3, jitter_s: float = 0.0,
            top_k: int = 0) -> DraftConfig:
    from specgen.modalities.text.generator import load_causal_lm

    vocab = load_causal_lm(draft).config.vocab_size
    return DraftConfig(draft, vocab, Processing(temperature=temperature, top_k=top_k), branches=branches,
                       jitter_s=jitter_s)


@pytest.mark.parametrize("which", [1, 2])
def test_a_served_window_is_the_drafts_fresh_proposal_from_that_context(models, which):
    config = _config(models[which])
    ahead, fresh = Ahead(build_model_drafter(config), 3), build_model_drafter(config)
    rng = random.Random(which)
    contexts, hits = [[3, 5, 7], [4, 4]], 0
    for step in range(12):
        tokens, laws = ahead.answer(contexts, [0, 1], [0, 1], 5, 4)
        hits = ahead.counters["hits"]
        reference = fresh.propose(DecodeContext([torch.tensor(c) for c in contexts], torch.tensor([0, 1]),
                                                torch.tensor([0, 1]), 5), 4)
        assert tokens == reference.tokens.tolist()
        torch.testing.assert_close(laws, reference.draft_probs, rtol=0, atol=1e-5)
        ahead.speculate()
        # the next committed context: a prefix of the window, then the draft's likeliest other token or the window's
        # guessed bonus (branches), or a token nobody guessed
        for i, context in enumerate(contexts):
            kept = rng.randint(0, 4)
            plans = ahead.plans[i]
            if rng.random() < 0.7 and kept < len(plans) - 1:
                contexts[i] = list(plans[kept + 1].context)
            elif rng.random() < 0.7:
                contexts[i] = list(plans[0].context)
            else:
                contexts[i] = context + tokens[i][:kept] + [rng.randrange(10)]
    assert hits > 0 and ahead.counters["misses"] > 2


def test_an_abandoned_speculation_leaves_the_caches_as_if_it_never_ran(models):
    """Rewinding after an interrupt at any forward gives the same later windows as never speculating."""
    config = _config(models[2])
    outcomes = set()
    for stop_after in (0, 1, 3, None):
        ahead, asked = Ahead(build_model_drafter(config), 3), [0]
        ahead.answer([[3, 5, 7]], [0], [0], 2, 4)

        def interrupt():
            asked[0] += 1
            return stop_after is not None and asked[0] > stop_after
        ahead.speculate(interrupt)
        ahead.abandon()
        tokens, laws = ahead.answer([[3, 5, 7, 1, 1]], [0], [0], 2, 4)
        outcomes.add((tuple(tokens[0]), tuple(laws.flatten().tolist())))
    assert len(outcomes) == 1


# ---- the three layers ------------------------------------------------------------------------------------------


def _enumeration_gap(stale: bool) -> float:
    """Enumerate `parallel`'s proposals on toy tables: a window for a prefix comes from a branch context; served only
    where that context is the prefix (exact) or, in the stale variant, also where the guessed bonus was wrong, with
    the tokens drafted after the guess but the laws of the committed prefix reported."""
    target, draft = TableLM(4, 3, seed=0), TableLM(4, 3, seed=5)
    processing = Processing(temperature=1.0)
    guess = lambda prefix: int(processing(draft.logits(list(prefix[:-1]))).argmax())  # noqa: E731

    def proposals(prefix):
        drafted_from = tuple(prefix[:-1]) + (guess(prefix),) if stale else tuple(prefix)
        out = []

        def grow(tokens, reported, prob):
            if len(tokens) == 2:
                out.append((prob, Draft(torch.tensor([tokens]), torch.stack(reported)[None])))
                return
            law = processing(draft.logits(list(drafted_from) + tokens))
            told = processing(draft.logits(list(prefix) + tokens))
            for token in law.nonzero().flatten().tolist():
                grow(tokens + [token], reported + [told], prob * float(law[token]))
        grow([], [], 1.0)
        return out

    prompt = (0, 2, 1)
    out = exact_output(target, processing, ChainRejection(), proposals, prompt, 3)
    return max_abs_diff(out, target_joint(target, processing, prompt, 3))


def test_enumeration_windows_drafted_from_the_committed_context_are_exact():
    assert _enumeration_gap(stale=False) < 1e-9


def test_enumeration_a_window_from_a_since_rejected_context_with_relabelled_laws_is_not():
    assert _enumeration_gap(stale=True) > 1e-3


def test_sampled_parallel_follows_the_target(generator):
    # 3 tokens leave no second window to take from a branch: served windows under sampling are checked above (the
    # fresh-proposal equality) and below (the same bits as `draft` over 50 timing-perturbed runs)
    fit, stats = sampled_fit(generator, "parallel", {"num_draft_tokens": 2, "branches": 3})
    assert fit.p_value > 1e-3, fit
    assert stats["ahead_misses"] >= 2000 and stats["draft_process"]


def test_the_drafts_law_leaking_into_the_output_fails_the_same_test(models):
    # the unrelated draft (a draft with the target's weights would leak the target's own law)
    params = {"num_draft_tokens": 3, "branches": 2, "worker": "inline"}
    fit, _ = sampled_fit(TextGenerator(models[0], models[2]), "parallel", params, LeakyRule())
    assert fit.p_value < 1e-6, fit


@pytest.mark.parametrize("which", [1, 2])
def test_greedy_parallel_equals_plain_decoding(models, which):
    generator = TextGenerator(models[0], models[which])
    prompts, hits = ["abc abc (", "x) (x", "((a"], 0
    for prompt in prompts:
        plain = generator.generate(prompt, method="ar", max_new_tokens=24).tokens
        result = generator.generate(prompt, method="parallel", max_new_tokens=24, num_draft_tokens=4)
        assert result.tokens == plain
        hits += result.stats["ahead_hits"]
    assert hits > 0 or which == 2  # the unrelated draft guesses seldom


# ---- timing ----------------------------------------------------------------------------------------------------


def test_outputs_do_not_depend_on_timing(models, generator):
    """50 runs at temperature 1 with random delays before every draft forward (draft process) and every target
    forward (main process): the same tokens each time, and `draft`'s."""
    prompts = [generator.encode(p) for p in ("ab (", "x x x")]
    sampling = {"temperature": 1.0, "top_k": 3}  # a law peaked enough for the guessed bonus tokens to be right
    expected = generator.pipeline("draft", prompts, max_new_tokens=20, sampling=sampling,
                                  params={"num_draft_tokens": 3}).generate(prompts, seed=4).tokens
    config = _config(models[1], branches=2, jitter_s=0.002, top_k=3)
    rng, outputs, hits = random.Random(0), set(), 0
    for run in range(50):
        pipeline = generator.pipeline("parallel", prompts, max_new_tokens=20, sampling=sampling,
                                      params={"num_draft_tokens": 3, "branches": 2})
        pipeline.drafter = ParallelDrafter(config)
        score = pipeline.target.score

        def slow_score(*args, **kwargs):
            time.sleep(rng.uniform(0, 0.003))
            return score(*args, **kwargs)
        pipeline.target.score = slow_score
        result = pipeline.generate(prompts, seed=4)
        outputs.add(tuple(map(tuple, result.tokens)))
        hits += pipeline.drafter.run_summary()["ahead_hits"]
    assert outputs == {tuple(map(tuple, expected))}
    assert hits > 50


# ---- errors ----------------------------------------------------------------------------------------------------


def test_bad_requests_are_refused(generator, models):
    with pytest.raises(InvalidRequest, match="'parallel' needs a draft model"):
        TextGenerator(models[0]).generate("ab", method="parallel", max_new_tokens=8)
    with pytest.raises(InvalidRequest, match="branches"):
        generator.generate("ab", method="parallel", max_new_tokens=8, branches=0)
    with pytest.raises(InvalidRequest, match="worker"):
        generator.generate("ab", method="parallel", max_new_tokens=8, worker="thread")


def test_a_draft_process_that_dies_is_reported(models):
    from specgen.modalities.drafters.parallel import DraftProcessError

    drafter = ParallelDrafter(_config(models[2]))
    ctx = DecodeContext([torch.tensor([3, 4])], torch.tensor([0]), torch.tensor([0]), 0)
    drafter.propose(ctx, 2)
    drafter.worker.process.kill()
    drafter.worker.process.wait()
    with pytest.raises(DraftProcessError, match="exited"):
        drafter.propose(ctx, 2)


def test_a_served_queue_refills_rows_and_matches_plain_decoding(generator):
    from chain_checks import queued_and_alone

    served, alone = queued_and_alone(generator, "parallel", {"num_draft_tokens": 3})
    assert served == alone
