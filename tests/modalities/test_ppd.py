"""PPD (modalities/drafters/ppd.py): prompt tokens in the verification window guess the next step's drafts."""

from __future__ import annotations

import pytest
import torch

from chain_checks import LeakyRule, Recorder, queued_and_alone, real_slots, sampled_fit
from tiny_models import HFTable, save_tiny
from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.drafters.ppd import PROMPTS_FILE, PPDDrafter, PPDTarget, PromptTokens, layout
from specgen.modalities.pipeline import servable
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.modalities.text.training.distill.windows import model_sha256
from specgen.modalities.text.training.ppd import guess_logits
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint
from specgen.samplers.processing import Processing
from specgen.samplers.registry import get_method
from specgen.samplers.types import Draft

PROMPT = "abc abc abc (x"
COUNT = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ppd") / "target"
    save_tiny(folder, 0, layers=3, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    prompts = PromptTokens.for_target(model, COUNT, model_sha256(folder))
    with torch.no_grad():  # away from the mean embedding, so each prompt token guesses its own way
        prompts.vectors.add_(0.5 * torch.randn(prompts.vectors.shape, generator=torch.Generator().manual_seed(1)))
    prompts.save(folder / "ppd" / PROMPTS_FILE)
    return folder, model, PromptTokens.load(folder / "ppd" / PROMPTS_FILE)


@pytest.fixture(scope="module")
def generator(tiny):
    return TextGenerator(str(tiny[0]))


def reference_guesses(model, prompts, context: list[int]) -> torch.Tensor:
    """[count, vocab] the guesses' logits for the step after `context` (pending last), the reference way: the
    group of prompt tokens after the slot of the token before the pending one."""
    _, guessed = guess_logits(model, prompts, torch.tensor([context[:-1]]), (len(context) - 2,))
    return guessed[0, :, 0].double()


def guess_errors(generator, tiny, drafter_class=PPDDrafter) -> tuple[float, int]:
    """(worst shortfall of a drafted guess's reference logit below the reference maximum, guesses checked)."""
    folder, model, prompts = tiny
    pipeline = generator.pipeline("ppd", [generator.encode(PROMPT)], max_new_tokens=24)
    drafter = drafter_class(pipeline.drafter.prompts)
    pipeline.target = PPDTarget(pipeline.target.engine, drafter)
    pipeline.drafter = Recorder(drafter)
    list(pipeline.run([generator.encode(PROMPT), generator.encode("ab ab (x")]))
    worst, checked = 0.0, 0
    for contexts, draft in pipeline.drafter.seen:
        for row, context in enumerate(contexts):
            drafted = int(draft.drafted()[row])
            if drafted:
                logits = reference_guesses(model, prompts, context)[:drafted]  # [drafted, vocab]
                picked = logits.gather(1, draft.tokens[row, :drafted, None])[:, 0]
                worst = max(worst, float((logits.max(-1).values - picked).max()))
                checked += drafted
    return worst, checked


class AcceptGuesses(LeakyRule):
    """Bug: every drafted guess is committed (its point mass stands in for the target's law at its slot; the
    enumeration oracle reads LeakyRule's decisions, the sampled run this call)."""

    def __call__(self, draft, target_probs, noise):
        leaked = target_probs.clone()
        if draft.length:
            guessed = torch.nn.functional.one_hot(draft.tokens, target_probs.shape[-1]).to(leaked.dtype)
            drafted = (torch.arange(draft.length) < draft.drafted()[:, None])[..., None]
            leaked[:, :draft.length] = torch.where(drafted, guessed, leaked[:, :draft.length])
        return super().__call__(draft, leaked, noise)


class LastGroup(PPDDrafter):
    """Bug: drafts the guesses of the group after the window's last slot, whatever was accepted (right only when
    every draft was)."""

    def propose(self, ctx, budget):
        for row, first in zip(ctx.rows.tolist(), ctx.next_positions.tolist()):
            if row in self.guesses:
                guessed = self.guesses[row][1]
                self.guesses[row] = (first - (len(guessed) - 1), guessed)
        return super().propose(ctx, budget)


# ---- the layout and the served guesses ---------------------------------------------------------------------------


def test_layout_real_slots_are_causal_and_prompt_tokens_see_their_groups_prefix():
    offsets, visible = layout(3, (0, 2), 2)
    assert offsets.tolist() == [0, 1, 2, 1, 2, 3, 4]
    assert torch.equal(visible[:3, :3], torch.ones(3, 3, dtype=torch.bool).tril()) and not visible[:3, 3:].any()
    assert visible[4].tolist() == [True, False, False, True, True, False, False]  # group after slot 0, second token
    assert visible[5].tolist() == [True, True, True, False, False, True, False]  # group after slot 2, first token


def test_served_guesses_are_the_prompt_tokens_argmax_at_that_context(generator, tiny):
    worst, checked = guess_errors(generator, tiny)
    assert checked > 10 and worst < 1e-4


def test_guesses_from_the_wrong_group_fail_the_same_test(generator, tiny):
    worst, checked = guess_errors(generator, tiny, LastGroup)
    assert checked > 10 and worst > 1e-2


# ---- exactness ---------------------------------------------------------------------------------------------------


class CheckedWindow(PPDTarget):
    """Scores each window again without prompt tokens and records whether the real slots' logits are the same bits."""

    same: list[bool] = []

    def score(self, tokens, positions, rows, tree_mask=None, valid=None, logits_to_keep=0):
        scored = super().score(tokens, positions, rows, tree_mask, valid, logits_to_keep)
        real = real_slots(tokens, valid)  # a ragged window's padding is never read
        plain = self.engine.score(tokens, positions, rows, tree_mask, valid, logits_to_keep)
        self.same.append(torch.equal(scored[real], plain[real]))
        return scored


@pytest.mark.parametrize("rows", [1, 2])
def test_greedy_ppd_equals_plain_decoding_and_the_window_changes_no_real_slot(generator, rows):
    texts = [PROMPT, "ab ab (x"][:rows]
    prompts = [generator.encode(t) for t in texts]
    pipeline = generator.pipeline("ppd", prompts, max_new_tokens=40)
    checked = CheckedWindow(pipeline.target.engine, pipeline.drafter)
    checked.same = []
    pipeline.target = checked
    result = pipeline.generate(prompts)
    assert result.tokens == [generator.generate(t, method="ar", max_new_tokens=40).tokens for t in texts]
    assert result.stats["lossless"] and len(checked.same) > 10 and all(checked.same)
    assert result.stats["accepted"] > 0  # guesses are drafted and some accepted: the test exercises acceptance


def test_sampled_ppd_follows_the_target(generator):
    fit, stats = sampled_fit(generator, "ppd", {}, rows=200)
    assert fit.p_value > 1e-4, fit
    assert stats["mean_draft_length"] > 0


def test_guesses_committed_unchecked_fail_the_same_test(generator):
    fit, _ = sampled_fit(generator, "ppd", {}, AcceptGuesses(), rows=200)
    assert fit.p_value < 1e-6, fit


@pytest.mark.parametrize("rule,exact", [(ChainRejection(), True), (AcceptGuesses(), False)])
def test_the_chain_rule_with_the_prompt_tokens_guesses_is_exact(tiny, rule, exact):
    """Exact enumeration: every context's proposal is the reference guesses (point masses), drafted with certainty."""
    folder, model, prompts = tiny
    processing = Processing(temperature=1.0, top_k=2)
    target = HFTable(model)

    def proposals(prefix):
        if len(prefix) < 2:
            yield 1.0, Draft(torch.zeros(1, 0, dtype=torch.long))
            return
        yield 1.0, Draft(reference_guesses(model, prompts, list(prefix)).argmax(-1)[None, :2])

    prompt = (0, 2, 3)
    out = exact_output(target, processing, rule, proposals, prompt, 3)
    gap = max_abs_diff(out, target_joint(target, processing, prompt, 3))
    assert gap < 1e-9 if exact else gap > 1e-3


def test_a_served_queue_gets_what_each_request_gets_alone(generator):
    """Continuous batching: a row taking the next request starts without the last one's guesses."""
    served, alone = queued_and_alone(generator, "ppd")
    assert served == alone


# ---- where it is served ------------------------------------------------------------------------------------------


def test_a_target_without_prompt_tokens_is_refused_and_auto_does_not_offer_ppd(tmp_path, generator):
    from specgen.modalities.auto import candidate_names

    folder = tmp_path / "other"
    save_tiny(folder, 5, layers=3, hidden=32)
    other = TextGenerator(str(folder))
    with pytest.raises(ModelNotFound, match="train head --method ppd"):
        other.generate("ab", method="ppd", max_new_tokens=2)
    spec = get_method("text", "ppd")
    assert not servable(other, spec) and servable(generator, spec)
    assert "ppd" not in candidate_names(generator, {})
    with pytest.raises(InvalidRequest, match="own verification window"):
        candidate_names(generator, {"candidates": "ngram,ppd"})


def test_two_training_steps_export_prompt_tokens_that_serve_and_resume(tmp_path, tiny):
    from specgen.modalities.text.training.ppd import PPDConfig, train_prompts

    folder = tiny[0]
    cfg = PPDConfig(run_dir=str(tmp_path / "run"), out=str(tmp_path / "export"), target=str(folder), steps=2,
                    batch_size=2, anchors=3, windows=4, prompt_len=4, new_tokens=8, eval_windows=2, max_files=2,
                    cache_dir=str(tmp_path / "cache"), warmup=1)
    summary = train_prompts(cfg, say=lambda text: None)
    assert summary["steps"] == 2 and summary["params"] == COUNT * 32
    assert len(summary["heldout"]["greedy_agreement"]) == COUNT
    assert PROMPTS_FILE in (tmp_path / "export" / "README.md").read_text()
    again = train_prompts(cfg, say=lambda text: None)  # the finished checkpoint: nothing left to do
    assert again["steps"] == 2 and again["resumed_from"] == [2]
    loaded = PromptTokens.load(tmp_path / "export" / PROMPTS_FILE)
    assert loaded.config.target_sha256 == model_sha256(folder)
