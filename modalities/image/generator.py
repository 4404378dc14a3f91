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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from specgen.settings import use_threads
from specgen.errors import InvalidRequest
from specgen.modalities.image import vq as vq_codec
from specgen.modalities.image.models import (check_vq, default_guidance, default_paths, load_image_lm, load_image_vocab,
                                            vq_of)
from specgen.modalities.runtime.llama_runner import fast_matmul_dtype
from specgen.modalities.runtime.transformers_adapter import TransformersTarget, measure_window_s
from specgen.modalities.image.eagle_head.drafter import EagleTreeDrafter
from specgen.modalities.pipeline import Generator
from specgen.samplers import trees
from specgen.samplers.lantern import latent_neighbours
from specgen.samplers.guided import GuidedTarget
from specgen.samplers.jacobi import JacobiDrafter
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.registry import get_method
from specgen.samplers.stats import SpecStats
from specgen.samplers.types import StepEvent


# Sampling default for the shipped models: top-k trims the long flat tail a small model leaves over the codebook
# (LlamaGen/SJD scripts use ~6 % of the codebook). The guidance default is the model's own (models.default_guidance).
DEFAULT_TOP_K = 50


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


class ImageGenerator(Generator):
    def __init__(self, model: str | Path | None = None, vq: str | Path | None = None, *, head: str | Path | None = None,
                 threads: int | None = 1,
                 dtype: torch.dtype = torch.float32, video: bool = False):
        if threads:
            use_threads(threads)
        paths = default_paths()
        self.model_path = Path(model or paths["video" if video else "target"])
        self.vq_path = Path(vq or vq_of(self.model_path))
        check_vq(self.model_path, self.vq_path)
        self.model = load_image_lm(self.model_path, dtype)
        self.vocab = load_image_vocab(self.model_path)
        self.default_guidance = default_guidance(self.model_path)
        # images: bfloat16 linears and per-query attention where that is exact and faster. Clips stay float32:
        # over their 1,000-code contexts the per-query attention kernel costs more than SDPA saves, and MC-SJD
        # ran no faster per clip (docs/video.md)
        self.matmul_dtype = fast_matmul_dtype(self.model) if self.vocab.frames == 1 else None
        self.modality = "video" if self.vocab.frames > 1 else "image"  # the registry's method table to use
        self._vq = None
        self.head_path = Path(head or paths["head"])
        self._head, self._neighbours = None, {}

    @property
    def vq(self):
        if self._vq is None:
            self._vq = vq_codec.load_vq(self.vq_path)
        return self._vq

    def processing(self, *, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                   guidance_scale: float | None = None) -> Processing:
        top_k = DEFAULT_TOP_K if top_k is None else top_k
        guidance_scale = self.default_guidance if guidance_scale is None else guidance_scale
        if not guidance_scale >= 0:
            raise InvalidRequest(f"guidance_scale must be >= 0, got {guidance_scale}")
        guidance = None if guidance_scale == 1.0 else guidance_scale  # 1 = conditioned logits only: no second row
        return Processing(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=guidance,
                          hooks=(CodesOnly(self.vocab.num_codes),))

    def stream(self, prompt: str, *, method: str | None = None, temperature: float = 1.0, top_k: int | None = None,
               top_p: float = 1.0, guidance_scale: float | None = None, seed: int = 0, num_samples: int = 1,
               stats: SpecStats | None = None, **params) -> Iterator[StepEvent]:
        pipeline, prompts = self._request(prompt, method, num_samples, stats, params, temperature=temperature,
                                          top_k=top_k, top_p=top_p, guidance_scale=guidance_scale)
        yield from pipeline.run(prompts, seed=seed)

    def _request(self, prompt: str, method: str | None, num_samples: int, stats: SpecStats | None, params: dict,
                 **sampling):
        self.check_request(method, num_samples, params)
        prompt_ids = self.vocab.prompt_ids(prompt)
        pipeline = self.pipeline(method, [prompt_ids], sampling=sampling, params=params, stats=stats)
        return pipeline, [prompt_ids] * num_samples

    # ---- the pipeline's parts (modalities/pipeline.py) -------------------------------------------------------

    def length_cap(self, prompts, max_new_tokens: int | None) -> int:
        return self.vocab.image_tokens  # a request is always one whole image or clip

    def _shape(self, spec, knobs: dict) -> list[int]:
        return trees.named_shape(knobs["shape"]) if spec.drafter == "eagle-head" else []

    def capacity(self, spec, knobs: dict, prompts, max_new_tokens: int) -> int:
        # the cache never holds more than the prompt, the codes and one scored window or tree
        return len(prompts[0]) + max_new_tokens + knobs.get("window", 1) + len(self._shape(spec, knobs))

    def policy(self, spec, knobs: dict):
        if spec.drafter == "eagle-head":
            return FixedLength(max(trees.depths_of(self._shape(spec, knobs))))
        return FixedLength(knobs["window"] - 1 if spec.drafter is not None else 0)

    def drafter(self, spec, knobs: dict, processing: Processing, policy, engine):
        if spec.drafter == "eagle-head":
            if self.modality != "image":
                raise InvalidRequest(f"{spec.name} needs the image model and its draft head")
            guided = processing.guidance_scale is not None
            return EagleTreeDrafter(self.model, engine, self.head, processing, self._shape(spec, knobs),
                                    siblings="deterministic" if spec.name == "lantern" else "without_replacement",
                                    uncond_prompt=self.vocab.uncond_ids() if guided else None,
                                    capacity=engine.capacity)
        if spec.drafter is not None:
            allowed = torch.arange(self.vocab.vocab_size) < self.vocab.num_codes
            return JacobiDrafter(self.vocab.vocab_size, spec.drafter.removeprefix("jacobi-"), knobs["init"], allowed)
        return None

    def rule_options(self, spec, knobs: dict, drafter) -> dict:
        options = super().rule_options(spec, knobs, drafter)
        if spec.rule == "lantern":
            options.update(neighbours=self.neighbours(knobs["neighbours"]), k=knobs["neighbours"],
                           delta=knobs.get("delta"), lam=knobs.get("lam"))
        return options

    def serving_target(self, engine, processing: Processing):
        if processing.guidance_scale is None:
            return engine
        return GuidedTarget(engine, lambda _: self.vocab.uncond_ids())

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

    def generate(self, prompt: str, *, method: str | None = None, ar_step_s: float | None = None, seed: int = 0,
                 num_samples: int = 1, **options) -> ImageResult:
        """Codes, pixels and the stats of one request (the Jacobi window's mean changed drafts per step, the relaxed
        rules' share of accepted codes the exact test would reject)."""
        sampling = {k: options.pop(k) for k in ("temperature", "top_k", "top_p", "guidance_scale") if k in options}
        pipeline, prompts = self._request(prompt, method, num_samples, None, options, **sampling)
        result = pipeline.generate(prompts, seed=seed, ar_step_s=ar_step_s)
        images = self.decode(result.tokens)
        return ImageResult(images[0], images, result.tokens, result.stats)

    def summary(self, stats: SpecStats, method: str, wall_s: float, ar_step_s: float | None) -> dict:
        """The stats of a run that `stream` filled into `stats`."""
        return stats.summary(method=method, lossless=get_method(self.modality, method).lossless, wall_s=wall_s,
                             ar_step_s=ar_step_s)

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
