"""Builds `auto` for any generator: its candidates are the modality's lossless methods in the registry (so a drafter
registered later joins), each built by the generator exactly as a request for that method would be, plus plain
decoding; the costs come from the calibration cache (`calibration.py`), measured on first use.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
import weakref
from typing import Sequence

import torch

from specgen.errors import InvalidRequest, SpecgenError
from specgen.modalities import calibration
from specgen.modalities.pipeline import make_drafter, servable
from specgen.samplers import loop
from specgen.samplers.acceptance import make_rule
from specgen.samplers.auto import AutoDrafter, AutoPolicy, AutoRule, Candidate, chain_lengths, nondecreasing
from specgen.samplers.processing import Processing
from specgen.samplers.registry import all_methods, get_method
from specgen.samplers.stats import SpecStats

# drafters that run no model and propose point masses: shadowed every step at no target cost
SHADOWED = ("ngram",)
# drafters that run no model and keep no state a switch would have to catch up (modalities/drafters/*.py)
MODEL_FREE = ("ngram", "stand", "rest", "dresd", "consensus")
# drafters that read the target's features of every committed token (the image EAGLE head): they cannot sit out a
# step, so auto does not offer them
EVERY_STEP = ("eagle-head",)
# drafters whose guesses come out of the target's own verification window (PPD's prompt tokens): they need every step
# scored by their window, which auto's candidates, sharing one plain target, do not give them
OWN_WINDOW = ("ppd",)
# `parallel` drafts in a process of its own while the target verifies: its step cost is an overlap that auto's
# cost model (draft then verify) does not describe, and a candidate that sits out steps wastes its speculation
OWN_PROCESS = ("parallel",)
# drafters whose proposals take prompt lookup's tokens where it finds a match: the lookup candidate they share it with
LOOKUP_PARTS = {"model-lookup": "ngram"}
# a method left out where the one that subsumes it is offered: draft-lookup is the draft model with free point-mass
# slots wherever prompt lookup finds a match, and ran at least as fast as `draft` in every category of both text
# pairs' benches (docs/auto.md); offering both, auto switched between the two near-equal predictions, each switch
# paying the other drafter's catch-up forward
SUBSUMED = {"draft": "draft-lookup"}
# left out of a one-path request: consensus drafts from the other paths of the request, and with none it is prompt
# lookup over the path's own text (its latest longest match, one chain verified as a tree); offered beside `ngram` on
# Gemma it never ran faster (benchmarks/auto), and auto spent steps flapping between the two near-equal predictions
ONE_PATH_SUBSUMED = {"consensus": "ngram"}
MAX_CHAIN = 16  # the longest chain draft auto tries
# a candidate measured slower than this share of the fastest in calibration is not offered: at 0.85, draft-lookup on
# Gemma 3 270M (0.83 of prompt lookup) came in at 0.86 once wide windows got cheaper, and auto ran it on 9 of 10 bench
# prompts where prompt lookup alone was 1.09x as fast
RACE_KEEP = 0.9
PRIOR_LENGTH = 8  # a chain's draft length in its calibration run where the method names none


def candidate_names(generator, knobs: dict) -> list[str]:
    """The methods auto may choose from: the `candidates` knob, else every lossless registered method of the
    modality with a drafter and a fixed length policy (those with their own stopping rule keep it to themselves)."""
    if knobs.get("candidates"):
        names = [n.strip() for n in knobs["candidates"].split(",") if n.strip()]
        for name in names:
            if get_method(generator.modality, name).drafter in OWN_WINDOW:  # unknown names are refused too
                raise InvalidRequest(f"auto cannot offer {name!r}: its drafts come out of its own verification "
                                     "window; request it as the method")
        return [n for n in names if n not in ("ar", "auto")]
    # a method that reads a datastore joins only when named: building one is minutes, not part of a request; one
    # that needs a trained head or adapter joins where the target has one
    names = [s.name for s in all_methods() if s.modality == generator.modality and s.lossless
             and s.drafter not in (None, "auto", *EVERY_STEP, *OWN_PROCESS, *OWN_WINDOW) and s.policy == "fixed"
             and not any(k.name == "datastore" for k in s.knobs) and servable(generator, s)]
    return [n for n in names if SUBSUMED.get(n) not in names]


def _lengths(generator, spec, knobs: dict, default: int) -> tuple[int, ...]:
    if spec.rule == "tree" or not hasattr(generator, "auto_lengths"):
        fixed = spec.rule == "tree" or (spec.drafter or "").startswith(("jacobi-", "eagle", "poss", "mtp", "falcon"))
        return (default,) if fixed else chain_lengths(default, MAX_CHAIN)
    return generator.auto_lengths(spec, knobs, default)


def _factory(generator, spec, knobs: dict, request_processing: Processing, engine):
    """A function building a fresh Candidate for `spec` under the request's processing (or another one); its `plan`
    is the candidate's description without a drafter, so calibration and the race can pass over candidates that
    are never built (building the Gemma draft's runner alone took 16 ms)."""
    policy = generator.policy(spec, knobs)
    default = max(int(policy.next_length()), 1)  # the method's own draft length
    plan = Candidate(spec.name, None, None, _lengths(generator, spec, knobs, default),
                     nodes=_tree_nodes(spec, knobs) if spec.rule == "tree" else None,
                     shadow=spec.drafter in SHADOWED, stateful=(spec.drafter or "").startswith("jacobi-"),
                     model_free=spec.drafter in MODEL_FREE, lookup_part=LOOKUP_PARTS.get(spec.drafter),
                     default_length=default)

    def build(processing: Processing = request_processing) -> Candidate:
        drafter = make_drafter(generator, spec, knobs, processing, policy, engine)
        rule = make_rule(spec.rule, processing, **generator.rule_options(spec, knobs, drafter))
        return dataclasses.replace(plan, drafter=drafter, rule=rule)
    build.plan = plan
    return build


def _tree_nodes(spec, knobs: dict) -> int:
    if "tree_budget" in knobs:
        return int(knobs["tree_budget"])
    if "shape" in knobs:
        from specgen.samplers import trees

        return len(trees.named_shape(knobs["shape"])) - 1
    return 16


# generator -> {the request's `candidates` knob: [(method spec, its default knobs)]}: which methods the generator can
# serve and their knobs depend on its model files only, and working them out (a dozen registry entries, each one's
# servability and defaults, file paths resolved) was a millisecond of every code-pair request
_SPECS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def candidate_specs(generator, knobs: dict) -> list:
    """(spec, default knobs) of each method `candidate_names` offers that the generator can resolve, once per
    generator and `candidates` knob."""
    cached = _SPECS.setdefault(generator, {})
    key = (knobs.get("candidates"), tuple(map(str, calibration_paths(generator))))
    if key not in cached:
        specs = []
        for name in candidate_names(generator, knobs):
            cand_spec = get_method(generator.modality, name)
            try:
                specs.append((cand_spec, generator.resolve_knobs(cand_spec, {})))
            except SpecgenError:
                continue
        cached[key] = specs
    return [(spec, dict(knobs)) for spec, knobs in cached[key]]


def build_auto_pipeline(generator, spec, prompts: Sequence[torch.Tensor], *, max_new_tokens: int | None,
                        sampling: dict, params: dict, stats: SpecStats | None = None, quiet: bool = False,
                        paths: int | None = None):
    from specgen.modalities.pipeline import Pipeline

    knobs = generator.resolve_knobs(spec, params)
    processing = generator.processing(**sampling)
    max_new_tokens = generator.length_cap(prompts, max_new_tokens)
    stats = stats if stats is not None else SpecStats()
    specs = candidate_specs(generator, knobs)
    capacity = None
    for cand_spec, cand_knobs in specs:
        need = generator.capacity(cand_spec, cand_knobs, prompts, max_new_tokens)
        capacity = need if capacity is None or (need is not None and need > capacity) else capacity
    engine = generator.engine(capacity)
    target = generator.serving_target(engine, processing)
    factories = {cand_spec.name: _factory(generator, cand_spec, cand_knobs, processing, engine)
                 for cand_spec, cand_knobs in specs}
    key = calibration.machine_key(generator.modality, calibration_paths(generator))
    record = usable_record(key)  # read once: the model files' hash and the cache file
    built = {}
    for name in factories:  # not calibrated yet: built now, so one this model cannot serve is left out before
        if not record or name not in record["draft_s"]:
            built[name] = _built(factories[name])
    plans = [f.plan for name, f in factories.items() if built.get(name, True) is not None]
    rows = len(prompts) if paths is None else paths  # the batch's rows at the start
    costs, priors = calibrated(generator, target, processing, prompts[0], factories, plans, key, record, quiet=quiet,
                               rows=rows)
    offered = plans
    if not knobs.get("candidates"):  # named candidates are offered as named
        offered = raced(plans, priors)
        if (len(prompts) if paths is None else paths) == 1:  # calibrated all the same, for requests of several
            names = {p.name for p in offered}
            offered = [p for p in offered if ONE_PATH_SUBSUMED.get(p.name) not in names]
    candidates = [c for c in (built.get(p.name) or _built(factories[p.name]) for p in offered) if c is not None]
    for candidate in candidates:
        prior = priors.get(candidate.name)
        if prior:
            candidate.prior_alpha, candidate.prior_hit = prior["alpha"], prior["hit"]
            candidate.prior_alpha_at = tuple(prior["alpha_at"]) if prior.get("alpha_at") else None
            candidate.prior_tau = prior["tau"]
            candidate.prior_curve = tuple(prior["curve"]) if prior.get("curve") else None
    drafter = AutoDrafter(candidates, costs, margin=knobs["margin"], clock=time.perf_counter)
    drafter.prime(prompts, rows)
    policy = AutoPolicy(drafter)
    rule = AutoRule(drafter, make_rule("chain", processing))
    stats.reports.append(drafter.run_summary)
    return Pipeline(spec, knobs, processing, policy, drafter, rule, target, max_new_tokens,
                    tuple(generator.stop_tokens), stats)


def _built(factory) -> Candidate | None:
    try:
        return factory()
    except (SpecgenError, ImportError) as exc:  # e.g. a tree drafter over a reduced draft vocabulary
        logging.getLogger("specgen").debug("auto: %s is not a candidate here: %s", factory.plan.name, exc)
        return None


def raced(candidates: list[Candidate], priors: dict) -> list[Candidate]:
    """The candidates whose calibration runs came within RACE_KEEP of the fastest one's measured speedup over plain
    decoding on at least one calibration prompt (and every shadowed one: watching it costs no target forward). The
    cost model ranks candidates from acceptance and step costs measured apart, and where two families sat close (the
    EAGLE head and draft-lookup on the code pair, predicted 1.98x and 1.97x) it ranked them by noise while one ran a
    quarter faster (1.8x against 2.3x over the same prompts); offered every method, auto spent a request's first
    steps on such a loser and paid a catch-up forward at each switch. Judged per prompt, not pooled: the prompts
    differ in kind (code, an answer repeating a passage), and a method that wins on one kind is worth offering (on
    a CPU without AVX-512 the code pair's draft-lookup came in pooled at 0.90 of prompt lookup, carried by the
    repeated passage, and auto, left with prompt lookup alone, ran at 0.8x draft-lookup on the bench prompts). A
    candidate without a measured speedup stays."""
    measured = {c.name: _race_speedups(priors.get(c.name, {})) for c in candidates}
    prompts = {len(s) for s in measured.values() if s}
    if not prompts:
        return candidates
    if len(prompts) > 1:  # runs over different prompt sets do not compare prompt by prompt: pooled
        measured = {name: s and [priors[name]["speedup"]] for name, s in measured.items()}
        prompts = {1}
    best = [max(s[i] for s in measured.values() if s) for i in range(prompts.pop())]
    return [c for c in candidates if c.shadow or not measured[c.name]
            or any(s >= RACE_KEEP * b for s, b in zip(measured[c.name], best))]


def _race_speedups(prior: dict) -> list[float] | None:
    """A candidate's measured speedups in calibration, one per prompt (a record without them: its pooled one)."""
    if prior.get("speedups"):
        return list(prior["speedups"])
    return [prior["speedup"]] if prior.get("speedup") else None


def calibration_paths(generator) -> list:
    return [getattr(generator, name, None) for name in ("model_path", "draft_path", "head_path")]


def usable_record(key: dict) -> dict | None:
    """The cached calibration, unless it was measured while other work shared the CPU and the machine is quiet
    now: then it is measured again (its costs were the load's, not this machine's)."""
    record = calibration.load(key)
    if record and record.get("busy") and not calibration.machine_busy():
        return None
    return record


def calibrated(generator, target, processing: Processing, prompt: torch.Tensor, factories: dict, candidates,
               key: dict, record: dict | None, quiet: bool = False, rows: int = 1):
    """(Costs, priors by candidate) from the cached `record` (`usable_record(key)`), measuring what it lacks: for a
    batch of `rows` rows also the windows as wide as the batch's steps (`batch_windows`)."""
    # Jacobi windows alone (image and video models) need plain decoding's step and their own widths: the chain
    # lengths' windows between were half of a clip model's calibration (30 of 58 s), at 1,000-token contexts
    stateful = all(candidate.stateful for candidate in candidates)
    windows = {1} if stateful else set(calibration.WINDOWS)
    for candidate in candidates:
        windows.add(candidate.nodes + 1 if candidate.is_tree else max(candidate.lengths) + 1)
    windows |= calibration.batch_windows(rows, max(windows))
    missing = [n for n in windows if not record or str(n) not in record["verify_s"]]
    missing_candidates = [c.name for c in candidates if not record or c.name not in record["draft_s"]]
    if missing or missing_candidates:
        # the model's own example prompt where it has one, so the priors do not depend on the first request's;
        # acceptance measured under the modality's default sampling (greedy text, sampled images and speech)
        if hasattr(generator, "example_prompt") and hasattr(generator, "encode"):
            prompt = generator.encode(generator.example_prompt)
        prompt = torch.as_tensor(prompt, dtype=torch.long).flatten()
        prior_prompts = [prompt]
        if hasattr(generator, "calibration_prompts"):
            prior_prompts = [ids for ids in map(generator.encode, generator.calibration_prompts())
                             if _fits(generator, ids)] or prior_prompts
        default = generator.processing()
        window_target, window_prompt = _window_context(generator, target, processing, prompt)
        record = calibration.calibrate(key, window_target, window_prompt, sorted(windows),
                                       {name: factories[name] for name in missing_candidates},
                                       lambda build: _prior_run(target, build, default, prior_prompts, generator),
                                       record, quiet=quiet, processing=default)
        calibration.save(record)
    return calibration.costs_of(record), record["prior"]


def _fits(generator, prompt: torch.Tensor) -> bool:
    """Whether a calibration run (and its widest window) fits the model's context after `prompt`."""
    try:
        generator.length_cap([prompt], calibration.PRIOR_TOKENS + MAX_CHAIN + 1)
    except SpecgenError:
        return False
    return True


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


def _prior_run(target, build, processing: Processing, prompts: Sequence[torch.Tensor], generator) -> dict:
    """A fresh candidate (`build()`) over a short run from each of `prompts`, drafting the method's own length:
    its acceptance (alpha, by position, hit rate, tau), what its steps cost there (verification seconds and steps
    by window; the length asked for and drafting seconds of each step after a run's first, which holds the
    drafter's prompt prefill), and its tokens per second past the first token."""
    from specgen.samplers.length_policies import FixedLength

    stats, later, run_s, run_tokens, by_prompt, curves = SpecStats(), [], 0.0, 0, [], []
    for prompt in prompts:
        candidate = build()
        tokens = calibration.STATEFUL_PRIOR_TOKENS if candidate.stateful else calibration.PRIOR_TOKENS
        tokens = min(tokens, generator.length_cap([prompt], None) if candidate.stateful else tokens)
        length = max(candidate.lengths) if candidate.by_tau else candidate.default_length or PRIOR_LENGTH

        def run(candidate, tokens, stats):
            started = time.perf_counter()
            result = loop.generate(target, candidate.drafter, candidate.rule, [prompt], processing=processing,
                                   stats=stats, max_new_tokens=tokens, policy=FixedLength(length),
                                   stop_tokens=tuple(generator.stop_tokens))
            return result, time.perf_counter() - started
        # the run's seconds past its first token: the prefill timed by a one-token run of a fresh candidate
        _, prefill_s = run(build(), 1, SpecStats())
        result, seconds = run(candidate, tokens, stats)
        later += [e for e in result.events if e.step > 0]
        if candidate.stateful:
            curves.append(list(itertools.accumulate(len(e.tokens) for e in result.events if e.row == 0)))
        generated, past_first_s = max(sum(len(e.tokens) for e in result.events) - 1, 0), max(seconds - prefill_s, 1e-9)
        run_s += past_first_s
        run_tokens += generated
        by_prompt.append(generated / past_first_s)
    tested = stats.accepted + stats.rejections
    total = sum(stats.draft_lengths.values())
    alpha = stats.accepted / tested if tested else 0.0
    # per position, each shrunk towards the pooled alpha by 4 pseudo-tests (the deep positions see few tests), then
    # fitted non-decreasing: given the earlier tokens matched, a later one matches at least as often (so measured on
    # every drafter here; a dip at one position is the noise of a few tests)
    alpha_at = [(a + 4 * alpha) / (t + 4) for t, a in zip(stats.tested_at, stats.accepted_at)]
    alpha_at = nondecreasing(alpha_at, [t + 4 for t in stats.tested_at])
    return {"alpha": alpha, "alpha_at": alpha_at,
            "hit": 1.0 - stats.draft_lengths.get(0, 0) / total if total else 1.0,
            "tau": stats.committed / stats.row_steps if stats.row_steps else 1.0,
            "verify_by_window": {n: tuple(v) for n, v in stats.verify_by_window.items()},
            "lengths": [length] * len(later), "draft_s": [e.draft_s for e in later],
            "tokens_per_s": run_tokens / run_s if run_s else None, "tokens_per_s_by_prompt": by_prompt,
            "curve": mean_curve(curves) if curves else None}


def mean_curve(curves: list[list[int]]) -> list[float]:
    """Tokens committed after each step, averaged over runs (a run that has ended counts its total)."""
    steps = max(map(len, curves))
    return [round(sum(c[min(k, len(c) - 1)] for c in curves) / len(curves), 2) for k in range(steps)]
