"""`specgen selfcheck`: the exact core checked on this machine in a few seconds, on table-based toy models.

Each check returns numbers, not just a verdict: exact-enumeration distances (must be ~1e-15), a chi-square
p-value of the full loop against the exact target distribution, greedy token equality, a negative control
that must be detected, and the run statistics of one speculative run (tau, alpha-hat, predicted speedups).
"""

from __future__ import annotations

import time

import torch

from specgen.samplers.acceptance import ChainRejection, GreedyMatch, TreeRejection
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.loop import generate
from specgen.samplers.oracle import (chain_proposals, exact_output, jacobi_output, max_abs_diff, target_joint,
                                     tree_proposals)
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.toy import GuidedTableLM, TableDrafter, TableLM, TableTarget

EXACT_TOLERANCE = 1e-9
P_VALUE_FLOOR = 1e-4


def run_selfcheck(seed: int = 0) -> dict:
    target = TableLM(4, order=2, seed=1000 + seed)
    draft = target.mixed_with(TableLM(4, order=2, seed=2000 + seed), 0.5)
    plain, greedy = Processing(), Processing(temperature=0)
    draft_law = lambda context: plain(draft.logits(context))
    prompt, horizon = (1, 2), 3
    reference = target_joint(target, plain, prompt, horizon)

    def exact(name, rule, proposals, processing=plain, expected=reference, length=horizon):
        started = time.perf_counter()
        distance = max_abs_diff(exact_output(target, processing, rule, proposals, prompt, length), expected)
        return {"name": name, "ok": distance < EXACT_TOLERANCE, "max_abs_diff": distance,
                "seconds": time.perf_counter() - started}

    checks = [
        exact("exact: chain rejection sampling", ChainRejection(), lambda p: chain_proposals(draft_law, p, 2)),
        exact("exact: point-mass drafts", ChainRejection(), lambda p: chain_proposals(draft_law, p, 2, point_mass=True)),
        exact("exact: greedy match", GreedyMatch(), lambda p: chain_proposals(draft_law, p, 2), greedy,
              target_joint(target, greedy, prompt, horizon)),
        exact("exact: tree, without replacement", TreeRejection("without_replacement"),
              lambda p: tree_proposals(draft_law, p, (2, 1), "without_replacement"),
              expected=target_joint(target, plain, prompt, 2), length=2),  # trees multiply the enumeration
    ]
    guided = GuidedTableLM(TableLM(3, order=2, seed=3000 + seed, scale=0.5), prompt, (0, 0), 3.0)
    top2 = Processing(top_k=2)
    # the Gumbel coupling's shared noise is enumerated exactly over two tokens (samplers.oracle.jacobi_output)
    binary = GuidedTableLM(TableLM(2, order=2, seed=3000 + seed, scale=0.5), (1, 0), (0, 0), 3.0)
    for coupling, label, lm, processing, context in (
            ("independent", "SJD, guidance + top-k", guided, top2, prompt),
            ("maximal", "MC-SJD, guidance + top-k", guided, top2, prompt),
            ("gumbel", "Gumbel-SJD, guidance, 2 tokens", binary, Processing(0.8), (1, 0))):
        started = time.perf_counter()
        out = jacobi_output(lm, processing, context, 4, window=3, coupling=coupling)
        distance = max_abs_diff(out, target_joint(lm, processing, context, 4))
        checks.append({"name": f"exact: Jacobi {label}", "ok": distance < EXACT_TOLERANCE,
                       "max_abs_diff": distance, "seconds": time.perf_counter() - started})
    stale = exact("control: stale draft law is detected", ChainRejection(),
                  lambda p: chain_proposals(draft_law, p, 2, reported_law=lambda c: draft_law(c[:-1])))
    stale["ok"] = stale["max_abs_diff"] > 1e-3  # the control passes when the oracle catches the bias
    checks.append(stale)

    samples = 4000
    prompts = [torch.tensor(prompt)] * samples
    run = generate(TableTarget(target), TableDrafter(draft, plain), ChainRejection(), prompts, processing=plain,
                   max_new_tokens=horizon, policy=FixedLength(3), seed=seed, method="draft")
    fit = goodness_of_fit([tuple(t) for t in run.tokens], reference)
    checks.append({"name": "sampling: chi-square vs exact target", "ok": fit.p_value > P_VALUE_FLOOR,
                   "p_value": fit.p_value, "tv": fit.tv, "samples": samples})

    batch = [torch.tensor(p) for p in ([1, 2], [3], [0, 1, 2, 3, 0])]  # ragged prompts
    plain_greedy = generate(TableTarget(target), None, GreedyMatch(), batch, processing=greedy, max_new_tokens=32)
    spec_greedy = generate(TableTarget(target), TableDrafter(draft, plain), GreedyMatch(), batch, processing=greedy,
                           max_new_tokens=32, policy=FixedLength(4), method="draft")
    checks.append({"name": "greedy: speculative == plain, token for token",
                   "ok": spec_greedy.tokens == plain_greedy.tokens, "tau": spec_greedy.stats["tau"],
                   "steps": spec_greedy.stats["steps"], "plain_steps": plain_greedy.stats["steps"]})
    stats = run.stats
    return {"ok": all(c["ok"] for c in checks), "checks": checks,
            "stats": {k: stats[k] for k in ("tau", "acceptance_rate", "alpha_hat", "per_position_acceptance",
                                            "predicted_speedup_ideal", "steps", "committed")}}
