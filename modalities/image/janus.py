"""Hugging Face Janus (`JanusForConditionalGeneration`) image generation on the shared core, so SJD, MC-SJD and
Gumbel-coupled Jacobi decoding run it unchanged.

Janus generates an image by feeding image codes back through `generation_embeddings` + `generation_aligner` and
reading logits over the codebook from `generation_head`, with classifier-free guidance from a doubled batch whose
unconditioned prompt keeps only BOS and BOI. `JanusImageLM` presents that path as a causal LM over one id space
(ids below `num_codes` are image codes, text ids are shifted up by `num_codes`), so `TransformersTarget` scores
windows through our position-indexed cache, and `GuidedTarget` doubles the batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.pipeline import Generator
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.samplers.guided import GuidedTarget
from specgen.samplers.jacobi import JacobiDrafter
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from specgen.samplers.stats import SpecStats


class JanusImageLM(torch.nn.Module):
    """The image-generation path of a Janus model as a causal LM: ids < num_codes are image codes, ids >= num_codes
    are text token ids + num_codes; logits cover the codebook."""

    def __init__(self, janus):
        super().__init__()
        self.janus = janus.eval()
        self.num_codes = janus.model.generation_head.vision_head.out_features
        text = janus.config.text_config
        self.config = SimpleNamespace(vocab_size=self.num_codes, max_position_embeddings=text.max_position_embeddings,
                                      layer_types=getattr(text, "layer_types", None),
                                      sliding_window=getattr(text, "sliding_window", None))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        model = self.janus.model
        codes = ids < self.num_codes
        image = model.generation_aligner(model.generation_embeddings(ids.clamp(max=self.num_codes - 1)))
        text = self.janus.get_input_embeddings()((ids - self.num_codes).clamp(min=0))
        return torch.where(codes[..., None], image, text)

    def forward(self, input_ids, position_ids=None, attention_mask=None, cache=None, use_cache=True,
                logits_to_keep: int = 0):
        out = self.janus.model.language_model(inputs_embeds=self.embed(input_ids), position_ids=position_ids,
                                              attention_mask=attention_mask, cache=cache, use_cache=use_cache)
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.janus.model.generation_head(hidden))

    def full_logits(self, ids: list[int]) -> torch.Tensor:
        """[vocab] guidance-free logits of the next code after `ids` (one id space), without a cache: a reference."""
        with torch.no_grad():
            return self.forward(torch.tensor([ids]), use_cache=False).logits[0, -1]


@dataclass(frozen=True)
class JanusResult:
    tokens: list[list[int]]  # image codes per sample
    stats: dict


class JanusImageGenerator(Generator):
    """Janus image generation by `ar`, `sjd`, `mc-sjd` or `gumbel-sjd`.

    `JanusImageGenerator(path)` loads a checkpoint offline (e.g. a downloaded Janus-Pro folder) and, when the
    folder has one, its processor, so prompts may be text; `JanusImageGenerator(model=..., processor=...)` serves a
    loaded `JanusForConditionalGeneration`. Without a processor a prompt is token ids ending with BOI. Special token
    ids come from the model's generation config (BOS, pad) and `boi_token_id` (its `generation_kwargs`)."""

    modality = "image"  # the registry's image methods

    def __init__(self, path: str | None = None, *, model=None, processor=None, dtype=torch.float32,
                 boi_token_id: int | None = None):
        if model is None:
            if path is None:
                raise InvalidRequest("give a Janus checkpoint path or a loaded model")
            model = _load(path, dtype)
            processor = processor or _load_processor(path)
        self.processor = processor
        self.lm = JanusImageLM(model)
        generation = model.generation_config
        self.bos = generation.bos_token_id
        self.pad = generation.pad_token_id
        self.boi = boi_token_id if boi_token_id is not None else (generation.generation_kwargs or {}).get("boi_token_id")
        if self.boi is None or self.pad is None:
            raise InvalidRequest("the Janus generation config needs pad_token_id and generation_kwargs['boi_token_id']")
        self.num_image_tokens = model.model.vision_model.config.num_image_tokens

    def encode(self, prompt: str) -> torch.Tensor:
        """A text prompt -> Janus's image-generation prompt ids: the user turn in its chat template, then BOI."""
        if self.processor is None:
            raise InvalidRequest("this Janus model has no processor beside it: give the prompt as token ids")
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        turn = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        text = self.processor.apply_chat_template(turn, add_generation_prompt=True)
        return self.processor(text=text, generation_mode="image", return_tensors="pt")["input_ids"][0]

    def shifted(self, input_ids) -> torch.Tensor:
        """Text prompt ids (or a text prompt) -> the image LM's id space."""
        if isinstance(input_ids, str):
            input_ids = self.encode(input_ids)
        return torch.as_tensor(input_ids, dtype=torch.long).flatten() + self.lm.num_codes

    def uncond(self, prompt: torch.Tensor) -> torch.Tensor:
        """Janus's unconditioned prompt: every token but BOS and BOI becomes pad (in the shifted id space)."""
        text = prompt - self.lm.num_codes
        keep = (text == self.bos) | (text == self.boi)
        return torch.where(keep, prompt, self.pad + self.lm.num_codes)

    def processing(self, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   guidance_scale: float = 5.0) -> Processing:
        # Janus applies guidance only above 1; at or below it the conditioned logits are used as they are
        return Processing(temperature=temperature, top_k=top_k, top_p=top_p,
                          guidance_scale=guidance_scale if guidance_scale > 1 else None)

    def stream(self, input_ids, *, method: str | None = None, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, guidance_scale: float = 5.0, seed: int = 0, num_samples: int = 1,
               max_new_tokens: int | None = None, stats: SpecStats | None = None, **params):
        pipeline, prompts = self._request(input_ids, method, num_samples, max_new_tokens, stats, params,
                                          temperature=temperature, top_k=top_k, top_p=top_p,
                                          guidance_scale=guidance_scale)
        yield from pipeline.run(prompts, seed=seed)

    def generate(self, input_ids, *, method: str | None = None, seed: int = 0, num_samples: int = 1,
                 max_new_tokens: int | None = None, **options) -> JanusResult:
        sampling = {k: options.pop(k) for k in ("temperature", "top_k", "top_p", "guidance_scale") if k in options}
        pipeline, prompts = self._request(input_ids, method, num_samples, max_new_tokens, None, options, **sampling)
        result = pipeline.generate(prompts, seed=seed)
        return JanusResult(result.tokens, result.stats)

    def _request(self, input_ids, method: str | None, num_samples: int, max_new_tokens: int | None,
                 stats: SpecStats | None, params: dict, **sampling):
        self.check_request(method, num_samples, params)
        prompt = self.shifted(input_ids)
        if int(prompt[-1]) - self.lm.num_codes != self.boi:
            raise InvalidRequest(f"a Janus image prompt ends with the BOI token ({self.boi})")
        pipeline = self.pipeline(method, [prompt], max_new_tokens=max_new_tokens or self.num_image_tokens,
                                 sampling=sampling, params=params, stats=stats)
        return pipeline, [prompt] * num_samples

    # ---- the pipeline's parts (modalities/pipeline.py) -------------------------------------------------------

    def capacity(self, spec, knobs: dict, prompts, max_new_tokens: int) -> int:
        return len(prompts[0]) + max_new_tokens + knobs.get("window", 1)  # the cache never holds more

    def engine(self, capacity: int | None) -> TransformersTarget:
        return TransformersTarget(self.lm, capacity=capacity)

    def policy(self, spec, knobs: dict) -> FixedLength:
        return FixedLength(knobs["window"] - 1 if "window" in knobs else 0)

    def drafter(self, spec, knobs: dict, processing: Processing, policy, engine):
        if spec.drafter is None:
            return None
        if not spec.drafter.startswith("jacobi-"):
            raise InvalidRequest(f"Janus serves the Jacobi methods and ar, not {spec.name!r}")
        return JacobiDrafter(self.lm.num_codes, spec.drafter.removeprefix("jacobi-"), knobs["init"])

    def serving_target(self, engine, processing: Processing) -> GuidedTarget:
        return GuidedTarget(engine, self.uncond)  # the unconditioned row always runs, as in Janus's own generate

    def decode(self, tokens: list[list[int]]):
        """Image codes -> pixels with Janus's own VQ decoder: float [batch, H, W, 3] in [-1, 1]."""
        with torch.no_grad():
            return self.lm.janus.decode_image_tokens(torch.tensor(tokens))

    def images(self, tokens: list[list[int]]) -> list:
        """Image codes -> one PIL image per sample."""
        from PIL import Image

        pixels = ((self.decode(tokens).float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return [Image.fromarray(p.numpy()) for p in pixels]


def _load(path: str, dtype):
    from transformers import JanusForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep stderr for our own lines (an error stays one line)

    try:
        return JanusForConditionalGeneration.from_pretrained(path, dtype=dtype, local_files_only=True).eval()
    except (OSError, ValueError) as exc:
        raise ModelNotFound(f"cannot load a Janus model from {path!r} offline: {str(exc).splitlines()[0]}") from None


def _load_processor(path: str):
    """The checkpoint's processor (tokenizer and chat template), or None when the folder has none."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError):
        return None


def is_janus(path: str | Path) -> bool:
    """Whether a model folder holds a Janus checkpoint (its config's model_type)."""
    config = Path(path) / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type") == "janus"
    except (OSError, ValueError):
        return False
