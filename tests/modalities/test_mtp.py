"""FastMTP's module (modalities/drafters/mtp.py) on a tiny random target, fitted for seconds with its input norms
started away from 1. The served drafter reports the law computed the reference way (the module run afresh over the
pair sequence, deeper tokens on its own outputs), greedy output equals plain decoding alone, in ragged batches and
under continuous batching, sampled output follows the target (chi-square), the chain rule over every chain is exact
by enumeration; the same law without the input norms, and the draft's law leaking into the output, fail. The
per-request vocabulary follows the prompt's kind of text, and a two-step training run exports a module that
serves."""

import json

import pytest
import torch

from chain_checks import LeakyRule, Recorder, queued_and_alone
from feature_heads import (PROMPT, assert_greedy_is_plain, assert_ragged_is_alone, assert_sampling_law, enumeration_gap,
                           fitted_head, law_errors)
from tiny_models import save_tiny
from specgen.errors import ModelNotFound
from specgen.modalities.drafters.eagle import TextEagleHead
from specgen.modalities.drafters.mtp import choose_kind, find_mtp
from specgen.modalities.pipeline import servable
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.modalities.text.training.eagle_config import config_for
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.registry import get_method


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp") / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    head, _ = fitted_head(model, folder, mtp=True)
    return folder, model, head


@pytest.fixture(scope="module")
def generator(tiny):
    return TextGenerator(str(tiny[0]))


def without_norms(head):
    """The same fc and layer read without FastMTP's input norms (an EAGLE head's pairs)."""
    plain = TextEagleHead(head.body.config)
    plain.fc, plain.body = head.fc, head.body
    return plain


# ---- the served law -----------------------------------------------------------------------------------------------


def test_served_module_is_the_reference_law(generator, tiny):
    folder, model, head = tiny
    for options in ({}, {"temperature": 1.0, "top_k": 4}):
        assert law_errors(generator, model, head, method="mtp", draft_tokens=4, **options) < 1e-4
    # the test can tell the norms apart: the module read without them is another law
    assert law_errors(generator, model, without_norms(head), method="mtp", draft_tokens=4) > 1e-3


def test_module_fed_stale_features_is_caught(generator, tiny):
    folder, model, head = tiny
    assert law_errors(generator, model, head, stale=True, method="mtp", draft_tokens=4) > 1e-3


# ---- exactness ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"num_draft_tokens": 1}, {"num_draft_tokens": 6},
                                    {"length_schedule": "kangaroo"}])
def test_greedy_mtp_equals_plain_decoding(generator, params):
    assert_greedy_is_plain(generator, "mtp", params)


def test_ragged_prompts_and_continuous_batching_decode_as_each_prompt_alone(generator):
    assert_ragged_is_alone(generator, "mtp", {"num_draft_tokens": 4})
    served, alone = queued_and_alone(generator, "mtp", {"num_draft_tokens": 4})
    assert served == alone


def test_sampled_mtp_follows_the_target(generator):
    assert_sampling_law(generator, "mtp", {"num_draft_tokens": 3})


def test_the_drafts_law_leaking_into_the_output_fails_the_same_test(generator):
    assert_sampling_law(generator, "mtp", {"num_draft_tokens": 3}, exact=False)


@pytest.mark.parametrize("rule,exact", [(ChainRejection(), True), (LeakyRule(), False)])
def test_the_chain_rule_with_the_modules_law_is_exact(tiny, rule, exact):
    folder, model, head = tiny
    gap = enumeration_gap(model, head, rule, chain=3)
    assert gap < 1e-9 if exact else gap > 1e-3


# ---- the per-request vocabulary -----------------------------------------------------------------------------------


def test_the_kind_covering_most_of_the_prompt_is_chosen():
    kinds = {"code": torch.tensor([5, 6, 7, 8]), "prose": torch.tensor([1, 2, 3, 4])}
    assert choose_kind(kinds, torch.tensor([1, 2, 9, 5]), rows=4) == "prose"
    assert choose_kind(kinds, torch.tensor([1, 6, 7, 5]), rows=4) == "code"
    assert choose_kind(kinds, torch.tensor([1, 6, 7, 5]), rows=1) == "code"  # 5 against 1: a tie, the first listed
    assert choose_kind({}, torch.tensor([1]), rows=4) is None


def test_draft_rows_are_the_prompts_kind_and_its_own_tokens(tmp_path):
    folder = tmp_path / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    vocab = model.config.vocab_size
    kinds = {"code": torch.arange(vocab - 1, -1, -1), "prose": torch.arange(vocab)}
    fitted_head(model, folder, vocab_ids=torch.arange(vocab), steps=20, mtp=True, kinds=kinds)
    generator = TextGenerator(str(folder))
    for prompt in ("abc abc", "zzy zy"):
        ids = generator.encode(prompt)
        kind = choose_kind(kinds, ids, 4)
        pipeline = generator.pipeline("mtp", [ids], max_new_tokens=16, params={"output_rows": 4})
        recorder = Recorder(pipeline.drafter)
        pipeline.drafter = recorder
        result = pipeline.generate([ids])
        assert result.tokens[0] == generator.generate(prompt, method="ar", max_new_tokens=16).tokens
        rows = set(kinds[kind][:4].tolist()) | set(ids.tolist())
        drafted = set(torch.cat([draft.tokens.flatten() for _, draft in recorder.seen]).tolist())
        assert drafted <= rows and recorder.seen[0][1].draft_probs.shape[-1] == len(rows)
        assert recorder.drafter.run_summary()["vocabulary"] == kind
    assert {choose_kind(kinds, generator.encode(p), 4) for p in ("abc abc", "zzy zy")} == {"code", "prose"}


# ---- where it is served, and training ---------------------------------------------------------------------------


def test_a_target_without_a_module_is_refused(tmp_path, generator):
    folder = tmp_path / "other"
    save_tiny(folder, 1, layers=2, hidden=32, wide=True)
    with pytest.raises(ModelNotFound, match="train head --method mtp"):
        TextGenerator(str(folder)).generate("ab", method="mtp", max_new_tokens=2)
    assert not servable(TextGenerator(str(folder)), get_method("text", "mtp"))
    assert servable(generator, get_method("text", "mtp")) and find_mtp(generator.model_path).name == "mtp"


def test_mtp_defaults_and_depth_weights():
    from specgen.modalities.text.training.eagle import depth_weights

    cfg = config_for("mtp", steps=3)
    assert (cfg.feature_weight, cfg.noise, cfg.unroll, cfg.sampled_prose) == (0.0, 0.0, 3, True)
    assert config_for("mtp", unroll=2).unroll == 2 and config_for("eagle").feature_weight == 1.0
    weights = depth_weights(cfg, 3)
    assert abs(sum(weights) - 1) < 1e-9 and weights[0] > weights[1] > weights[2]
    assert abs(weights[1] / weights[0] - 0.6) < 1e-9
    assert depth_weights(config_for("eagle"), 2) == [0.5, 0.5]


def test_two_training_steps_export_a_module_that_serves(tmp_path):
    from specgen.modalities.text.training.eagle import train_eagle

    folder = tmp_path / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    cfg = config_for("mtp", run_dir=str(tmp_path / "run"), out=str(folder / "mtp"), model=str(folder), windows=4,
                     window_len=12, prompt_len=4, eval_windows=2, steps=2, batch_size=2, warmup=1, eval_every=1,
                     max_files=2, data_threads=1, intermediate_size=48)
    summary = train_eagle(cfg, say=lambda text: None)
    assert summary["steps"] == 2 and "alpha_depth3" in summary["after"] and len(summary["depth_weights"]) == 3
    record = json.loads((folder / "mtp" / "mtp.json").read_text())
    assert record["command"].startswith("specgen train head --method mtp") and record["config"]["unroll"] == 3
    assert "--unroll" not in record["command"]  # the method's own default
    assert "FastMTP module" in (folder / "mtp" / "README.md").read_text()
    generator = TextGenerator(str(folder))
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=12)
    assert generator.generate(PROMPT, method="mtp", max_new_tokens=12).tokens == plain.tokens
