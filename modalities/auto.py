"""Builds `auto` for any generator: its candidates are the modality's lossless methods in the registry (so a drafter
registered later joins), each built by the generator exactly as a request for that method would be, plus plain
decoding; the costs come from the calibration cache (`calibration.py`), measured on first use.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from specgen.errors import SpecgenError
from specgen.modalities import calibration
from specgen.modalities.pipeline import make_drafter, servable
from specgen.samplers import loop
from specgen.samplers.acceptance import make_rule
from specgen.samplers.auto import AutoDrafter, AutoPolicy, AutoRule, Candidate, chain_lengths
from specgen.samplers.processing import Processing
from specgen.samplers.registry import all_methods, get_method
from specgen.samplers.stats import SpecStats

# drafters that run no model and propose point masses: shadowed every step at no target cost
SHADOWED = ("ngram",)
# drafters that read the target's features of every committed token (the image EAGLE head): they cannot sit out a
# step, so auto does not offer them
EVERY_STEP = ("eagle-head",)
# `parallel` drafts in a process of its own while the target verifies: its step cost is an overlap that auto's
# cost model (draft then verify) does not describe, and a candidate that sits out steps wastes its speculation
OWN_PROCESS = ("parallel",)
MAX_CHAIN = 16  # the longest chain draft auto tries


def candidate_names(generator, knobs: dict) -> list[str]:
    """The methods auto may choose from: the `candidates` knob, else every lossless registered method of the
    modality with a drafter and a fixed length policy (those with their own stopping rule keep it to themselves)."""
    if knobs.get("candidates"):
        names = [n.strip() for n in knobs["candidates"].split(",") if n.strip()]
        for name in names:
            get_method(generator.modality, name)  # unknown names are refused
        return [n for n in names if n not in ("ar", "auto")]
    # a method that reads a datastore joins only when named: building one is minutes, not part of a request; one
    # that needs a trained head or adapter joins where the target has one
    return [s.name for s in all_methods() if s.modality == generator.modality and s.lossless
            and s.drafter not in (None, "auto", *EVERY_STEP, *OWN_PROCESS) and s.policy == "fixed"
            and not any(k.name == "datastore" for k in s.knobs) and servable(generator, s)]


def _lengths(generator, spec, knobs: dict, policy) -> tuple[int, ...]:
    default = max(int(policy.next_length()), 1)
    if spec.rule == "tree" or not hasattr(generator, "auto_lengths"):
        fixed = spec.rule == "tree" or (spec.drafter or "").startswith(("jacobi-", "eagle", "poss"))
        return (default,) if fixed else chain_lengths(default, MAX_CHAIN)
    return generator.auto_lengths(spec, knobs, default)


def _factory(generator, spec, knobs: dict, request_processing: Processing, engine):
    """A function building a fresh Candidate for `spec` under the request's processing (or another one)."""
    policy = generator.policy(spec, knobs)
    lengths = _lengths(generator, spec, knobs, policy)

    def build(processing: Processing = request_processing) -> Candidate:
        drafter = make_drafter(generator, spec, knobs, processing, policy, engine)
        rule = make_rule(spec.rule, processing, **generator.rule_options(spec, knobs, drafter))
        nodes = None
        if spec.rule == "tree":
            nodes = _tree_nodes(spec, knobs)
        return Candidate(spec.name, drafter, rule, lengths, nodes=nodes, shadow=spec.drafter in SHADOWED,
                         stateful=(spec.drafter or "").startswith("jacobi-"))
    return build


def _tree_nodes(spec, knobs: dict) -> int:
    if "tree_budget" in knobs:
        return int(knobs["tree_budget"])
    if "shape" in knobs:
        from specgen.samplers import trees

        return len(trees.named_shape(knobs["shape"])) - 1
    return 16


def build_auto_pipeline(generator, spec, prompts: Sequence[torch.Tensor], *, max_new_tokens: int | None,
                        sampling: dict, params: dict, stats: SpecStats | None = None, quiet: bool = False):
    from specgen.modalities.pipeline import Pipeline

    knobs = generator.resolve_knobs(spec, params)
    processing = generator.processing(**sampling)
    max_new_tokens = generator.length_cap(prompts, max_new_tokens)
    stats = stats if stats is not None else SpecStats()
    specs = []
    for name in candidate_names(generator, knobs):
        cand_spec = get_method(generator.modality, name)
        try:
            specs.append((cand_spec, generator.resolve_knobs(cand_spec, {})))
        except SpecgenError:
            continue
    capacity = None
    for cand_spec, cand_knobs in specs:
        need = generator.capacity(cand_spec, cand_knobs, prompts, max_new_tokens)
        capacity = need if capacity is None or (need is not None and need > capacity) else capacity
    engine = generator.engine(capacity)
    target = generator.serving_target(engine, processing)
    factories, candidates = {}, []
    for cand_spec, cand_knobs in specs:
        factory = _factory(generator, cand_spec, cand_knobs, processing, engine)
        try:
            candidate = factory()
        except (SpecgenError, ImportError) as exc:  # e.g. a tree drafter over a reduced draft vocabulary
            logging.getLogger("specgen").debug("auto: %s is not a candidate here: %s", cand_spec.name, exc)
            continue
        factories[cand_spec.name] = factory
        candidates.append(candidate)
    costs, priors = calibrated(generator, target, processing, prompts[0], factories, candidates, quiet=quiet)
    for candidate in candidates:
        prior = priors.get(candidate.name)
        if prior:
            candidate.prior_alpha, candidate.prior_hit = prior["alpha"], prior["hit"]
            candidate.prior_tau = prior["tau"]
    drafter = AutoDrafter(candidates, costs, margin=knobs.get("margin", 0.1))
    drafter.prime(prompts)
    policy = AutoPolicy(drafter)
    rule = AutoRule(drafter, make_rule("chain", processing))
    stats.reports.append(drafter.run_summary)
    return Pipeline(spec, knobs, processing, policy, drafter, rule, target, max_new_tokens,
                    tuple(generator.stop_tokens), stats)


def calibration_paths(generator) -> list:
    return [getattr(generator, name, None) for name in ("model_path", "draft_path", "head_path")]


def calibrated(generator, target, processing: Processing, prompt: torch.Tensor, factories: dict, candidates,
               quiet: bool = False):
    """(Costs, priors by candidate) from the cache, measuring what it lacks."""
    key = calibration.machine_key(generator.modality, calibration_paths(generator))
    record = calibration.load(key)
    windows = set(calibration.WINDOWS)
    for candidate in candidates:
        windows.add(candidate.nodes + 1 if candidate.is_tree else max(candidate.lengths) + 1)
    missing = [n for n in windows if not record or str(n) not in record["verify_s"]]
    missing_candidates = [c.name for c in candidates if not record or c.name not in record["draft_s"]]
    if missing or missing_candidates:
        # the model's own example prompt where it has one, so the priors do not depend on the first request's;
        # acceptance measured under the modality's default sampling (greedy text, sampled images and speech)
        if hasattr(generator, "example_prompt") and hasattr(generator, "encode"):
            prompt = generator.encode(generator.example_prompt)
        prompt = torch.as_tensor(prompt, dtype=torch.long).flatten()
        default = generator.processing()
        window_target, window_prompt = _window_context(generator, target, processing, prompt)
        record = calibration.calibrate(key, window_target, window_prompt, sorted(windows),
                                       {name: factories[name] for name in missing_candidates},
                                       lambda c: _prior_run(target, c, default, prompt, generator),
                                       record, quiet=quiet, processing=default)
        calibration.save(record)
    return calibration.costs_of(record), record["prior"]


def _window_context(generator, target, processing: Processing, prompt: torch.Tensor):
    """(target, context) to time windows at: the prompt, or for an image or clip model the prompt and half a
    request's codes, the mean context a step sees (a clip's 2,000-token contexts make attention a large part of a
    step, so a short context overstates what a wide window costs relative to one token)."""
    vocab = getattr(generator, "vocab", None)
    if getattr(vocab, "image_tokens", None) is None:
        return target, prompt
    context = torch.cat([prompt, torch.arange(vocab.image_tokens // 2) % vocab.num_codes])
    engine = generator.engine(len(context) + 160)
    if processing.guidance_scale is None:
        return engine, context
    from specgen.samplers.guided import GuidedTarget

    uncond = vocab.uncond_ids()
    return GuidedTarget(engine, lambda row: torch.cat([uncond, torch.as_tensor(row)[len(uncond):]])), context


def _prior_run(target, candidate: Candidate, processing: Processing, prompt: torch.Tensor, generator):
    """(alpha, hit rate, tau) of `candidate` over a short run from `prompt` (a chain drafts at most 4 tokens)."""
    from specgen.samplers.length_policies import FixedLength

    stats = SpecStats()
    tokens = calibration.STATEFUL_PRIOR_TOKENS if candidate.stateful else calibration.PRIOR_TOKENS
    tokens = min(tokens, generator.length_cap([prompt], None) if candidate.stateful else tokens)
    loop.generate(target, candidate.drafter, candidate.rule, [prompt], processing=processing, stats=stats,
                  max_new_tokens=tokens, policy=FixedLength(max(candidate.lengths) if candidate.by_tau else min(max(candidate.lengths), 4)),
                  stop_tokens=tuple(generator.stop_tokens))
    tested = stats.accepted + stats.rejections
    alpha = stats.accepted / tested if tested else 0.0
    total = sum(stats.draft_lengths.values())
    hit = 1.0 - stats.draft_lengths.get(0, 0) / total if total else 1.0
    return alpha, hit, stats.committed / stats.row_steps if stats.row_steps else 1.0
