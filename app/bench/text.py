"""`specgen bench text`: our text methods and the Hugging Face peers, side by side in one process.

For every prompt and repeat, every method runs once, in an order rotated from round to round so that no
method always runs first (caches, frequency scaling and neighbours' load then hit all methods alike). All runs
are greedy with the same `max_new_tokens`, the same token ids (our `TextGenerator.encode`) and the same stop
token. Speedups are ratios inside one round (tokens/s of a method over tokens/s of our `ar` in that round),
summarised as the median over prompts with a bootstrap confidence interval that resamples prompts.

The Hugging Face peers run at their defaults and at our draft length: `hf-assisted` with
`num_assistant_tokens = k` and a constant schedule on the assistant's generation config (transformers reads
those from the assistant, not from `generate()`), `hf-prompt-lookup` with `prompt_lookup_num_tokens = k`.
Both variants are reported; comparisons of ours against a peer use its faster variant.

Every output is checked token for token against our `ar` output of the same prompt. At a divergence the
target's top-2 logit margin is measured there: up to the tie margin it is rounding between two near-tied
tokens, above it the method is not exact and that is a bug. The tie margin is `TIE_MARGIN`, or two steps of
the served model's logit precision where that is coarser (bf16 logits in the int8 serving mode: 0.0625 near
a logit of 12, where the int8 layers run on the bf16 fallback kernel).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specgen import settings
from specgen import __version__
from specgen.app.jsonl import read_objects
from specgen.errors import InvalidRequest
from specgen.samplers.registry import get_method, method_names
from specgen.samplers.stats import SpecStats

DEFAULT_MAX_NEW_TOKENS = 128
TIE_MARGIN = 1e-3  # a divergence where the target's top-2 logits are closer than this is rounding, not a bug
LOAD_FLAG = 1.5  # 1-minute load average above which timings are flagged as contended
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
WARMUP_TOKENS = 32
HF_PROMPT_LOOKUP_DEFAULT = 10  # transformers' documented default for prompt_lookup_num_tokens
PEERS = ("hf", "hf-assisted", "hf-prompt-lookup")
# ours-vs-peer ratios reported in the summary: (our method, the peer it is compared against)
PEER_OF = {"draft": "hf-assisted", "ngram": "hf-prompt-lookup"}


def benchmarks_dir() -> Path:
    """Where prompts and results live: `SPECGEN_BENCHMARKS`, else the source checkout's `benchmarks/`."""
    return settings.path("SPECGEN_BENCHMARKS", Path(__file__).resolve().parents[2] / "benchmarks")


# ---- prompts -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    prompt: str


def load_prompts(path: Path, classes: bool = False) -> list[Prompt]:
    """JSON Lines of {"id", "category", "prompt"} (with classes=True, "class" may stand for "prompt", as for
    class-conditional image models); any problem is an InvalidRequest naming the line."""
    prompts, seen = [], set()
    for number, item in read_objects(path, "prompts file"):
        where = f"{path} line {number}"
        source = "class" if classes and "prompt" not in item and "class" in item else "prompt"
        for key in ("id", source):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise InvalidRequest(f"{where}: {key!r} must be a non-empty string")
        category = item.get("category", "")
        if not isinstance(category, str):
            raise InvalidRequest(f"{where}: 'category' must be a string")
        if item["id"] in seen:
            raise InvalidRequest(f"{where}: id {item['id']!r} is used twice")
        seen.add(item["id"])
        prompts.append(Prompt(item["id"], category or "-", item[source]))
    if not prompts:
        raise InvalidRequest(f"prompts file {path} holds no prompts")
    return prompts


# ---- what runs ---------------------------------------------------------------------------------------------------

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


def rotated(variants: list[Variant], shift: int) -> list[tuple[int, Variant]]:
    """(original index, variant) in the order of this round."""
    n = len(variants)
    return [(i % n, variants[i % n]) for i in range(shift % n, shift % n + n)]


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


# ---- statistics --------------------------------------------------------------------------------------------------

def bootstrap_median_ci(values: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """(median, 2.5 %, 97.5 %) of the median, resampling the values (one per prompt) with replacement."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, len(data), size=(resamples, len(data)))], axis=1)
    return float(np.median(data)), float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _per_prompt(items: list[dict], key: str) -> dict[str, float]:
    """prompt id -> median over repeats of items[key] (prompts where it is missing are left out)."""
    grouped: dict[str, list[float]] = {}
    for item in items:
        if item.get(key) is not None:
            grouped.setdefault(item["prompt_id"], []).append(item[key])
    return {pid: float(np.median(v)) for pid, v in grouped.items()}


def _ci_entry(per_prompt: dict[str, float], resamples: int) -> tuple[float | None, list[float] | None]:
    if not per_prompt:
        return None, None
    median, low, high = bootstrap_median_ci(list(per_prompt.values()), resamples)
    return median, [low, high]


def summarise(items: list[dict], variants: list[Variant], stats: dict[str, SpecStats],
              resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, dict]:
    """One entry per variant: the design's stats keys, pooled over items, plus the bench's ratios."""
    methods: dict[str, dict] = {}
    for v in variants:
        mine = [item for item in items if item["name"] == v.name]
        pooled = stats[v.name]
        wall_s = sum(item["wall_s"] for item in mine)
        entry = pooled.summary(method=v.method, lossless=True, wall_s=wall_s)
        for key in ("draft_s", "verify_s", "verify_s_by_window", "mean_draft_length"):
            entry.pop(key, None)  # per-item quantities; a pooled value would mix windows and prompts
        speedup, ci = _ci_entry(_per_prompt(mine, "speedup_vs_ar"), resamples)
        divergences = [{"prompt_id": i["prompt_id"], "repeat": i["repeat"], "index": i["first_divergence"],
                        "margin": i["divergence_margin"], "tie_margin": i["divergence_tie_margin"]}
                       for i in mine if not i["identical_to_ar"]]
        by_category: dict[str, list[float]] = {}
        for pid, value in _per_prompt(mine, "speedup_vs_ar").items():
            category = next(i["category"] for i in mine if i["prompt_id"] == pid)
            by_category.setdefault(category, []).append(value)
        entry.update({
            "name": v.name, "variant": v.variant, "config": v.config,
            "implementation": "specgen" if v.ours else "transformers",
            "lossless": all(i["lossless"] for i in mine),
            "tokens_per_s": _median(i["tokens_per_s"] for i in mine),
            "predicted_speedup_ideal": _median(i["predicted_speedup_ideal"] for i in mine),
            "predicted_speedup_measured": _median(i["predicted_speedup_measured"] for i in mine),
            "measured_over_predicted": _median(i.get("measured_over_predicted") for i in mine),
            "speedup_vs_ar": speedup, "speedup_vs_ar_ci95": ci,
            "speedup_by_category": {c: float(np.median(x)) for c, x in sorted(by_category.items())},
            "identical_to_ar": not divergences,
            "identical_items": sum(i["identical_to_ar"] for i in mine), "items": len(mine),
            "divergences": divergences,
            "divergence_above_tie_margin": any(d["margin"] is not None and d["margin"] > d["tie_margin"]
                                               for d in divergences),
        })
        methods[v.name] = entry
    _mark_faster_peer_settings(methods)
    _ours_vs_peers(methods, items, resamples)
    return methods


def _mark_faster_peer_settings(methods: dict[str, dict]) -> None:
    for peer in PEERS:
        runs = [m for m in methods.values() if m["method"] == peer and m["variant"] is not None]
        if len(runs) < 2:
            continue
        best = max(runs, key=lambda m: m["speedup_vs_ar"] if m["speedup_vs_ar"] is not None else -1)
        for m in runs:
            m["faster"] = m is best


def faster_setting(methods: dict[str, dict], peer: str) -> str | None:
    runs = [m for m in methods.values() if m["method"] == peer]
    for m in runs:
        if m.get("faster", len(runs) == 1):
            return m["name"]
    return None


def _ours_vs_peers(methods: dict[str, dict], items: list[dict], resamples: int) -> None:
    """ours tokens/s over the faster peer setting's tokens/s, per round, median per prompt, with a CI."""
    by_round = {(i["name"], i["prompt_id"], i["repeat"]): i for i in items}
    for ours, peer in PEER_OF.items():
        peer_name = faster_setting(methods, peer)
        if ours not in methods or peer_name is None:
            continue
        ratios = []
        for (name, pid, repeat), item in by_round.items():
            other = by_round.get((peer_name, pid, repeat))
            if name == ours and other and item["tokens_per_s"] and other["tokens_per_s"]:
                ratios.append({"prompt_id": pid, "ratio": item["tokens_per_s"] / other["tokens_per_s"]})
        median, ci = _ci_entry(_per_prompt(ratios, "ratio"), resamples)
        methods[ours]["vs_peer"] = {"peer": peer_name, "speedup": median, "speedup_ci95": ci}


# ---- the environment ---------------------------------------------------------------------------------------------

def _sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _model_record(path: str | None) -> dict | None:
    if path is None:
        return None
    folder = Path(path)
    weights = folder / ("served.safetensors" if (folder / "served.safetensors").exists() else "model.safetensors")
    return {"path": str(folder.resolve()) if folder.exists() else path, "weights": weights.name,
            "sha256": _sha256(weights)}


def source_state() -> dict:
    """The checkout's commit and whether tracked files differ from it; taken when the run starts, since the
    tree may be committed or edited while a long run goes on."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": _git("rev-parse", "HEAD"), "git_dirty": None if status is None else bool(status)}


def environment(runner: Runner, *, source: dict, command: str, prompts_path: Path, prompts: list[Prompt],
                max_new_tokens: int, repeats: int, draft_length: dict, load_before, load_after,
                load_samples: list[float], timestamp: str, variants: list[Variant]) -> dict:
    import transformers

    peaks = [x for x in [*(load_before or [])[:1], *load_samples, *(load_after or [])[:1]] if x is not None]
    generator = runner.generator
    env = {
        "timestamp_utc": timestamp, "command": command, **source,
        "specgen": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "numpy": np.__version__, "platform": platform.platform(),
        "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
        "settings": settings.snapshot(),
        "load_before": load_before, "load_after": load_after, "load_max_1min": max(peaks) if peaks else None,
        "load_flag_threshold": LOAD_FLAG, "load_flag": bool(peaks) and max(peaks) > LOAD_FLAG,
        "models": {"target": _model_record(generator.model_path), "draft": _model_record(generator.draft_path)},
        # looked up where load_tokenizer looks: the model folder, then its parent
        "tokenizer_sha256": _sha256(Path(generator.model_path) / "tokenizer.json")
        or _sha256(Path(generator.model_path).parent / "tokenizer.json"),
        "prompts": {"path": str(prompts_path), "sha256": _sha256(prompts_path), "count": len(prompts)},
        "max_new_tokens": max_new_tokens, "repeats": repeats, "greedy": True, "draft_length": draft_length,
        "warmup_tokens": min(WARMUP_TOKENS, max_new_tokens), "order": "rotated per round",
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED, "unit": "prompt"},
        "tie_margin": TIE_MARGIN, "variants": [v.name for v in variants],
    }
    from specgen.modalities.runtime.int8_linear import Int8Linear, backend

    if isinstance(generator.model.get_output_embeddings(), Int8Linear):
        env["int8_kernel"] = backend()
    if any(v.method == "hf-assisted" for v in variants):
        env["hf_assistant_defaults"] = runner.assistant_settings()
    return env


# ---- reports -----------------------------------------------------------------------------------------------------

def _f(value, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _speedup_cell(value, ci) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{value:.2f}×"


def render_markdown(result: dict, plot_name: str | None) -> str:
    methods, items, env = result["methods"], result["items"], result["env"]
    load = env["load_before"], env["load_after"]
    lines = [
        f"# specgen bench text — {env['timestamp_utc']}", "",
        "Command:", "", "```", env["command"], "```", "",
        f"Greedy, {env['max_new_tokens']} new tokens at most, {env['prompts']['count']} prompts × "
        f"{env['repeats']} repeat(s), methods interleaved in rotated order in one process, "
        f"{env['threads']} torch thread(s), each method warmed up once. Speedup = tokens/s over our `ar` in the "
        f"same round; median over prompts with a bootstrap 95 % CI ({env['bootstrap']['resamples']} resamples "
        "of prompts). Peers with a draft length run at their default and at ours; comparisons use the faster.", "",
        f"- commit `{env['git_commit']}`{' (uncommitted changes)' if env['git_dirty'] else ''}; specgen "
        f"{env['specgen']}, torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}",
        f"- CPU: {env['cpu_model']} ({env['cpu_count']} cores); load average before {load[0]}, after {load[1]}, "
        f"highest 1-min {env['load_max_1min']}"
        + (f" — **above {env['load_flag_threshold']}: timings are contended**" if env["load_flag"] else ""),
    ]
    for role, record in env["models"].items():
        if record:
            lines.append(f"- {role}: `{record['path']}` ({record.get('weights', 'model.safetensors')} sha256 "
                         f"`{record['sha256']}`)")
    if env.get("int8_kernel"):
        lines.append(f"- served in the batch-invariant int8 mode, kernel `{env['int8_kernel']}`")
    lines += [f"- prompts: `{env['prompts']['path']}` (sha256 `{env['prompts']['sha256']}`)", ""]

    lines += ["## Methods", "",
              "| method | speedup vs ar [95 % CI] | tokens/s | τ | α̂ | acceptance | steps | predicted (ideal / "
              "measured) | measured ÷ predicted | identical to ar |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods.values():
        name = f"`{m['name']}`" + (" (faster)" if m.get("faster") else "")
        lines.append(
            f"| {name} | {_speedup_cell(m['speedup_vs_ar'], m['speedup_vs_ar_ci95'])} | {_f(m['tokens_per_s'], 1)} "
            f"| {_f(m['tau'])} | {_f(m['alpha_hat'])} | {_f(m['acceptance_rate'])} | {m['steps']} "
            f"| {_f(m['predicted_speedup_ideal'])} / {_f(m['predicted_speedup_measured'])} "
            f"| {_f(m['measured_over_predicted'])} | {m['identical_items']}/{m['items']} |")
    peers = [(name, m["vs_peer"]) for name, m in methods.items() if "vs_peer" in m]
    if peers:
        lines += ["", "## Ours against the peers", "", "| ours | peer (faster setting) | speedup [95 % CI] |",
                  "|---|---|---|"]
        for name, vs in peers:
            lines.append(f"| `{name}` | `{vs['peer']}` | {_speedup_cell(vs['speedup'], vs['speedup_ci95'])} |")
    if plot_name:
        lines += ["", f"![speedup vs ar]({plot_name})"]

    categories = sorted({c for m in methods.values() for c in m["speedup_by_category"]})
    lines += ["", "## Speedup by category (median over prompts)", "",
              "| method | " + " | ".join(categories) + " |", "|---" * (len(categories) + 1) + "|"]
    for m in methods.values():
        lines.append(f"| `{m['name']}` | " + " | ".join(_f(m["speedup_by_category"].get(c)) for c in categories)
                     + " |")

    prompt_ids = list(dict.fromkeys(i["prompt_id"] for i in items))
    lines += ["", "## Per prompt: speedup vs ar (median over repeats), τ in brackets", "",
              "| prompt | category | ar tokens/s | " + " | ".join(f"`{n}`" for n in methods if n != "ar") + " |",
              "|---" * (len(methods) + 2) + "|"]
    for pid in prompt_ids:
        mine = [i for i in items if i["prompt_id"] == pid]
        ar_rate = _median(i["tokens_per_s"] for i in mine if i["name"] == "ar")
        cells = []
        for name in methods:
            if name == "ar":
                continue
            rows = [i for i in mine if i["name"] == name]
            cells.append(f"{_f(_median(i['speedup_vs_ar'] for i in rows))} ({_f(_median(i['tau'] for i in rows))})")
        lines.append(f"| {pid} | {mine[0]['category']} | {_f(ar_rate, 1)} | " + " | ".join(cells) + " |")

    diverged = [i for i in items if not i["identical_to_ar"]]
    lines += ["", "## Exactness", ""]
    if not diverged:
        lines.append("Every output equals our `ar` output token for token.")
    for i in diverged:
        margin = i["divergence_margin"]
        tie = i.get("divergence_tie_margin") or TIE_MARGIN
        verdict = "rounding between near-tied tokens" if margin is not None and margin <= tie else "**a bug**"
        lines.append(f"- `{i['name']}` on {i['prompt_id']} (repeat {i['repeat']}): first divergence at token "
                     f"{i['first_divergence']}, target top-2 margin {_f(margin, 6)} (tie margin {_f(tie, 6)}) — {verdict}")
    return "\n".join(lines) + "\n"


def plot_png(path: Path, methods: dict[str, dict]) -> None:
    """Horizontal bars: median speedup vs ar per method with its 95 % CI as whiskers and a line at 1×.
    Drawn with Pillow (a dependency of gradio), since matplotlib is not a dependency."""
    from PIL import Image, ImageDraw, ImageFont

    rows = [m for m in methods.values() if m["speedup_vs_ar"] is not None]
    try:
        font = ImageFont.load_default(size=15)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        font = ImageFont.load_default()
    label_w, bar_h, gap, top, right = 260, 26, 12, 50, 60
    width, height = 1000, top + len(rows) * (bar_h + gap) + 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    high = max([1.0] + [max(m["speedup_vs_ar"], (m["speedup_vs_ar_ci95"] or [0, 0])[1]) for m in rows]) * 1.1
    scale = (width - label_w - right) / high

    def x(value: float) -> float:
        return label_w + value * scale

    draw.text((10, 12), "speedup vs ar (median over prompts, 95 % bootstrap CI)", fill="black", font=font)
    for i, m in enumerate(rows):
        y = top + i * (bar_h + gap)
        colour = (70, 130, 180) if m["implementation"] == "specgen" else (190, 120, 60)
        draw.text((10, y + 5), m["name"], fill="black", font=font)
        draw.rectangle([x(0), y, x(m["speedup_vs_ar"]), y + bar_h], fill=colour)
        if m["speedup_vs_ar_ci95"]:
            low, up = m["speedup_vs_ar_ci95"]
            mid = y + bar_h / 2
            draw.line([x(low), mid, x(up), mid], fill="black", width=2)
            for end in (low, up):
                draw.line([x(end), y + 5, x(end), y + bar_h - 5], fill="black", width=2)
        draw.text((x(max(m["speedup_vs_ar"], (m["speedup_vs_ar_ci95"] or [0, 0])[1])) + 6, y + 5),
                  f"{m['speedup_vs_ar']:.2f}x", fill="black", font=font)  # the bundled font has no "×"
    bottom = top + len(rows) * (bar_h + gap)
    draw.line([x(1.0), top - 8, x(1.0), bottom], fill=(200, 0, 0), width=1)
    draw.text((x(1.0) - 8, bottom + 4), "1x", fill=(200, 0, 0), font=font)
    draw.text((10, bottom + 24), "blue: specgen   orange: Hugging Face transformers", fill="black", font=font)
    image.save(path)


# ---- the command -------------------------------------------------------------------------------------------------

def record_dirs(out_dir: Path | str | None) -> tuple[Path, Path]:
    """(folder for the timestamped run, folder for the `*-latest` copies). With `--out-dir` both are that folder; by
    default a run goes to the user cache (SPECGEN_HOME/runs) and its latest copies to benchmarks/, where the docs
    cite them. Both are checked before any work."""
    if out_dir:
        folder = checked_out_dir(Path(out_dir))
        return folder, folder
    from specgen.modalities.assets import cache_dir

    return checked_out_dir(cache_dir() / "runs"), checked_out_dir(benchmarks_dir())


def checked_out_dir(path: Path) -> Path:
    """`--out-dir`, created if needed; a clear error before any work where it cannot be written."""
    if path.exists() and not path.is_dir():
        raise InvalidRequest(f"--out-dir {path} is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidRequest(f"cannot create --out-dir {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise InvalidRequest(f"cannot write into --out-dir {path}")
    return path


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)


def run_bench(*, prompts_path: Path | None, methods: list[str] | None, max_new_tokens: int | None, repeats: int,
              model: str | None, draft: str | None, threads: int, out_dir: Path | None, command: str,
              progress: Callable[[int], object] = _progress) -> tuple[dict, dict[str, Path]]:
    """Run the benchmark; returns the result object and the files written."""
    from specgen.modalities.text.generator import TextGenerator

    prompts_path = Path(prompts_path) if prompts_path else benchmarks_dir() / "prompts" / "text.jsonl"
    prompts = load_prompts(prompts_path)  # fails before any model loads
    runs_dir, latest_dir = record_dirs(out_dir)
    max_new_tokens = max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    generator = TextGenerator(model=model, draft=draft, threads=threads)
    resolve = lambda spec: generator.resolve_knobs(spec, {})  # noqa: E731 - the served model's defaults apply
    draft_length, lookup_length = (int(resolve(get_method("text", name))["num_draft_tokens"])
                                   for name in ("draft", "ngram"))
    variants = plan_variants(methods, draft_length, lookup_length, resolve)
    runner = Runner(generator)
    if any(v.method == "hf-assisted" or (v.ours and (get_method("text", v.method).drafter or "").startswith("model"))
           for v in variants):
        runner.draft  # loads it now: a missing or mismatched draft fails before any timing
    encoded = [generator.encode(p.prompt) for p in prompts]
    capacity = getattr(generator.model.config, "max_position_embeddings", 2048)
    for p, ids in zip(prompts, encoded):
        if len(ids) + max_new_tokens > capacity:
            raise InvalidRequest(f"prompt {p.id!r} has {len(ids)} tokens: with {max_new_tokens} new tokens it "
                                 f"exceeds the model's context of {capacity}")

    source, load_before, load_samples = source_state(), _load(), []
    timestamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    bar = progress(len(variants) * (1 + len(prompts) * repeats))
    warmup = min(WARMUP_TOKENS, max_new_tokens)
    for v in variants:  # first calls pay for lazy initialisation; keep that out of the timings
        bar.set_description(f"warm-up {v.name}")
        runner.run(v, prompts[0], encoded[0], warmup)
        bar.update(1)

    items: list[dict] = []
    pooled = {v.name: SpecStats() for v in variants}
    for p_index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        for repeat in range(repeats):
            outcomes: dict[str, tuple[int, Outcome]] = {}
            for position, (_, v) in enumerate(rotated(variants, p_index * repeats + repeat)):
                bar.set_description(f"{prompt.id} {v.name}")
                outcomes[v.name] = (position, runner.run(v, prompt, ids, max_new_tokens))
                bar.update(1)
            items += _round_items(generator, variants, prompt, ids, repeat, outcomes, pooled)
        sample = _load()
        if sample:
            load_samples.append(sample[0])
    bar.close()
    load_after = _load()

    result = {"methods": summarise(items, variants, pooled), "items": items,
              "env": environment(runner, source=source, command=command, prompts_path=prompts_path, prompts=prompts,
                                 max_new_tokens=max_new_tokens, repeats=repeats,
                                 draft_length={"draft": draft_length, "ngram": lookup_length},
                                 load_before=load_before, load_after=load_after, load_samples=load_samples,
                                 timestamp=timestamp, variants=variants)}
    from specgen.modalities.text import gemma

    label = "text-gemma" if gemma.is_served(generator.model_path) else "text"
    return result, write_outputs(result, runs_dir, timestamp, label, latest_dir)


def _round_items(generator, variants: list[Variant], prompt: Prompt, ids: torch.Tensor, repeat: int,
                 outcomes: dict[str, tuple[int, Outcome]], pooled: dict[str, SpecStats]) -> list[dict]:
    """Items of one round, with stats that need the round's `ar` run (its step time and its tokens)."""
    ar = outcomes["ar"][1]
    ar_step_s = ar.stats.verify_s / ar.stats.steps if ar.stats.steps else None
    ar_rate = len(ar.tokens) / ar.wall_s
    items = []
    for v in variants:
        position, outcome = outcomes[v.name]
        _pool(pooled[v.name], outcome.stats)
        stats = outcome.stats.summary(method=v.method, lossless=True, wall_s=outcome.wall_s,
                                      ar_step_s=ar_step_s if v.ours else None)
        if v.ours:
            stats["lossless"] = get_method("text", v.method).lossless
        index, compared = first_divergence(outcome.tokens, ar.tokens)
        margin, tie = top2_margin(generator.model, ids, ar.tokens[:index]) if index is not None else (None, None)
        rate = len(outcome.tokens) / outcome.wall_s if outcome.wall_s > 0 else None
        speedup = rate / ar_rate if rate else None
        predicted = stats.get("predicted_speedup_measured")
        item = {"name": v.name, **stats, "variant": v.variant, "prompt_id": prompt.id, "category": prompt.category,
                "repeat": repeat, "order": position, "prompt_tokens": len(ids), "new_tokens": len(outcome.tokens),
                "tokens_per_s": rate, "speedup_vs_ar": speedup,
                "measured_over_predicted": speedup / predicted if speedup and predicted else None,
                "identical_to_ar": index is None, "compared_tokens": compared, "first_divergence": index,
                "divergence_margin": margin, "divergence_tie_margin": tie,
                "divergence_tokens": None if index is None else {"ar": ar.tokens[index],
                                                                  v.name: outcome.tokens[index]}}
        if v.name == "ar":  # what the model wrote, once per round, for readers of the JSON
            item["text"] = generator.tokenizer.decode(ar.tokens, skip_special_tokens=True)
        items.append(item)
    return items


def _pool(total: SpecStats, run: SpecStats) -> None:
    for key in ("steps", "row_steps", "drafted", "accepted", "rejections", "committed", "draft_s", "verify_s"):
        setattr(total, key, getattr(total, key) + getattr(run, key))
    while len(total.tested_at) < len(run.tested_at):
        total.tested_at.append(0)
        total.accepted_at.append(0)
    for d, (tested, accepted) in enumerate(zip(run.tested_at, run.accepted_at)):
        total.tested_at[d] += tested
        total.accepted_at[d] += accepted


def script_record(script: str, args) -> dict:
    """The fields a benchmark script's record starts with: its command line (from its parsed arguments, --out left
    out), the CPU, the thread count and torch's version."""
    command = f"python benchmarks/{script} " + " ".join(
        f"--{name.replace('_', '-')} {value}" for name, value in vars(args).items() if name != "out")
    return {"command": command, "cpu": _cpu_model(), "threads": args.threads, "torch": torch.__version__}


def save_record(out: Path, result: dict, markdown) -> None:
    """A benchmark script's record: OUT.json and OUT.md (`markdown(result)`), the table printed as well."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def write_outputs(result: dict, out_dir: Path, timestamp: str, label: str = "text",
                  latest_dir: Path | None = None) -> dict[str, Path]:
    """bench-<label>-<timestamp>.{json,md,png} in `out_dir` and copies as <label>-latest.* in `latest_dir` (default:
    the same folder); the label is `text-gemma` for Gemma 3 270M so its figures sit beside the code model's."""
    latest_dir = latest_dir or out_dir
    stem = out_dir / f"bench-{label}-{timestamp}"
    files = {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md"), "png": stem.with_suffix(".png")}
    files["json"].write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    plot_png(files["png"], result["methods"])
    files["md"].write_text(render_markdown(result, files["png"].name), encoding="utf-8")
    for kind in ("json", "md", "png"):
        latest = latest_dir / f"{label}-latest.{kind}"
        if kind == "md":  # the latest copy points at the latest plot
            latest.write_text(render_markdown(result, f"{label}-latest.png"), encoding="utf-8")
        else:
            shutil.copyfile(files[kind], latest)
        files[f"latest_{kind}"] = latest
    return files


def bench_text(args) -> int:
    """The CLI handler: JSON (only) on stdout with --json, else the Markdown report; progress on stderr."""
    argv = getattr(args, "argv", None)
    command = "specgen " + shlex.join(argv) if argv is not None else "specgen " + shlex.join(sys.argv[1:])
    result, files = run_bench(prompts_path=args.prompts, methods=args.methods, max_new_tokens=args.max_new_tokens,
                              repeats=args.repeats, model=args.model, draft=args.draft, threads=args.threads,
                              out_dir=args.out_dir, command=command)
    if args.json:
        print(json.dumps(result))
    else:
        print(render_markdown(result, files["png"].name), end="")
    print(f"wrote {files['json']}, {files['md']}, {files['png']} (and {files['latest_md'].stem}.* beside them)",
          file=sys.stderr)
    return 0
