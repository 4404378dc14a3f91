"""One generation pipeline for every modality: a request's method → its registry spec → knobs → `Processing` →
length policy → drafter → acceptance rule → target, then the loop (`samplers/loop.py`).

A modality's generator (`TextGenerator`, `ImageGenerator`, `SpeechGenerator`, `JanusImageGenerator`) subclasses
`Generator` and fills in only what differs: its processing, its drafters, its target engine and the options its
rules take. `build_pipeline` is the one place where the pieces are put together, in this order, for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch

from specgen.errors import InvalidRequest, SpecgenError
from specgen.samplers import loop
from specgen.samplers.acceptance import make_rule
from specgen.samplers.length_policies import make_policy
from specgen.samplers.processing import Processing
from specgen.samplers.registry import MethodSpec, default_method, get_method
from specgen.samplers.stats import SpecStats
from specgen.samplers.types import StepEvent


@dataclass
class Pipeline:
    """Everything one request decodes with, built by `build_pipeline`."""

    spec: MethodSpec
    knobs: dict
    processing: Processing
    policy: object  # a LengthPolicy
    drafter: object | None  # a Drafter; None for plain decoding
    rule: object  # an AcceptanceRule
    target: object  # a TargetModel
    max_new_tokens: int
    stop_tokens: tuple[int, ...] = ()
    stats: SpecStats = field(default_factory=SpecStats)

    @property
    def method(self) -> str:
        return self.spec.name

    def run(self, prompts: Sequence[torch.Tensor], *, seed: int = 0,
            queue: Iterable[tuple[int, torch.Tensor]] | None = None) -> Iterator[StepEvent]:
        """The loop's events, one per committed step and row (see `speculative_generate`)."""
        return loop.speculative_generate(self.target, self.drafter, self.rule, prompts, processing=self.processing,
                                         max_new_tokens=self.max_new_tokens, policy=self.policy, seed=seed,
                                         stop_tokens=self.stop_tokens, stats=self.stats, queue=queue)

    def generate(self, prompts: Sequence[torch.Tensor], *, seed: int = 0,
                 ar_step_s: float | Callable[[], float] | None = None) -> loop.GenerationResult:
        """Run to the end and collect (the loop's collector); the summary includes what the drafter and rule
        measured on the way (their `run_summary`)."""
        return loop.generate(self.target, self.drafter, self.rule, prompts, method=self.method,
                             lossless=self.spec.lossless, stats=self.stats, ar_step_s=ar_step_s,
                             processing=self.processing, max_new_tokens=self.max_new_tokens, policy=self.policy,
                             seed=seed, stop_tokens=self.stop_tokens)


class Generator:
    """What a modality fills in for `build_pipeline`. Defaults suit a chain drafter with a length schedule."""

    modality: str  # the registry's method table
    stop_tokens: tuple[int, ...] = ()

    @property
    def default_method(self) -> str:
        return default_method(self.modality)

    def knob_defaults(self, spec: MethodSpec) -> dict:
        """Knob values this model prefers over the registry's defaults (only knobs the method has)."""
        return {}

    def resolve_knobs(self, spec: MethodSpec, params: dict) -> dict:
        known = {knob.name for knob in spec.knobs}
        preferred = {name: value for name, value in self.knob_defaults(spec).items() if name in known}
        return spec.resolve_knobs({**preferred, **params})

    def check_request(self, method: str | None, num_samples: int, params: dict) -> None:
        """What a request is refused for before any work (a prompt encoded, a draft head or token groups loaded):
        its method, the method's knobs and the sample count."""
        self.resolve_knobs(get_method(self.modality, method or self.default_method), params)
        check_num_samples(num_samples)

    def processing(self, **sampling) -> Processing:
        return Processing(**sampling)

    def length_cap(self, prompts: Sequence[torch.Tensor], max_new_tokens: int | None) -> int:
        """The request's max_new_tokens, checked against the model's context (a modality may fix or derive it)."""
        if max_new_tokens is None or max_new_tokens < 1:
            raise InvalidRequest(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        return max_new_tokens

    def policy(self, spec: MethodSpec, knobs: dict):
        if spec.policy == "svip":
            from specgen.samplers.length_policies import SvipLength

            return SvipLength(knobs["num_draft_tokens"], threshold=knobs["entropy_threshold"])
        if spec.policy == "kangaroo":  # the self-draft's confidence stop (modalities/drafters/kangaroo.py, DEL)
            from specgen.samplers.length_policies import ConfidenceLength

            return ConfidenceLength(knobs["num_draft_tokens"], threshold=knobs["confidence"])
        return make_policy(knobs.get("length_schedule", "fixed"), knobs.get("num_draft_tokens", 0))

    def capacity(self, spec: MethodSpec, knobs: dict, prompts: Sequence[torch.Tensor], max_new_tokens: int) -> int | None:
        """Cache slots the target needs (None: the engine's own default)."""
        return None

    def engine(self, capacity: int | None):
        """The target model as the loop scores it (before any guidance row is added)."""
        raise NotImplementedError

    def drafter(self, spec: MethodSpec, knobs: dict, processing: Processing, policy, engine):
        """The drafter of `spec.drafter` (None for plain decoding); `engine` is the target's, for drafters that
        read its features."""
        if spec.drafter is not None:
            raise InvalidRequest(f"unknown drafter {spec.drafter!r}")
        return None

    def rule_options(self, spec: MethodSpec, knobs: dict, drafter) -> dict:
        """What `make_rule` needs beyond the key: how the drafter drew siblings, a relaxed rule's tables."""
        siblings = getattr(drafter, "siblings", None)
        return {} if siblings is None else {"siblings": siblings}

    def serving_target(self, engine, processing: Processing):
        """The target the loop calls: the engine, or it wrapped (e.g. with a guidance row)."""
        return engine

    def pipeline(self, method: str | None, prompts: Sequence[torch.Tensor], *, max_new_tokens: int | None = None,
                 sampling: dict | None = None, params: dict | None = None,
                 stats: SpecStats | None = None, paths: int | None = None) -> Pipeline:
        """`paths`: how many rows the pipeline will decode together (default: one per prompt), which decides
        whether drafting across paths is worth offering to `auto`."""
        return build_pipeline(self, method, prompts, max_new_tokens=max_new_tokens, sampling=sampling or {},
                              params=params or {}, stats=stats, paths=paths)


def build_pipeline(generator: Generator, method: str | None, prompts: Sequence[torch.Tensor], *,
                   max_new_tokens: int | None, sampling: dict, params: dict,
                   stats: SpecStats | None = None, paths: int | None = None) -> Pipeline:
    """spec → knobs → processing → length cap → policy → target engine → drafter → rule → served target."""
    spec = get_method(generator.modality, method or generator.default_method)
    if spec.drafter == "auto":  # candidates built by this generator, each as its own method's request would be
        from specgen.modalities.auto import build_auto_pipeline

        return build_auto_pipeline(generator, spec, prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                                   params=params, stats=stats, paths=paths)
    knobs = generator.resolve_knobs(spec, params)
    processing = generator.processing(**sampling)
    max_new_tokens = generator.length_cap(prompts, max_new_tokens)
    stats = stats if stats is not None else SpecStats()
    policy = generator.policy(spec, knobs)
    if hasattr(policy, "attach"):  # the cost model reads this run's measurements
        policy.attach(stats)
    engine = generator.engine(generator.capacity(spec, knobs, prompts, max_new_tokens))
    if spec.target == "early-exit":  # the target decodes each token to the depth its controllers choose
        from specgen.modalities.text.early_exit import build_target

        engine = build_target(generator, knobs, engine)
        stats.reports.append(engine.run_summary)
    drafter = make_drafter(generator, spec, knobs, processing, policy, engine)
    if hasattr(drafter, "verifying_target"):  # verification that serves the drafter too (Kangaroo, PPD)
        verifying = drafter.verifying_target(engine)
        if verifying is not engine:
            engine = verifying
            stats.reports.append(engine.run_summary)
    if knobs.get("verify_capacity"):  # TETRIS: the batch verifies only its most promising drafted tokens
        from specgen.samplers.tetris import TetrisDrafter

        drafter = TetrisDrafter(drafter, knobs["verify_capacity"], knobs["capacity_estimate"])
    rule = make_rule(spec.rule, processing, **generator.rule_options(spec, knobs, drafter))
    stats.reports.extend(part.run_summary for part in (drafter, rule) if hasattr(part, "run_summary"))
    return Pipeline(spec, knobs, processing, policy, drafter, rule, generator.serving_target(engine, processing),
                    max_new_tokens, tuple(generator.stop_tokens), stats)


def make_drafter(generator: Generator, spec: MethodSpec, knobs: dict, processing: Processing, policy, engine):
    """The drafter of `spec` (for a request and for `auto`'s candidates alike): the generator's, or a self-draft
    built from the generator's own target (`kangaroo`: its first layers and a trained adapter)."""
    if spec.drafter == "kangaroo":
        from specgen.modalities.drafters.kangaroo import build_drafter

        return build_drafter(generator, knobs, processing, policy)
    if spec.drafter == "ppd":
        from specgen.modalities.drafters.ppd import build_drafter as build_ppd

        return build_ppd(generator, knobs)
    if spec.drafter == "del":
        from specgen.modalities.drafters.dynamic_exit import build_drafter as build_del

        return build_del(generator, knobs, processing, policy, engine)
    if spec.drafter == "eagle":
        from specgen.modalities.drafters.eagle import build_drafter as build_eagle

        return build_eagle(generator, knobs, processing, policy, engine)
    if spec.drafter == "poss":
        from specgen.modalities.drafters.poss import build_drafter as build_poss

        return build_poss(generator, knobs, processing, policy, engine)
    if spec.drafter == "mtp":
        from specgen.modalities.drafters.mtp import build_drafter as build_mtp

        return build_mtp(generator, knobs, processing, policy, engine)
    if spec.drafter == "falcon":
        from specgen.modalities.drafters.falcon import build_drafter as build_falcon

        return build_falcon(generator, knobs, processing, policy, engine)
    if spec.drafter == "tree-eagle2" and knobs.get("head", "model") != "model":  # EAGLE-2's tree over a feature head
        from specgen.modalities.drafters.head_tree import build_drafter as build_head_tree

        return build_head_tree(generator, knobs, processing, policy, engine)
    return generator.drafter(spec, knobs, processing, policy, engine)


def servable(generator: Generator, spec: MethodSpec) -> bool:
    """Whether `generator` can serve `spec` at all: a drafter trained on the target (a Kangaroo adapter, an EAGLE
    head, PosS specialists) is served only beside its very weights (for the default method sets, e.g. `bench`
    without --methods; a request for it gets the reason)."""
    if spec.target == "early-exit":
        from specgen.modalities.text.early_exit import find_modules as find
    elif spec.drafter in ("kangaroo", "del"):
        from specgen.modalities.drafters.kangaroo import find_adapter as find
    elif spec.drafter == "eagle":
        from specgen.modalities.drafters.eagle import find_head as find
    elif spec.drafter == "poss":
        from specgen.modalities.drafters.poss import find_poss as find
    elif spec.drafter == "mtp":
        from specgen.modalities.drafters.mtp import find_mtp as find
    elif spec.drafter == "falcon":
        from specgen.modalities.drafters.falcon import find_falcon as find
    elif spec.drafter == "ppd":
        from specgen.modalities.drafters.ppd import find_prompts as find
    else:
        return True
    try:
        find(getattr(generator, "model_path", ""))
    except SpecgenError:
        return False
    return True


def check_num_samples(num_samples: int) -> int:
    if num_samples < 1:
        raise InvalidRequest(f"num_samples must be >= 1, got {num_samples}")
    return num_samples

