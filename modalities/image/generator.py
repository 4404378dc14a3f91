"""`ImageGenerator`: conditioned image- and video-token generation, plain or by Jacobi decoding, and VQ decoding to
pixels.

A request is a short prompt ("red K on blue", "digit 3", "photo of coffee"; a class name is a prompt too; for a
video model "red K moving right on blue"). A video is its frames' codes one frame after another. The
target scores its conditioned and unconditioned rows in one batched forward (`GuidedTarget`), and one
`Processing` applies guidance, the image-codes-only constraint, temperature and top-k to every slot of every
window, for plain decoding and verification alike. Methods come from the registry: `ar`, `sjd`, `mc-sjd`,
`gumbel-sjd`, `eagle` (all exact; `eagle` drafts trees with the EAGLE-style head in assets/image/head) and the
relaxed `lantern` (delta) and `lantern++` (lambda) over latent neighbours in the VQ codebook. Without arguments it loads the image model shipped in `assets/image/`; with
`video=True` the video model.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from specgen.settings import use_threads
from specgen.errors import InvalidRequest
from specgen.modalities.image import vq as vq_codec
from specgen.modalities.image.models import default_paths, load_image_lm, load_image_vocab
from specgen.modalities.runtime.llama_runner import fast_matmul_dtype
from specgen.modalities.runtime.transformers_adapter import TransformersTarget, measure_window_s
from specgen.modalities.image.eagle_head.drafter import EagleTreeDrafter
from specgen.samplers import trees
from specgen.samplers.acceptance import make_rule
from specgen.samplers.lantern import latent_neighbours
from specgen.samplers.guided import GuidedTarget
from specgen.samplers.jacobi import JacobiDrafter
from specgen.samplers.loop import speculative_generate
from specgen.samplers.policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.registry import default_method, get_method
from specgen.samplers.stats import SpecStats
from specgen.samplers.types import StepEvent


# Sampling defaults for the shipped models: top-k trims the long flat tail a small model leaves over the codebook,
# guidance sharpens the condition (LlamaGen/SJD scripts use top-k ~6 % of the codebook and guidance 3-7.5).
DEFAULT_TOP_K = 50
DEFAULT_GUIDANCE = 3.0


@dataclass(frozen=True)
class CodesOnly:
    """Position constraint: every generated slot is an image code (ids below num_codes)."""

    num_codes: int

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return logits.index_fill(-1, _ids_from(self.num_codes, logits.shape[-1]), float("-inf"))


@functools.lru_cache(maxsize=16)
def _ids_from(start: int, stop: int) -> torch.Tensor:
    return torch.arange(start, stop)  # made once per vocabulary: the hook runs at every step


@dataclass(frozen=True)
class ImageResult:
    image: object  # the first sample: a PIL.Image, or for a video its list of PIL frames
    images: list  # one such per sample
    tokens: list[list[int]]  # codes per sample, raster order (frame after frame for a video)
    stats: dict


class ImageGenerator:
    def __init__(self, model: str | Path | None = None, vq: str | Path | None = None, *, head: str | Path | None = None,
                 threads: int | None = 1,
                 dtype: torch.dtype = torch.float32, video: bool = False):
        if threads:
            use_threads(threads)
        paths = default_paths()
        self.model_path = Path(model or paths["video" if video else "target"])
        self.vq_path = Path(vq or paths["vq"])
        self.model = load_image_lm(self.model_path, dtype)
        self.vocab = load_image_vocab(self.model_path)
        # images: bfloat16 linears and per-query attention where that is exact and faster. Clips stay float32:
        # over their 1,000-code contexts the per-query attention kernel costs more than SDPA saves, and MC-SJD
        # ran no faster per clip (benchmarks/bench-video-20261202T023054Z.md, docs/video.md)
        self.matmul_dtype = fast_matmul_dtype(self.model) if self.vocab.frames == 1 else None
        self.modality = "video" if self.vocab.frames > 1 else "image"  # the registry's method table to use
        self._vq = None
        self.head_path = Path(head or paths["head"])
        self._head, self._neighbours = None, {}
        self.last_drafter: JacobiDrafter | EagleTreeDrafter | None = None
        self.last_rule = None

    @property
    def vq(self):
        if self._vq is None:
            self._vq = vq_codec.load_vq(self.vq_path)
        return self._vq

    def processing(self, *, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                   guidance_scale: float | None = None) -> Processing:
        top_k = DEFAULT_TOP_K if top_k is None else top_k
        guidance_scale = DEFAULT_GUIDANCE if guidance_scale is None else guidance_scale
        if not guidance_scale >= 0:
            raise InvalidRequest(f"guidance_scale must be >= 0, got {guidance_scale}")
        guidance = None if guidance_scale == 1.0 else guidance_scale  # 1 = conditioned logits only: no second row
        return Processing(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=guidance,
                          hooks=(CodesOnly(self.vocab.num_codes),))

    def stream(self, prompt: str, *, method: str | None = None, temperature: float = 1.0, top_k: int | None = None,
               top_p: float = 1.0, guidance_scale: float | None = None, seed: int = 0, num_samples: int = 1,
               stats: SpecStats | None = None, **params) -> Iterator[StepEvent]:
        method = method or default_method(self.modality)  # the registry's default
        spec = get_method(self.modality, method)
        knobs = spec.resolve_knobs(params)
        if num_samples < 1:
            raise InvalidRequest(f"num_samples must be >= 1, got {num_samples}")
        processing = self.processing(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=guidance_scale)
        prompt_ids = self.vocab.prompt_ids(prompt)
        shape = trees.named_shape(knobs["shape"]) if spec.drafter == "eagle-head" else []
        # the cache never holds more than the prompt, the codes and one scored window or tree
        capacity = len(prompt_ids) + self.vocab.image_tokens + knobs.get("window", 1) + len(shape)
        inner = target = self.engine(capacity)
        guided = processing.guidance_scale is not None
        if guided:
            target = GuidedTarget(target, lambda _: self.vocab.uncond_ids())
        drafter, policy, rule_options = None, FixedLength(0), {}
        if spec.drafter == "eagle-head":
            if self.modality != "image":
                raise InvalidRequest(f"{method} needs the image model and its draft head")
            drafter = EagleTreeDrafter(self.model, inner, self.head, processing, shape,
                                       siblings="deterministic" if method == "lantern" else "without_replacement",
                                       uncond_prompt=self.vocab.uncond_ids() if guided else None, capacity=capacity)
            policy = FixedLength(max(trees.depths_of(shape)))
            rule_options["siblings"] = drafter.siblings
            if spec.rule == "lantern":
                rule_options.update(neighbours=self.neighbours(knobs["neighbours"]), k=knobs["neighbours"],
                                    delta=knobs.get("delta"), lam=knobs.get("lam"))
        elif spec.drafter is not None:
            allowed = torch.arange(self.vocab.vocab_size) < self.vocab.num_codes
            drafter = JacobiDrafter(self.vocab.vocab_size, spec.drafter.removeprefix("jacobi-"), knobs["init"], allowed)
            policy = FixedLength(knobs["window"] - 1)
        self.last_drafter = drafter
        self.last_rule = make_rule(spec.rule, processing, **rule_options)
        yield from speculative_generate(target, drafter, self.last_rule, [prompt_ids] * num_samples,
                                        processing=processing, max_new_tokens=self.vocab.image_tokens, policy=policy,
                                        seed=seed, stats=stats)

    def engine(self, capacity: int | None = None) -> TransformersTarget:
        """The served target: our runner over the model, in `matmul_dtype` where that is exact."""
        return TransformersTarget(self.model, capacity=capacity, matmul_dtype=self.matmul_dtype)

    @property
    def head(self):
        """The EAGLE-style draft head (assets/image/head unless `head=` was given), loaded on first use."""
        if self._head is None:
            from specgen.modalities.image.eagle_head.head import EagleHead

            self._head = EagleHead.load(self.head_path, dtype=next(self.model.parameters()).dtype)
        return self._head

    def neighbours(self, k: int) -> torch.Tensor:
        """[vocab, k] latent neighbours of every code in the VQ codebook (LANTERN's proximity sets)."""
        if k not in self._neighbours:
            codebook = self.vq.quantize.embedding.weight.detach()
            if not k < codebook.shape[0]:
                raise InvalidRequest(f"neighbours must be below the codebook size {codebook.shape[0]}, got {k}")
            self._neighbours[k] = latent_neighbours(codebook, k, self.vocab.vocab_size)
        return self._neighbours[k]

    def generate(self, prompt: str, *, method: str | None = None, ar_step_s: float | None = None,
                 **options) -> ImageResult:
        method = method or default_method(self.modality)  # the registry's default
        stats = SpecStats()
        num_samples = options.get("num_samples", 1)
        tokens: list[list[int]] = [[] for _ in range(num_samples)]
        started = time.perf_counter()
        for event in self.stream(prompt, method=method, stats=stats, **options):
            tokens[event.row].extend(event.tokens)
        summary = self.summary(stats, method, time.perf_counter() - started, ar_step_s)
        images = self.decode(tokens)
        return ImageResult(images[0], images, tokens, summary)

    def summary(self, stats: SpecStats, method: str, wall_s: float, ar_step_s: float | None) -> dict:
        """The stats of the last run, with the Jacobi window's mean number of drafts changed per step."""
        summary = stats.summary(method=method, lossless=get_method(self.modality, method).lossless, wall_s=wall_s,
                                ar_step_s=ar_step_s)
        if getattr(self.last_rule, "relaxation", None) is not None:
            summary["relaxed_share"] = self.last_rule.relaxed_share  # accepted codes the exact test would reject
        if isinstance(self.last_drafter, JacobiDrafter):
            changed = self.last_drafter.changed
            summary["changed_per_step"] = sum(changed) / len(changed) if changed else 0.0
        return summary

    def decode(self, tokens: list[list[int]]) -> list:
        """Codes per sample (raster order, frame after frame) -> a PIL image per sample, or for a video model a
        list of PIL frames per sample."""
        from PIL import Image

        grid, frames = self.vocab.grid, self.vocab.frames
        if any(len(t) != self.vocab.image_tokens for t in tokens):
            raise InvalidRequest(f"each {self.modality} needs {self.vocab.image_tokens} codes")
        pixels = vq_codec.decode(self.vq, torch.tensor(tokens).reshape(len(tokens) * frames, grid, grid))
        images = [Image.fromarray(p) for p in pixels]
        if frames == 1:
            return images
        return [images[k * frames:(k + 1) * frames] for k in range(len(tokens))]

    def measure_step_s(self, prompt: str, guidance_scale: float | None = None, repeats: int = 3) -> float:
        """Median time of one plain decoding step after the prompt (with the guidance row if any): T_ar."""
        return self.measure_window_s(prompt, 1, guidance_scale=guidance_scale, repeats=repeats)

    def measure_window_s(self, prompt: str, window: int, *, guidance_scale: float | None = None,
                         repeats: int = 3, context: int | None = None) -> float:
        """Median time of one target forward over `window` slots (pending + window-1 drafts) after `context`
        generated codes: T_window(L). The default context is half the codes of a request, the mean context a
        decoding step sees (it matters for video, whose 2,000-token contexts make attention a large part of a
        step)."""
        prompt_ids = self.vocab.prompt_ids(prompt)
        context = self.vocab.image_tokens // 2 if context is None else context
        ids = torch.cat([prompt_ids, torch.arange(context) % self.vocab.num_codes])  # placeholder codes
        target = self.engine(len(ids) + window)
        if self.processing(guidance_scale=guidance_scale).guidance_scale is not None:
            uncond = self.vocab.uncond_ids()
            target = GuidedTarget(target, lambda row: torch.cat([uncond, torch.as_tensor(row)[len(uncond):]]))
        return measure_window_s(target, ids, window, repeats)
