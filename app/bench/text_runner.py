"""What the text bench runs: our methods through `TextGenerator.stream` and the Hugging Face peers through
`model.generate` on the very same model objects, and the exactness check of every output against our `ar`.

The Hugging Face peers run at their defaults and at our draft length: `hf-assisted` with
`num_assistant_tokens = k` and a constant schedule on the assistant's generation config (transformers reads
those from the assistant, not from `generate()`), `hf-prompt-lookup` with `prompt_lookup_num_tokens = k`.

At a divergence from `ar` the target's top-2 logit margin is measured there: up to the tie margin it is rounding
between two near-tied tokens, above it the method is not exact and that is a bug. The tie margin is `TIE_MARGIN`,
or two steps of the served model's logit precision where that is coarser (bf16 logits in the int8 serving mode:
0.0625 near a logit of 12, where the int8 layers run on the bf16 fallback kernel).
"""

from __future__ import annotations

import copy
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specgen.app.bench.prompts import Prompt
from specgen.samplers.registry import get_method, method_names
from specgen.samplers.stats import SpecStats

TIE_MARGIN = 1e-3  # a divergence where the target's top-2 logits are closer than this is rounding, not a bug
HF_PROMPT_LOOKUP_DEFAULT = 10  # transformers' documented default for prompt_lookup_num_tokens
PEERS = ("hf", "hf-assisted", "hf-prompt-lookup")
# ours-vs-peer ratios reported in the summary: (our method, the peer it is compared against)
PEER_OF = {"draft": "hf-assisted", "ngram": "hf-prompt-lookup"}


@dataclass(frozen=True)
class Variant:
    """One configuration that is timed: a method of ours, or a peer at one setting."""

    name: str  # unique key in the results, e.g. "hf-assisted[k=5]"
    method: str  # the CLI method name
    variant: str | None = None  # "default" or "k=<k>" for the peers with two settings
    config: dict = field(default_factory=dict)

    @property
    def ours(self) -> bool:
        return self.method not in PEERS


def plan_variants(methods: list[str] | None, draft_length: int, lookup_length: int | None = None,
                  resolve=None) -> list[Variant]:
    """Our methods in registry order (`ar` always: it is the baseline), then the peers; `hf-assisted` at its
    defaults and at our `draft` length, `hf-prompt-lookup` at its default and at our `ngram` length.
    `resolve(spec)` gives our methods' knobs (default: the registry's)."""
    resolve = resolve or (lambda spec: spec.resolve_knobs({}))
    chosen = methods or [*method_names("text"), *PEERS]
    if "ar" not in chosen:
        chosen = ["ar", *chosen]
    variants = []
    for name in [m for m in method_names("text") if m in chosen]:
        variants.append(Variant(name, name, None, resolve(get_method("text", name))))
    k, lookup_k = draft_length, lookup_length or draft_length
    if "hf" in chosen:
        variants.append(Variant("hf", "hf"))
    if "hf-assisted" in chosen:
        variants.append(Variant("hf-assisted[default]", "hf-assisted", "default", {}))
        variants.append(Variant(f"hf-assisted[k={k}]", "hf-assisted", f"k={k}",
                                {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant"}))
    if "hf-prompt-lookup" in chosen:
        variants.append(Variant("hf-prompt-lookup[default]", "hf-prompt-lookup", "default",
                                {"prompt_lookup_num_tokens": HF_PROMPT_LOOKUP_DEFAULT}))
        variants.append(Variant(f"hf-prompt-lookup[k={lookup_k}]", "hf-prompt-lookup", f"k={lookup_k}",
                                {"prompt_lookup_num_tokens": lookup_k}))
    return variants



@dataclass
class Outcome:
    tokens: list[int]
    wall_s: float
    stats: SpecStats


class Runner:
    """Runs one variant on one prompt. Ours go through `TextGenerator.stream` (the public path); the peers
    through `model.generate` on the very same model objects."""

    def __init__(self, generator):
        self.generator = generator
        self.model = generator.model
        tokenizer = generator.tokenizer
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.bos = tokenizer.bos_token_id
        self._assistant = None
        self._assistant_config = None  # the draft's own generation config, restored for the default setting

    @property
    def draft(self):
        """The draft as Hugging Face's assistant: a reduced-vocabulary draft through its full-vocabulary view."""
        if self._assistant is None:
            model, vocab_ids = self.generator.draft_model, self.generator.draft_vocab_ids
            if vocab_ids is not None:
                from specgen.modalities.text.full_vocab import full_vocab_view

                model = full_vocab_view(model, vocab_ids, self.model.config.vocab_size)
            self._assistant = model
            self._assistant_config = copy.deepcopy(model.generation_config)
        return self._assistant

    def run(self, variant: Variant, prompt: Prompt, ids: torch.Tensor, max_new_tokens: int) -> Outcome:
        if variant.ours:
            return self._ours(variant, prompt, max_new_tokens)
        return self._peer(variant, ids, max_new_tokens)

    def _ours(self, variant: Variant, prompt: Prompt, max_new_tokens: int) -> Outcome:
        stats, tokens = SpecStats(), []
        started = time.perf_counter()
        for event in self.generator.stream(prompt.prompt, method=variant.method, max_new_tokens=max_new_tokens,
                                           temperature=0.0, stats=stats):
            tokens.extend(event.tokens)
        return Outcome(tokens, time.perf_counter() - started, stats)

    def _peer(self, variant: Variant, ids: torch.Tensor, max_new_tokens: int) -> Outcome:
        from transformers import GenerationConfig

        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                  eos_token_id=self.eos, pad_token_id=self.pad, bos_token_id=self.bos)
        assistant = None
        if variant.method == "hf-prompt-lookup":
            config.prompt_lookup_num_tokens = variant.config["prompt_lookup_num_tokens"]
        elif variant.method == "hf-assisted":
            assistant = self.draft
            # transformers reads these from the assistant's own config; reset them every run so that one
            # setting never leaks into the next
            assistant.generation_config = copy.deepcopy(self._assistant_config)
            for key, value in variant.config.items():
                setattr(assistant.generation_config, key, value)
        stats = SpecStats()
        inputs = ids[None]
        with _count_peer_steps(self.model, stats):
            started = time.perf_counter()
            output = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config,
                                         assistant_model=assistant)
            wall_s = time.perf_counter() - started
        tokens = output[0, inputs.shape[1]:].tolist()
        stats.committed = len(tokens)
        return Outcome(tokens, wall_s, stats)

    def assistant_settings(self) -> dict:
        """The assistant settings transformers uses at its defaults (for the record)."""
        config = copy.deepcopy(self.draft.generation_config if self._assistant_config is None
                               else self._assistant_config)
        try:  # the same resolution transformers applies to an assistant's config
            config.update(**config._get_default_generation_params(), defaults_only=True)
        except AttributeError:
            pass
        return {key: getattr(config, key, None) for key in
                ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}


@contextmanager
def _count_peer_steps(model, stats: SpecStats):
    """Counts target forward passes (steps) and, for assisted decoding, each step's candidate length and
    matches, read from transformers' per-step `update_candidate_strategy(input_ids, logits, n_matches)` call
    (logits cover candidates + 1 positions). A step cut short by the length limit counts as a rejection; that
    touches only the last step of a run."""

    def on_forward(*_):
        stats.steps += 1
        stats.row_steps += 1

    def make_candidate_generator(*args, **kwargs):
        generator = original(*args, **kwargs)
        update = generator.update_candidate_strategy

        def counting(input_ids, scores, num_matches):
            _record_chain_step(stats, int(scores.shape[1]) - 1, int(num_matches))
            return update(input_ids, scores, num_matches)

        generator.update_candidate_strategy = counting
        return generator

    original = getattr(model, "_get_candidate_generator", None)
    handle = model.register_forward_hook(on_forward)
    if original is not None:
        model._get_candidate_generator = make_candidate_generator  # instance attribute shadows the method
    try:
        yield
    finally:
        handle.remove()
        if original is not None:
            del model._get_candidate_generator


def _record_chain_step(stats: SpecStats, drafted: int, accepted: int) -> None:
    stats.record_row(drafted, accepted, accepted < drafted)


# ---- exactness ---------------------------------------------------------------------------------------------------

def first_divergence(tokens: list[int], reference: list[int]) -> tuple[int | None, int]:
    """(index of the first differing token or None, tokens compared). The common length is compared: runs
    share the stop token and the length limit, so their lengths differ only after a differing token."""
    compared = min(len(tokens), len(reference))
    for i in range(compared):
        if tokens[i] != reference[i]:
            return i, compared
    return None, compared


@torch.no_grad()
def top2_margin(model, prompt_ids: torch.Tensor, prefix: list[int]) -> tuple[float, float]:
    """(top-1 minus top-2 logit, the tie margin there) for the token after prompt + prefix (one plain forward)."""
    ids = torch.cat([prompt_ids, torch.tensor(prefix, dtype=torch.long)])[None]
    logits = model(input_ids=ids).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1]), max(TIE_MARGIN, 2 * logit_resolution(model, float(top[0])))


def logit_resolution(model, logit: float) -> float:
    """The spacing of the served model's logits near `logit`: bf16's for int8 layers on the bf16 fallback
    kernel, 0 for float32 and wider outputs (TIE_MARGIN covers their rounding)."""
    from specgen.modalities.runtime.int8_linear import FALLBACK_DTYPE, Int8Linear, backend

    if not isinstance(model.get_output_embeddings(), Int8Linear) or logit == 0 or "bf16" not in backend():
        return 0.0
    return torch.finfo(FALLBACK_DTYPE).eps * 2.0 ** math.floor(math.log2(abs(logit)))
