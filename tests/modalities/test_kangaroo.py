"""Kangaroo self-speculation (modalities/drafters/kangaroo.py) on a tiny random Llama with a random adapter: the
served self-draft computes the adapter's law, greedy output equals plain decoding token for token, sampled output
follows the target (chi-square), the chain rule with the adapter's confidence-stopped law is exact by enumeration,
and deliberately wrong variants (the draft's law leaking into what is committed; a draft cache never rolled back)
fail the same tests. Also: the errors where no adapter fits, `auto` leaving kangaroo out, and a two-step resumable
training run."""

import dataclasses
import itertools

import pytest
import torch

from chain_checks import (LeakyRule, Recorder, memo, queued_and_alone, real_slots, sampled_fit, save_random_adapter,
                          stopped_chain_proposals)
from tiny_models import HFTable, save_tiny
from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.drafters.kangaroo import KangarooAdapter, KangarooDrafter, adapter_path, find_adapter
from specgen.modalities.drafters.shallow_pass import ShallowPassTarget
from specgen.modalities.pipeline import servable
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.modalities.text.training.distill.windows import model_sha256
from specgen.modalities.text.training.kangaroo import draft_logits
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint
from specgen.samplers.processing import Processing
from specgen.samplers.registry import get_method

EXIT = 1
PROMPT = "abc abc abc (x"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kangaroo") / "target"
    save_tiny(folder, 0, layers=3, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    return folder, model, save_random_adapter(model, folder, EXIT, seed=3)


@pytest.fixture(scope="module")
def generator(tiny):
    return TextGenerator(str(tiny[0]))


class AdapterLaw:
    """The self-draft's logits computed the reference way (transformers' layers, then the adapter module), as
    `lm.logits(context)` for the oracle."""

    def __init__(self, model, adapter):
        self.model, self.adapter = model, adapter

    @torch.no_grad()
    def logits(self, context):
        hidden = self.model.model(input_ids=torch.tensor([list(context)]), output_hidden_states=True).hidden_states
        return draft_logits(self.model, self.adapter, hidden[EXIT])[0, -1].double()


def law_errors(generator, tiny, drafter=None, **options):
    """Largest gap between every reported draft law of a run and the adapter's law at that context."""
    folder, model, adapter = tiny
    pipeline = generator.pipeline("kangaroo", [generator.encode(PROMPT)], max_new_tokens=24,
                                  params={"confidence": 0.0, "num_draft_tokens": 4}, sampling=options)
    recorder = Recorder(drafter or pipeline.drafter)
    pipeline.drafter = recorder
    list(pipeline.run([generator.encode(PROMPT)] * 2))
    reference, worst = AdapterLaw(model, adapter), 0.0
    for contexts, draft in recorder.seen:
        for row, context in enumerate(contexts):
            for slot in range(int(draft.drafted()[row])):
                law = pipeline.processing(reference.logits(context + draft.tokens[row, :slot].tolist()))
                worst = max(worst, float((draft.draft_probs[row, slot].double() - law).abs().max()))
    return worst


class NoRollback(KangarooDrafter):
    """Bug: keeps the KV of rejected drafts (the cache is never cut back to the committed prefix)."""

    def _catch_up(self, ctx):
        lengths = self.engine.cache.lengths.clone()
        backlog = super()._catch_up(ctx)
        self.engine.cache.lengths.copy_(torch.maximum(lengths, self.engine.cache.lengths))
        return backlog


# ---- the served self-draft ----------------------------------------------------------------------------------------


def test_served_self_draft_is_the_adapters_law(generator, tiny):
    """Every law the drafter reports is the adapter's law at that context (cache, rollback and runner included)."""
    assert law_errors(generator, tiny) < 1e-4
    assert law_errors(generator, tiny, temperature=1.0, top_k=4) < 1e-4


def test_a_draft_cache_that_is_never_rolled_back_is_caught(generator, tiny):
    folder, model, adapter = tiny
    wrong = NoRollback(model, adapter, Processing(temperature=0), capacity=512)  # stale slots pile up
    assert law_errors(generator, tiny, drafter=wrong) > 1e-3


def test_self_draft_shares_the_targets_weights(tiny):
    folder, model, adapter = tiny
    runner = KangarooDrafter(model, adapter, Processing()).engine.runner
    assert len(runner.layers) == EXIT + 1
    assert runner.embed.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert runner.lm_head.data_ptr() == model.lm_head.weight.data_ptr()


# ---- exactness ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"confidence": 0.0, "num_draft_tokens": 8}, {"confidence": 0.9}])
def test_greedy_kangaroo_equals_plain_decoding(generator, params):
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=40)
    spec = generator.generate(PROMPT, method="kangaroo", max_new_tokens=40, **params)
    assert spec.tokens == plain.tokens and spec.stats["lossless"]
    batch = generator.generate(PROMPT, method="kangaroo", max_new_tokens=40, num_samples=2, **params)
    assert all(s["tokens"] == plain.tokens for s in batch.samples)


def test_greedy_drafts_are_accepted_and_stop_by_confidence(generator):
    never = generator.generate(PROMPT, method="kangaroo", max_new_tokens=40, confidence=0.0, num_draft_tokens=4)
    often = generator.generate(PROMPT, method="kangaroo", max_new_tokens=40, confidence=0.9, num_draft_tokens=4)
    assert never.stats["accepted"] > 0  # the test exercises acceptance, not only recovery
    assert never.stats["mean_draft_length"] > often.stats["mean_draft_length"]


@pytest.mark.parametrize("shallow_pass", ["recompute", "reuse"])
def test_sampled_kangaroo_follows_the_target(generator, shallow_pass):
    # batches of 200 rows: a window of every row fits the compiled step, so `reuse` does reuse
    fit, stats = sampled_fit(generator, "kangaroo", {"confidence": 0.2, "shallow_pass": shallow_pass}, rows=200)
    assert shallow_pass == "recompute" or stats["shallow_reused_slots"] > stats["verified_slots"] / 4
    assert fit.p_value > 1e-4, fit
    assert stats["tau"] > 1.05  # drafts are accepted


def test_the_drafts_law_leaking_into_the_output_fails_the_same_test(generator):
    fit, _ = sampled_fit(generator, "kangaroo", {"confidence": 0.2}, LeakyRule())
    assert fit.p_value < 1e-6, fit


@pytest.mark.parametrize("rule,exact", [(ChainRejection(), True), (LeakyRule(), False)])
def test_the_chain_rule_with_the_adapters_stopped_law_is_exact(tiny, rule, exact):
    folder, model, adapter = tiny
    processing = Processing(temperature=1.0, top_k=2)  # a small support keeps the enumeration short
    target = HFTable(model)
    draft = AdapterLaw(model, adapter)
    law = memo(lambda c: processing(draft.logits(c)))
    plain = memo(lambda c: draft.logits(c).softmax(-1))
    prompt = (0, 2, 3)
    # the median top-1 probability over the first two drafted levels: chains stop at every depth
    levels = [list(prompt) + [t] for t in law(prompt).nonzero().flatten().tolist()]
    levels += [c + [t] for c in levels for t in law(c).nonzero().flatten().tolist()]
    threshold = sorted(float(plain(c).max()) for c in levels)[len(levels) // 2]
    proposals = lambda prefix: stopped_chain_proposals(law, plain, prefix, 3, threshold)
    drafted = {int(p.drafted()[0]) for _, p in itertools.islice(proposals(prompt), 64)}
    assert len(drafted) > 1  # ragged chains are enumerated
    out = exact_output(target, processing, rule, proposals, prompt, 3)
    gap = max_abs_diff(out, target_joint(target, processing, prompt, 3))
    assert gap < 1e-9 if exact else gap > 1e-3


# ---- verification reusing the shallow pass ------------------------------------------------------------------------


class CheckedReuse(ShallowPassTarget):
    """Scores every reused window twice, reusing and in full, and records whether the logits are the same bits."""

    def __init__(self, engine, drafter):
        super().__init__(engine, drafter)
        self.same: list[bool] = []
        self.ragged = 0  # reused windows whose rows drafted different numbers of tokens

    def score(self, tokens, positions, rows, tree_mask=None, valid=None, logits_to_keep=0):
        before = self.reused_slots
        scored = super().score(tokens, positions, rows, tree_mask, valid, logits_to_keep)
        if self.reused_slots > before:  # real slots only: a ragged window's padding is never read
            real = real_slots(tokens, valid)
            full = self.engine.score(tokens, positions, rows, tree_mask, valid, logits_to_keep)
            self.same.append(torch.equal(scored[real], full[real]))
            self.ragged += valid is not None
        return scored


class ShiftedSlots(CheckedReuse):
    """Bug: the draft's keys and values are taken one slot too late (another token's shallow pass)."""

    @staticmethod
    def _copy(storage, draft_storage, at):
        rows, heads, slots = at
        slots = slots + 1 if isinstance(slots, torch.Tensor) else slice(slots.start + 1, slots.stop + 1)
        storage[at] = draft_storage[rows, heads, slots]


class WrongLayer(CheckedReuse):
    """Bug: the window's reused stream is the one entering the target's first layer, not the one after layer ℓ."""

    def _score(self, tokens, positions, rows, reused):
        embedded = torch.nn.functional.embedding(tokens[:, :reused], self.engine.runner.embed)
        self.drafter.shallow = dataclasses.replace(self.drafter.shallow, hidden=embedded)
        return super()._score(tokens, positions, rows, reused)


def reuse_run(generator, verifying=CheckedReuse, num_samples=1):
    """Greedy kangaroo with the shallow pass reused, each reused window also scored in full: (verifying target,
    tokens per row); two prompts of different lengths (rows at different slots) unless one sample."""
    prompts = [generator.encode(PROMPT), generator.encode("ab ab (x")][:max(num_samples, 1)]
    pipeline = generator.pipeline("kangaroo", prompts, max_new_tokens=32,
                                  params={"confidence": 0.0, "num_draft_tokens": 4, "shallow_pass": "reuse"})
    pipeline.target = verifying(pipeline.target.engine, pipeline.drafter)
    return pipeline.target, pipeline.generate(prompts).tokens


@pytest.mark.parametrize("rows", [1, 2])
def test_verification_reusing_the_shallow_pass_scores_the_same_bits(generator, rows):
    checked, tokens = reuse_run(generator, num_samples=rows)
    assert len(checked.same) > 5 and all(checked.same)
    assert checked.reused_slots > checked.scored_slots / 2  # the pending token and all drafts but the last
    assert rows == 1 or checked.ragged  # a row near its token limit drafts less: padded windows are reused too
    plain = [generator.generate(p, method="ar", max_new_tokens=32).tokens for p in (PROMPT, "ab ab (x")[:rows]]
    assert tokens == plain


@pytest.mark.parametrize("bug", [ShiftedSlots, WrongLayer])
def test_a_shallow_pass_from_the_wrong_slot_or_layer_fails_the_same_test(generator, bug):
    checked, _ = reuse_run(generator, bug)
    assert checked.same and not any(checked.same)


def test_a_served_queue_reusing_the_shallow_pass_gets_what_each_request_gets_alone(generator):
    served, alone = queued_and_alone(generator, "kangaroo", {"shallow_pass": "reuse", "num_draft_tokens": 4})
    assert served == alone


def test_rows_a_torch_forward_wrote_are_verified_in_full(generator):
    pipeline = generator.pipeline("kangaroo", [generator.encode(PROMPT)], max_new_tokens=8,
                                  params={"shallow_pass": "reuse"})
    engine = pipeline.target.engine
    engine.runner.decode_kernel = False  # every target forward takes torch's path (bits may depend on the window)
    result = pipeline.generate([generator.encode(PROMPT)])
    assert not bool(engine.cache.compiled.any()) and pipeline.target.reused_slots == 0
    assert result.tokens == [generator.generate(PROMPT, method="ar", max_new_tokens=8).tokens]
    recompute = generator.pipeline("kangaroo", [generator.encode(PROMPT)], max_new_tokens=8,
                                   params={"shallow_pass": "recompute"})
    assert not isinstance(recompute.target, ShallowPassTarget) and recompute.drafter.shallow is None


# ---- where it is served ----------------------------------------------------------------------------------------------


def test_a_target_without_an_adapter_is_refused(tmp_path, tiny):
    folder = tmp_path / "other"
    save_tiny(folder, 5, layers=3, hidden=32)
    other = TextGenerator(str(folder))
    with pytest.raises(ModelNotFound, match="train adapter"):
        other.generate("ab", method="kangaroo", max_new_tokens=2)
    spec = get_method("text", "kangaroo")
    assert not servable(other, spec) and servable(TextGenerator(str(tiny[0])), spec)  # bench's default set
    # an adapter trained for another target is not this one's
    (folder / "kangaroo").mkdir()
    adapter_path(folder / "kangaroo", EXIT).hardlink_to(adapter_path(tiny[0] / "kangaroo", EXIT))
    with pytest.raises(ModelNotFound):
        find_adapter(str(folder))
    with pytest.raises(InvalidRequest, match="exit_layer 2"):
        find_adapter(str(tiny[0]), 2)
    assert find_adapter(str(tiny[0])) == find_adapter(str(tiny[0]), EXIT)


def test_auto_leaves_kangaroo_to_explicit_requests(generator):
    from specgen.modalities.auto import candidate_names

    assert "kangaroo" not in candidate_names(generator, {})


# ---- training -------------------------------------------------------------------------------------------------------


def test_two_training_steps_export_an_adapter_that_serves_and_resume(tmp_path, tiny):
    from specgen.modalities.text.training.kangaroo import KangarooConfig, train_adapter

    folder = tiny[0]
    cfg = KangarooConfig(run_dir=str(tmp_path / "run"), out=str(tmp_path / "export"), target=str(folder),
                         exit_layer=2, steps=2, batch_size=2, windows=4, prompt_len=4, new_tokens=4, eval_windows=2,
                         max_files=2, cache_dir=str(tmp_path / "cache"), warmup=1)
    summary = train_adapter(cfg, say=lambda text: None)
    assert summary["steps"] == 2 and summary["heldout"]["positions"] == 2 * 4
    assert (tmp_path / "export" / "README.md").read_text().count("adapter-exit2") >= 2
    again = train_adapter(cfg, say=lambda text: None)  # the finished checkpoint: nothing left to do
    assert again["steps"] == 2 and again["resumed_from"] == [2]
    adapter = KangarooAdapter.load(tmp_path / "export" / "adapter-exit2.safetensors")
    assert adapter.config.exit_layer == 2 and adapter.config.target_sha256 == model_sha256(folder)
