"""Falcon's semi-autoregressive head (modalities/drafters/falcon.py) on a tiny random target, fitted for seconds
under the block mask. The served drafter reports the law computed the reference way (the head run afresh over the
whole pair sequence, the last true block and each drafted block seeing themselves whole); the same head read under
a plain causal mask, and one fed stale features, are other laws. Greedy output equals plain decoding alone, in
ragged batches and under continuous batching; sampled output follows the target (chi-square); the chain rule over
every chain of the head's blocks is exact by enumeration; the draft's law leaking into the output fails. A two-step
training run exports a head that serves."""

import json

import pytest
import torch

from chain_checks import LeakyRule, queued_and_alone
from feature_heads import (PROMPT, FalconLaw, assert_greedy_is_plain, assert_ragged_is_alone, assert_sampling_law,
                           enumeration_gap, fitted_head, law_errors)
from tiny_models import save_tiny
from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.drafters.falcon import block_visible, find_falcon
from specgen.modalities.pipeline import servable
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.modalities.text.training.eagle_config import config_for
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.registry import get_method


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("falcon") / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    head, _ = fitted_head(model, folder, falcon=True)
    return folder, model, head


@pytest.fixture(scope="module")
def generator(tiny):
    return TextGenerator(str(tiny[0]))


def test_block_mask():
    assert block_visible(5, 2).int().tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0],
                                                  [1, 1, 1, 1, 1]]
    assert block_visible(4, 2, phase=1).int().tolist() == [[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


# ---- the served law -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("draft_tokens", [2, 5])
def test_served_head_is_the_reference_law(generator, tiny, draft_tokens):
    folder, model, head = tiny
    for options in ({}, {"temperature": 1.0, "top_k": 4}):
        assert law_errors(generator, model, head, method="falcon", draft_tokens=draft_tokens,
                          reference=FalconLaw(model, head), **options) < 1e-4
    # the test tells the masks apart: the head read causally (EAGLE's mask) is another law
    assert law_errors(generator, model, head, method="falcon", draft_tokens=draft_tokens,
                      reference=FalconLaw(model, head, relaxed=False)) > 1e-3


def test_a_head_fed_stale_features_is_caught(generator, tiny):
    folder, model, head = tiny
    assert law_errors(generator, model, head, stale=True, method="falcon", draft_tokens=4,
                      reference=FalconLaw(model, head)) > 1e-3


# ---- exactness ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"num_draft_tokens": 1}, {"num_draft_tokens": 3}, {"num_draft_tokens": 6}])
def test_greedy_falcon_equals_plain_decoding(generator, params):
    assert_greedy_is_plain(generator, "falcon", params, accepted=True)


def test_ragged_prompts_and_continuous_batching_decode_as_each_prompt_alone(generator):
    assert_ragged_is_alone(generator, "falcon", {"num_draft_tokens": 4})
    served, alone = queued_and_alone(generator, "falcon", {"num_draft_tokens": 4})
    assert served == alone


def test_sampled_falcon_follows_the_target(generator):
    assert_sampling_law(generator, "falcon", {"num_draft_tokens": 3})


def test_the_drafts_law_leaking_into_the_output_fails_the_same_test(generator):
    assert_sampling_law(generator, "falcon", {"num_draft_tokens": 3}, exact=False)


@pytest.mark.parametrize("rule,exact", [(ChainRejection(), True), (LeakyRule(), False)])
def test_the_chain_rule_with_the_heads_blocks_is_exact(tiny, rule, exact):
    folder, model, head = tiny
    gap = enumeration_gap(model, head, rule, chain=3, reference=FalconLaw(model, head))
    assert gap < 1e-9 if exact else gap > 1e-3


# ---- where it is served, and training -----------------------------------------------------------------------------


def test_a_target_without_a_head_is_refused(tmp_path, generator):
    folder = tmp_path / "other"
    save_tiny(folder, 1, layers=2, hidden=32, wide=True)
    with pytest.raises(ModelNotFound, match="train head --method falcon"):
        TextGenerator(str(folder)).generate("ab", method="falcon", max_new_tokens=2)
    assert not servable(TextGenerator(str(folder)), get_method("text", "falcon"))
    assert servable(generator, get_method("text", "falcon")) and find_falcon(generator.model_path).name == "falcon"
    with pytest.raises(InvalidRequest, match="length_schedule"):
        generator.generate("ab", method="falcon", max_new_tokens=2, length_schedule="kangaroo")


def test_training_blocks_of_one_token_are_eagles_training(tiny):
    """The block loss's alignment (pair t predicts f_{t+k-1} under blocks of k) is EAGLE's at k = 1."""
    from specgen.modalities.text.training.eagle import EagleTask

    folder, model, head = tiny
    task = object.__new__(EagleTask)  # the loss alone: no data
    task.model, task.head, task.rows = model, head, model.lm_head.weight.detach().float()
    ids = torch.randint(2, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = model.model(input_ids=ids).last_hidden_state
        task.cfg = config_for("eagle")
        eagle_terms = task.loss(ids, features, unroll=2)
        task.cfg = config_for("falcon", block=1)
        block_terms = task.block_loss(ids, features, 0.0, 1.0, None, 2, 0.0)
        task.cfg = config_for("falcon")
        two_terms = task.block_loss(ids, features, 0.0, 1.0, None, 2, 0.0)
    for depth in range(2):
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(eagle_terms[depth], block_terms[depth]))
    assert not torch.allclose(eagle_terms[0][0], two_terms[0][0])  # blocks of two predict another feature


def test_two_training_steps_export_a_head_that_serves(tmp_path):
    from specgen.modalities.text.training.eagle import train_eagle

    folder = tmp_path / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    cfg = config_for("falcon", run_dir=str(tmp_path / "run"), out=str(folder / "falcon"), model=str(folder),
                     windows=4, window_len=12, prompt_len=4, eval_windows=2, steps=2, batch_size=2, warmup=1,
                     eval_every=1, max_files=2, data_threads=1, intermediate_size=48)
    assert (cfg.block, cfg.unroll, cfg.glance_start, cfg.glance_end) == (2, 2, 0.6, 0.25)
    summary = train_eagle(cfg, say=lambda text: None)
    assert summary["steps"] == 2 and "alpha_depth2" in summary["after"]
    record = json.loads((folder / "falcon" / "falcon.json").read_text())
    assert record["block"] == 2 and record["command"].startswith("specgen train head --method falcon")
    assert "--block" not in record["command"]  # the method's own default
    assert "Falcon head" in (folder / "falcon" / "README.md").read_text()
    generator = TextGenerator(str(folder))
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=12)
    assert generator.generate(PROMPT, method="falcon", max_new_tokens=12).tokens == plain.tokens
