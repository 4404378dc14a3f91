"""The shipped image token models: plain `LlamaForCausalLM`s over the layout in `conditions.py`, and where the
shipped VQ tokenizer, target and draft live (`assets/image/{vq,target,draft}`; `SPECGEN_ASSETS` overrides the
assets folder as it does for text)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from specgen.modalities.image.conditions import ImageVocab

from specgen.errors import InvalidRequest, ModelNotFound

# role -> LlamaConfig fields. Untied heads on both: the output head over ~620 tokens is cheap, and tying it to
# the input embedding would share one table between condition words and image codes for no saving worth having.
ARCHITECTURES = {
    "target": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=4),
    "video": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4),  # the image target's shape, so it starts from the image target
    "draft": dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4),
}
MAX_POSITIONS = 512  # >= prefix + 2 + 256 for images; video models get their sequence length rounded up to 64
# Classifier-free guidance for a model whose generation_config.json names none (LlamaGen/SJD scripts use 3-7.5).
# A model that draws its condition without help (the bold-glyph target) names 1 there: guidance then only costs a
# second row per step and pushes its samples off the codes it learned.
RECIPE_GUIDANCE = 3.0


def assets_dir() -> Path:
    """The shipped image models (`SPECGEN_ASSETS` overrides the assets folder, as for text)."""
    from specgen.modalities.assets import assets_dir as root

    return root() / "image"


def default_paths() -> dict[str, Path]:
    base = assets_dir()
    return {"vq": base / "vq", "target": base / "target", "draft": base / "draft", "video": base / "video",
            "head": base / "head"}


def vq_of(model_path: str | Path, default: str | Path | None = None) -> Path:
    """The VQ whose codes the token model at `model_path` reads: the `vq/` folder inside it where it carries one (a
    model trained on the codes of another tokenizer than the shipped one), else `default` (the shipped VQ)."""
    own = Path(model_path) / "vq"
    return own if (own / "config.json").exists() else Path(default or default_paths()["vq"])


def check_vq(model_path: str | Path, vq_path: str | Path) -> None:
    """Refuse a VQ other than the one the token model was trained on (its training.json's `vq_sha256`, where it
    records one): the codes would decode, but to other pixels."""
    from specgen.modalities.training import file_sha256

    wanted = training_record(model_path).get("vq_sha256")
    weights = Path(vq_path) / "diffusion_pytorch_model.safetensors"
    if wanted and weights.exists() and file_sha256(weights) != wanted:
        raise InvalidRequest(f"the token model in {str(model_path)!r} was trained on the codes of another VQ than "
                             f"{str(vq_path)!r}; pass the VQ it was trained with (or none, for its own)")


def default_guidance(path: str | Path) -> float:
    """The guidance scale the token model at `path` decodes with by default: `guidance_scale` in its
    generation_config.json, else RECIPE_GUIDANCE."""
    config = Path(path) / "generation_config.json"
    value = json.loads(config.read_text()).get("guidance_scale") if config.exists() else None
    return RECIPE_GUIDANCE if value is None else float(value)


def glyph_style_of(path: str | Path) -> str:
    """The glyph style (`training.images.GLYPH_STYLES`) the token model at `path` was trained on, from its
    training.json ("varied", the first style, where the record names none or is missing)."""
    return training_record(path).get("glyph_style", "varied")


def training_record(path: str | Path) -> dict:
    """The training summary a token model's folder carries (training.json; empty where there is none)."""
    record = Path(path) / "training.json"
    return json.loads(record.read_text()) if record.exists() else {}


def image_model_config(role: str, vocab: ImageVocab):
    from transformers import LlamaConfig

    if role not in ARCHITECTURES:
        raise InvalidRequest(f"image model role must be one of {', '.join(ARCHITECTURES)}, not {role!r}")
    positions = max(MAX_POSITIONS, -(-vocab.sequence_length // 64) * 64)
    return LlamaConfig(vocab_size=vocab.vocab_size, max_position_embeddings=positions, rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       bos_token_id=vocab.bos, eos_token_id=None, pad_token_id=vocab.pad,
                       tie_word_embeddings=False, **ARCHITECTURES[role])


def build_image_lm(role: str, vocab: ImageVocab):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(image_model_config(role, vocab))


def _require(path: str | Path, what: str, files: tuple[str, ...]) -> Path:
    path = Path(path)
    if not path.is_dir() or not all((path / f).exists() for f in files):
        raise ModelNotFound(f"no image {what} in {str(path)!r} (expected {', '.join(files)}); train it with "
                            "`python -m specgen.modalities.image.training.recipe`")
    return path


def load_image_vocab(path: str | Path) -> ImageVocab:
    """The vocab.json of a model folder (or the file itself)."""
    path = Path(path)
    return ImageVocab.load(path if path.suffix == ".json" else _require(path, "vocabulary", ("vocab.json",)))


def load_image_lm(path: str | Path, dtype=torch.float32):
    """The `LlamaForCausalLM` saved in folder `path`, in eval mode."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    path = _require(path, "token model", ("config.json", "model.safetensors"))
    hf_logging.disable_progress_bar()
    return LlamaForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).eval()


@torch.no_grad()
def sample_codes(model, vocab: ImageVocab, prompts: list[str], *, temperature: float = 1.0, top_k: int | None = 100,
                 guidance: float = 3.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Plain ancestral sampling of grid*grid image codes per prompt, one token per forward pass, with
    classifier-free guidance (`uncond + guidance * (cond - uncond)` on the logits; guidance 1 is off).
    Only image codes are sampled (the special and word tokens are masked out). Returns int64 [B, grid, grid].

    A reference for the speculative decoders and for the model card, not a fast path."""
    if temperature <= 0:
        raise InvalidRequest("sample_codes samples; temperature must be > 0")
    cond = torch.stack([vocab.prompt_ids(p) for p in prompts])
    guided = guidance != 1.0
    ids = torch.cat([cond, vocab.uncond_ids().expand(len(prompts), -1)]) if guided else cond
    n, cache, out = len(prompts), None, []
    for _ in range(vocab.image_tokens):
        result = model(input_ids=ids, cache=cache, use_cache=True)
        cache = result.cache
        logits = result.logits[:, -1, :vocab.num_codes].float()
        if guided:
            logits = logits[n:] + guidance * (logits[:n] - logits[n:])
        logits = logits / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        token = torch.multinomial(logits.softmax(-1), 1, generator=generator)
        out.append(token)
        ids = torch.cat([token, token]) if guided else token
    return torch.cat(out, dim=1).reshape(n, vocab.grid, vocab.grid)
