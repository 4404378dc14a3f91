"""PosS position specialists (modalities/drafters/poss.py) on a tiny random target: an EAGLE head fitted for seconds
and two further specialists (its layer, perturbed, so each depth's layer differs). The served drafter reports the
law computed the reference way (specialist k - 1 run afresh over the pairs for drafted token k), greedy output
equals plain decoding, sampled output follows the target (chi-square), the chain rule over every chain is exact by
enumeration; the same law computed with one layer for every depth (plain EAGLE), features never updated after
verification and the draft's law leaking into the output all fail. Also: where it is served, and a two-step
training run that exports specialists which serve."""

import json

import pytest
import torch

from chain_checks import LeakyRule, queued_and_alone
from feature_heads import (PROMPT, assert_greedy_is_plain, assert_ragged_is_alone, assert_sampling_law, enumeration_gap,
                           fitted_head, law_errors)
from tiny_models import save_tiny
from specgen.errors import ModelNotFound
from specgen.modalities.drafters.poss import PossHead, find_poss, load_poss
from specgen.modalities.pipeline import servable
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.registry import get_method


def add_specialists(folder, base, count=3, seed=5):
    """`count` specialists over the head at folder/eagle: copies of its layer, perturbed, saved in folder/poss."""
    torch.manual_seed(seed)
    head = PossHead(base, count)
    with torch.no_grad():
        for p in head.specialists.parameters():
            p.add_(torch.randn_like(p) * 0.3 * p.std().clamp(min=1e-3))
    head.save(folder / "poss", folder / "eagle", str(folder), {"target": str(folder), "after": {}})
    return load_poss(folder / "poss", folder / "eagle")[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("poss") / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    base, _ = fitted_head(model, folder)
    return folder, model, base, add_specialists(folder, base)


@pytest.fixture(scope="module")
def generator(tiny):
    return TextGenerator(str(tiny[0]))


# ---- the served law -----------------------------------------------------------------------------------------------


def test_served_specialists_are_the_reference_law(generator, tiny):
    folder, model, base, head = tiny
    for options in ({}, {"temperature": 1.0, "top_k": 4}):
        assert law_errors(generator, model, head, method="poss", draft_tokens=5, **options) < 1e-4
    # the test can tell the specialists apart: one layer for every depth (plain EAGLE) is not this law
    assert law_errors(generator, model, base, method="poss", draft_tokens=5) > 1e-3


def test_specialists_fed_stale_features_are_caught(generator, tiny):
    folder, model, _, head = tiny
    assert law_errors(generator, model, head, stale=True, method="poss", draft_tokens=5) > 1e-3


def test_each_depth_reads_its_own_specialist(generator):
    """Drafted token k comes from specialist k - 1 (the last past the count): the engines' caches say so."""
    pipeline = generator.pipeline("poss", [generator.encode(PROMPT)], max_new_tokens=12,
                                  params={"num_draft_tokens": 5})
    pipeline.generate([generator.encode(PROMPT)])
    drafter = pipeline.drafter
    assert len(drafter.engines) == 3 and all(e.cache is not None for e in drafter.engines)
    # between steps every specialist's cache holds true pairs only (pairs 1..m of its cached context)
    for engine, cached in zip(drafter.engines, drafter.cached):
        assert int(engine.cache.lengths[0]) == len(cached[0]) - 1


# ---- exactness ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"num_draft_tokens": 1}, {"num_draft_tokens": 2}, {"num_draft_tokens": 8},
                                    {"length_schedule": "kangaroo"}])
def test_greedy_poss_equals_plain_decoding(generator, params):
    assert_greedy_is_plain(generator, "poss", params)


def test_ragged_prompts_decode_as_they_do_alone(generator):
    assert_ragged_is_alone(generator, "poss", {"num_draft_tokens": 4})


def test_continuous_batching_equals_each_prompt_alone(generator):
    """Rows refilled with new requests (`serve`, `batch --rows`): every specialist's cache rolls back to nothing
    it shares with the row's new prompt."""
    served, alone = queued_and_alone(generator, "poss", {"num_draft_tokens": 4})
    assert served == alone


def test_sampled_poss_follows_the_target(generator):
    assert_sampling_law(generator, "poss", {"num_draft_tokens": 3})


def test_the_drafts_law_leaking_into_the_output_fails_the_same_test(generator):
    assert_sampling_law(generator, "poss", {"num_draft_tokens": 3}, exact=False)


@pytest.mark.parametrize("rule,exact", [(ChainRejection(), True), (LeakyRule(), False)])
def test_the_chain_rule_with_the_specialists_law_is_exact(tiny, rule, exact):
    folder, model, _, head = tiny
    gap = enumeration_gap(model, head, rule, chain=3)
    assert gap < 1e-9 if exact else gap > 1e-3


# ---- where it is served -------------------------------------------------------------------------------------------


def test_specialists_for_another_head_are_refused(tmp_path, tiny):
    folder, model, base, _ = tiny
    other = tmp_path / "target"
    save_tiny(other, 0, layers=2, hidden=32, wide=True)  # the same weights: the head and specialists serve it
    (other / "eagle").symlink_to(folder / "eagle")
    (other / "poss").symlink_to(folder / "poss")
    assert find_poss(str(other))[0] == other / "poss"
    assert servable(TextGenerator(str(other)), get_method("text", "poss"))
    # the EAGLE head retrained: specialists trained over the old one are not served with it
    (other / "eagle").unlink()
    fitted_head(model, other, seed=4, steps=2)
    with pytest.raises(ModelNotFound, match="train head --method poss"):
        TextGenerator(str(other)).generate("ab", method="poss", max_new_tokens=2)
    assert not servable(TextGenerator(str(other)), get_method("text", "poss"))
    # no EAGLE head at all: the error says what `poss` needs and both commands
    (other / "eagle").rename(other / "old-eagle")
    with pytest.raises(ModelNotFound, match="method 'poss' needs an EAGLE head.*--method eagle.*--method poss"):
        TextGenerator(str(other)).generate("ab", method="poss", max_new_tokens=2)


# ---- training -----------------------------------------------------------------------------------------------------


def test_two_training_steps_export_specialists_that_serve(tmp_path, tiny):
    from specgen.modalities.text.training.eagle import EagleConfig, train_eagle

    folder = tmp_path / "target"
    save_tiny(folder, 0, layers=2, hidden=32, wide=True)
    fitted_head(load_causal_lm(str(folder)), folder, steps=2)
    cfg = EagleConfig(run_dir=str(tmp_path / "run"), out=str(folder / "poss"), model=str(folder), method="poss",
                      specialists=3, windows=4, window_len=12, prompt_len=4, eval_windows=2, steps=2, batch_size=2,
                      warmup=1, eval_every=1, max_files=2, data_threads=1)
    summary = train_eagle(cfg, say=lambda text: None)
    assert summary["steps"] == 2 and "alpha_depth3" in summary["after"]
    assert summary["before"]["alpha"] == summary["after"]["alpha"]  # position 1 is the frozen EAGLE head's
    record = json.loads((folder / "poss" / "poss.json").read_text())
    assert record["command"].startswith("specgen train head --method poss") and record["specialists"] == 3
    assert "drafted position" in (folder / "poss" / "README.md").read_text()
    generator = TextGenerator(str(folder))
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=12)
    assert generator.generate(PROMPT, method="poss", max_new_tokens=12).tokens == plain.tokens
