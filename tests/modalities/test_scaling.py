"""Scylla's sweep (modalities/text/training/scaling.py): the law's fit, its judgement on held-out points, the cost
model's recommendation, and one resumable (N, D) training run."""

import json
import math

import numpy as np
import pytest
import torch

from specgen.modalities.text.models import ASSETS_CODE, build_model, load_tokenizer
from specgen.modalities.text.training.distill.agreement import HeldOut
from specgen.modalities.text.training.distill.windows import Windows
from specgen.modalities.text.training.scaling import (ScalingLaw, SweepConfig, draft_fields, fit_law, judge,
                                                      recommend, train_point)


def _points(a=0.1, b=0.03, c=0.04, noise=0.0, widths=(32, 64, 128)):
    rng = np.random.default_rng(0)
    out = []
    for w in widths:
        for d in (2e5, 4e5, 8e5):
            n = 1000.0 * w
            out.append({"width": w, "params": n, "tokens": d,
                        "alpha": a + b * math.log(n) + c * math.log(d) + noise * rng.standard_normal(),
                        "greedy_agreement": 0.0})
    return out


def test_the_fit_recovers_a_log_linear_law_and_judges_unseen_points():
    law = fit_law(_points())
    assert (law.intercept, law.per_log_params, law.per_log_tokens) == pytest.approx((0.1, 0.03, 0.04), abs=1e-9)
    assert law.r2 == pytest.approx(1.0) and max(map(abs, law.residuals)) < 1e-9
    unseen = _points(widths=(48,))
    assert judge(law, unseen)["max_abs_error"] < 1e-9
    # the judgement is not vacuous: points off the law are reported as far off as they are
    shifted = [{**p, "alpha": p["alpha"] + 0.07} for p in unseen]
    assert judge(law, shifted)["max_abs_error"] == pytest.approx(0.07)
    noisy = fit_law(_points(noise=0.02))
    assert 0.5 < noisy.r2 < 1.0
    with pytest.raises(ValueError):
        fit_law(_points()[:2])


def test_the_sweep_drafts_have_the_shipped_shape():
    tokenizer = load_tokenizer(ASSETS_CODE)
    shipped = json.loads((ASSETS_CODE / "draft" / "config.json").read_text())
    fields = draft_fields(128, 2)
    assert {k: shipped[k] for k in fields} == fields
    assert sum(p.numel() for p in build_model("draft", tokenizer, **fields).parameters()) == 950_912
    assert draft_fields(48, 2)["num_attention_heads"] == 1 and draft_fields(96, 2)["head_dim"] == 32


def test_recommendation_trades_acceptance_against_draft_cost():
    law = ScalingLaw("alpha", -0.2, 0.06, 0.0, 1.0)  # a wider draft accepts more
    params = {32: 150_000, 128: 950_000, 512: 9_000_000}
    verify = {n: 6.0 + 0.5 * (n - 1) for n in range(1, 10)}
    cheap = recommend(law, 1e6, {32: 0.8, 128: 0.9, 512: 1.0}, params, verify)
    assert cheap["width"] == 512  # drafts that cost the same: the one that accepts most
    dear = recommend(law, 1e6, {32: 0.8, 128: 1.0, 512: 12.0}, params, verify)
    assert dear["width"] == 128  # the widest now costs more than its acceptance returns
    assert dear["table"][512]["speedup"] < dear["table"][128]["speedup"]
    assert 1 <= dear["gamma"] <= 8


def test_a_sweep_point_trains_resumes_and_is_measured(tmp_path):
    tokenizer = load_tokenizer(ASSETS_CODE)
    rng = np.random.default_rng(0)
    train = rng.integers(3, 4096, size=20_000).astype(np.uint16)
    windows = Windows(rng.integers(3, 4096, size=(4, 12)), prompt_len=4)
    positions = int(windows.loss_mask.sum())
    target_logp = torch.log_softmax(torch.randn(positions, 4096), -1)
    heldout = HeldOut(windows, target_logp, 1.0, target_logp.argmax(-1))
    cfg = SweepConfig(tmp_path, batch_size=2, seq_len=16, warmup=1)
    data = {"tokenizer": tokenizer, "train": train}
    point = train_point(cfg, 32, 3, data, heldout)
    assert point["tokens"] == 3 * 2 * 16 and point["params"] == 157_856
    assert 0.0 < point["alpha"] < 1.0
    assert train_point(cfg, 32, 3, data, heldout) == point  # a finished point is read back, not retrained
    assert (tmp_path / "width-32-steps-3" / "checkpoint.pt").exists()
