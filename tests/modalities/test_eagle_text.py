"""EAGLE for text (modalities/drafters/eagle.py) on tiny random targets with a random head: the served drafter
reports the head's law computed the reference way (the target's features from a full forward, the head over the
pairs), greedy output equals plain decoding token for token (one row, two, ragged prompts; a reduced output layer
on a served tiny Gemma), sampled output follows the target (chi-square), the chain rule over every chain the head
can propose is exact by enumeration, and deliberately wrong variants (features never updated after verification;
the draft's law leaking into the output) fail the same tests. Also: the target's feature store, the errors where
no head fits, and a two-step training run that exports a head which serves."""

import json

import pytest
import torch

from chain_checks import LeakyRule, Recorder, queued_and_alone
from feature_heads import (PROMPT, assert_greedy_is_plain, assert_ragged_is_alone, assert_sampling_law, enumeration_gap,
                           fitted_head, law_errors)
from tiny_models import save_tiny, save_tiny_gemma_served
from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.drafters.eagle import EagleDrafter, find_head
from specgen.modalities.pipeline import servable
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.processing import Processing
from specgen.samplers.registry import get_method


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle") / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    head, _ = fitted_head(model, folder)
    return folder, model, head


@pytest.fixture(scope="module")
def generator(tiny):
    return TextGenerator(str(tiny[0]))


# ---- the target's features and the served head ----------------------------------------------------------------


def test_the_feature_store_holds_the_committed_tokens_features(tiny):
    folder, model, _ = tiny
    target = TransformersTarget(model, 64, decode_kernel=True)
    target.keep_features()
    prompts = [torch.tensor([0, 2, 3, 4, 5]), torch.tensor([0, 7, 8])]
    target.prefill(prompts)
    window = torch.tensor([[5, 9, 10], [8, 11, 12]])
    positions = torch.tensor([[4, 5, 6], [2, 3, 4]])
    target.score(window, positions, torch.arange(2))
    target.commit(torch.tensor([[True, True, False], [True, False, False]]), torch.arange(2))  # 2 and 1 kept
    for row, (prompt, kept) in enumerate(zip(prompts, ([5, 9], [8]))):
        context = prompt[:-1].tolist() + kept
        with torch.no_grad():
            full = model.model(input_ids=torch.tensor([context])).last_hidden_state[0]
        assert int(target.cache.lengths[row]) == len(context)
        torch.testing.assert_close(target.features[row, :len(context)], full, atol=1e-4, rtol=1e-4)


def test_served_head_is_the_heads_law(generator, tiny):
    folder, model, head = tiny
    assert law_errors(generator, model, head) < 1e-4
    assert law_errors(generator, model, head, temperature=1.0, top_k=4) < 1e-4


def test_a_head_fed_stale_features_is_caught(generator, tiny):
    folder, model, head = tiny
    assert law_errors(generator, model, head, stale=True) > 1e-3


# ---- exactness ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"num_draft_tokens": 1}, {"num_draft_tokens": 8},
                                    {"length_schedule": "kangaroo"}, {"length_schedule": "svip"}])
def test_greedy_eagle_equals_plain_decoding(generator, params):
    assert_greedy_is_plain(generator, "eagle", params)


def test_token_wise_length_rules_cut_the_heads_chains(generator):
    """`length_schedule kangaroo`: a row stops drafting before a token whose head top-1 probability is below the
    threshold (0.6), so chains come out ragged and shorter than the cap."""
    capped = generator.generate(PROMPT, method="eagle", max_new_tokens=40, num_draft_tokens=8)
    stopped = generator.generate(PROMPT, method="eagle", max_new_tokens=40, num_draft_tokens=8,
                                 length_schedule="kangaroo")
    assert stopped.stats["mean_draft_length"] < capped.stats["mean_draft_length"] - 1


def test_auto_times_and_serves_the_head(generator, tmp_path, monkeypatch):
    """`auto` offers eagle where a head exists; its calibration times proposals on a prompt the target never
    prefilled (the drafter then computes the features itself), and the output stays plain decoding's."""
    from specgen.modalities.auto import candidate_names

    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path))  # a fresh calibration record
    assert "eagle" in candidate_names(generator, {})
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=30)
    auto = generator.generate(PROMPT, method="auto", max_new_tokens=30, candidates="eagle,ngram")
    assert auto.tokens == plain.tokens


def test_ragged_prompts_decode_as_they_do_alone(generator):
    assert_ragged_is_alone(generator, "eagle")


def test_sampled_eagle_follows_the_target(generator):
    assert_sampling_law(generator, "eagle", {"num_draft_tokens": 2})


def test_the_drafts_law_leaking_into_the_output_fails_the_same_test(generator):
    assert_sampling_law(generator, "eagle", {"num_draft_tokens": 2}, exact=False)


@pytest.mark.parametrize("rule,exact", [(ChainRejection(), True), (LeakyRule(), False)])
def test_the_chain_rule_with_the_heads_law_is_exact(tiny, rule, exact):
    folder, model, head = tiny
    gap = enumeration_gap(model, head, rule, chain=2)
    assert gap < 1e-9 if exact else gap > 1e-3


# ---- a reduced output layer on the served (int8) Gemma format --------------------------------------------------


@pytest.fixture(scope="module")
def served_gemma(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle-gemma") / "gemma"
    save_tiny_gemma_served(folder)
    model = load_causal_lm(str(folder))
    kept = torch.arange(0, model.config.vocab_size, 2)  # every other token can never be proposed
    fitted_head(model, folder, vocab_ids=kept)
    return TextGenerator(str(folder)), kept


def test_a_reduced_output_layer_on_a_served_gemma_is_exact(served_gemma):
    generator, kept = served_gemma
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=30)
    pipeline = generator.pipeline("eagle", [generator.encode(PROMPT)], max_new_tokens=30)
    recorder = Recorder(pipeline.drafter)
    pipeline.drafter = recorder
    spec = pipeline.generate([generator.encode(PROMPT)])
    assert spec.tokens[0] == plain.tokens
    drafted = torch.cat([draft.tokens.flatten() for _, draft in recorder.seen])
    assert bool((drafted % 2 == 0).all()) and recorder.seen[0][1].draft_probs.shape[-1] == len(kept)
    # output_rows: the 3 most frequent kept tokens and the prompt's own
    pipeline = generator.pipeline("eagle", [generator.encode(PROMPT)], max_new_tokens=30, params={"output_rows": 3})
    recorder = Recorder(pipeline.drafter)
    pipeline.drafter = recorder
    assert pipeline.generate([generator.encode(PROMPT)]).tokens[0] == plain.tokens
    rows = set(kept[:3].tolist()) | set(generator.encode(PROMPT).tolist())
    drafted = set(torch.cat([draft.tokens.flatten() for _, draft in recorder.seen]).tolist())
    assert drafted <= rows and recorder.seen[0][1].draft_probs.shape[-1] == len(rows)


def test_continuous_batching_on_a_served_gemma_equals_each_prompt_alone(served_gemma):
    """Rows refilled with new requests (serve's continuous batching): the row's prefill rewrites its features and
    the head's cache rolls back to nothing it shares with the new prompt."""
    served, alone = queued_and_alone(served_gemma[0], "eagle")
    assert served == alone


# ---- where it is served -----------------------------------------------------------------------------------------


def test_a_target_without_a_head_is_refused(tmp_path, tiny, generator):
    folder = tmp_path / "other"
    save_tiny(folder, 5, layers=2, hidden=32)
    other = TextGenerator(str(folder))
    with pytest.raises(ModelNotFound, match="train head --method eagle"):
        other.generate("ab", method="eagle", max_new_tokens=2)
    spec = get_method("text", "eagle")
    assert not servable(other, spec) and servable(generator, spec)
    (folder / "eagle").symlink_to(tiny[0] / "eagle")  # a head trained for another target is not this one's
    with pytest.raises(ModelNotFound):
        find_head(str(folder))
    with pytest.raises(InvalidRequest, match="prefix constraint"):
        EagleDrafter(tiny[1], TransformersTarget(tiny[1], 64), tiny[2], Processing(constraint=object()))


# ---- training -------------------------------------------------------------------------------------------------


def test_two_training_steps_export_a_head_that_serves(tmp_path, tiny):
    from specgen.modalities.text.training.eagle import EagleConfig, train_eagle

    folder = tmp_path / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    cfg = EagleConfig(run_dir=str(tmp_path / "run"), out=str(folder / "eagle"), model=str(folder), windows=4,
                      window_len=12, prompt_len=4, eval_windows=2, steps=2, batch_size=2, warmup=1, eval_every=1,
                      intermediate_size=16, max_files=2, data_threads=1, vocab_size=8)
    summary = train_eagle(cfg, say=lambda text: None)
    assert summary["steps"] == 2 and summary["output_rows"] == 8 and 0 < summary["after"]["alpha"] <= 1
    record = json.loads((folder / "eagle" / "eagle.json").read_text())
    assert record["command"].startswith("specgen train head --method eagle")
    assert "greedy agreement" in (folder / "eagle" / "README.md").read_text()
    generator = TextGenerator(str(folder))
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=12)
    assert generator.generate(PROMPT, method="eagle", max_new_tokens=12).tokens == plain.tokens
