"""The image and video token models' training step (roles target, draft, video): next-token loss on the VQ
codes of the training images or clips, conditioned on their prompt or class, or on nothing (for guidance).

The training items are encoded once with the shipped VQ into the run folder's token cache. The loop that runs
the step is `recipe.py`'s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from specgen.errors import InvalidRequest
from specgen.modalities.training import atomic_write, export_fp16, file_sha256, write_npz

if TYPE_CHECKING:
    from specgen.modalities.image.conditions import ImageVocab
    from specgen.modalities.image.training.recipe import TrainConfig


def default_vocab(num_codes: int = 512, grid: int = 16) -> "ImageVocab":
    """The vocabulary of the data set in `images.py`: every word its prompts and classes use."""
    from specgen.modalities.image.conditions import ImageVocab
    from specgen.modalities.image.training.images import CHARACTERS, PALETTE, PHOTOS

    words = ["digit", "photo", "of", "on", *PALETTE, *CHARACTERS, *PHOTOS]
    # "green digit 3 on black" is the longest prompt (5 words)
    return ImageVocab(num_codes=num_codes, words=tuple(dict.fromkeys(words)), prefix_length=5, grid=grid)


def video_vocab(num_codes: int = 512, grid: int = 16) -> "ImageVocab":
    """The vocabulary of the clips in `clips.py`: the image words (same ids, so an image model's embedding carries
    over) followed by the motion words, one more condition slot, and `clips.FRAMES` frames."""
    from specgen.modalities.image.conditions import ImageVocab
    from specgen.modalities.image.training import clips

    image = default_vocab(num_codes, grid)
    words = tuple(dict.fromkeys([*image.words, "moving", *clips.MOTIONS]))
    # "green Q moving left on white" is the longest prompt (6 words)
    return ImageVocab(num_codes=num_codes, words=words, prefix_length=6, grid=grid, frames=clips.FRAMES)


def _items(kind: str, n: int, seed: int, split: str, start: int, style: str = "varied"):
    """(frames uint8 [n * frames, 64, 64, 3], prompts, classes) of images or clips start .. start+n-1."""
    from specgen.modalities.image.training.clips import make_clips
    from specgen.modalities.image.training.images import make_dataset

    if kind == "video":
        clips = make_clips(n, seed=seed, split=split, start=start, style=style)
        return clips.clips.reshape(-1, *clips.clips.shape[2:]), clips.prompts, clips.classes
    items = make_dataset(n, seed=seed, split=split, start=start, style=style)
    return items.images, items.prompts, items.classes


def token_cache(run_dir: Path, vq_path: Path, num_images: int, eval_images: int, seed: int,
                kind: str = "image", style: str = "varied") -> dict:
    """Training and held-out images (or clips, kind "video") encoded once with the VQ at vq_path, cached in
    run_dir/tokens.npz (rebuilt when the VQ weights, the counts, the kind, the glyph style or the seed change)."""
    import numpy as np
    from specgen.modalities.image.vq import encode, load_vq
    from tqdm import tqdm

    weights = vq_path / "diffusion_pytorch_model.safetensors"
    vq = load_vq(vq_path)
    key = {"vq_sha256": file_sha256(weights), "num_images": num_images, "eval_images": eval_images, "seed": seed}
    if kind != "image":
        key["kind"] = kind
    if style != "varied":
        key["glyph_style"] = style
    path, meta = run_dir / "tokens.npz", run_dir / "tokens.json"
    if path.exists() and meta.exists() and json.loads(meta.read_text()) == key:
        blob = np.load(path)
        return {k: blob[k] for k in blob.files} | {"vq": vq}
    out = {}
    chunk = 1000 if kind == "image" else 125
    for split, n in (("train", num_images), ("val", eval_images)):
        codes, prompts, classes = [], [], []
        for start in tqdm(range(0, n, chunk), desc=f"encode {split} {kind}", file=sys.stderr, leave=False):
            frames, chunk_prompts, chunk_classes = _items(kind, min(chunk, n - start), seed, split, start, style)
            codes.append(encode(vq, frames).reshape(len(chunk_prompts), -1).numpy().astype(np.uint16))
            prompts += chunk_prompts
            classes += chunk_classes
        out[f"{split}_codes"] = np.concatenate(codes)
        out[f"{split}_prompts"] = np.array(prompts)
        out[f"{split}_classes"] = np.array(classes)
    write_npz(path, out)
    atomic_write(meta, lambda p: p.write_text(json.dumps(key)))
    return out | {"vq": vq}


def code_loss(model, vocab: "ImageVocab", ids):
    """Mean cross-entropy (nats per code) of the image codes of ids [B, prompt_length + codes] under `model`."""
    import torch.nn.functional as F

    start = vocab.prompt_length  # first image code position
    logits = model(input_ids=ids[:, :-1]).logits[:, start - 1:]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, start:].reshape(-1))


def mean_code_loss(model, vocab: "ImageVocab", ids, batch_size: int = 16) -> float:
    """code_loss over ids in batches of batch_size (call under no_grad)."""
    return sum(code_loss(model, vocab, ids[i:i + batch_size]).item() * len(ids[i:i + batch_size])
               for i in range(0, len(ids), batch_size)) / len(ids)


def swap_characters(prompts: list[str]) -> tuple[list[int], list[str]]:
    """The indices of the glyph prompts ("red K on blue") and each of them with the character of the next glyph
    prompt that asks for another character, in its own colours ("red g on blue"): the same pictures described
    with the wrong letter, to measure how much a model's loss depends on the letter (`char_gain`)."""
    glyphs = [i for i, p in enumerate(prompts) if len(p.split()) == 4 and p.split()[2] == "on"]
    chars = [prompts[i].split()[1] for i in glyphs]
    swapped = []
    for k, i in enumerate(glyphs):
        other = next((c for c in chars[k + 1:] + chars[:k] if c != chars[k]), chars[k])
        fg, _, on, bg = prompts[i].split()
        swapped.append(f"{fg} {other} {on} {bg}")
    return glyphs, swapped


def start_from(model, path: Path) -> None:
    """Copy the weights of the token model at `path` into `model` (same layer shapes): the vocabulary of `model`
    may extend it (ids kept, new words appended), whose new embedding and head rows keep their fresh init."""
    import torch
    from specgen.modalities.image.models import load_image_lm

    source = load_image_lm(path).float().state_dict()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            old = source.get(name)
            if old is None or old.shape[1:] != tensor.shape[1:] or old.shape[0] > tensor.shape[0]:
                raise InvalidRequest(f"cannot start from {str(path)!r}: its {name} has shape "
                                     f"{tuple(old.shape) if old is not None else None}, this model's {tuple(tensor.shape)}")
            tensor[:old.shape[0]] = old


class LMTask:
    """Next-token loss on the 256 image codes of [BOS, condition, BOI, codes]; the condition is the full prompt,
    or (class_prompt of rows) the class alone, or (cond_dropout of rows) all NULL so guidance has an
    unconditional model to contrast with."""

    def __init__(self, cfg: TrainConfig):
        from specgen.modalities.image.models import build_image_lm, default_paths

        self.cfg = cfg
        vq_path = Path(cfg.vq_path) if cfg.vq_path else default_paths()["vq"]
        if not (vq_path / "config.json").exists():
            from specgen.errors import ModelNotFound

            raise ModelNotFound(f"the {cfg.role} trains on codes of the VQ in {str(vq_path)!r}, which is missing; "
                                "train it first (--role vq --out that folder) or pass --vq")
        kind = "video" if cfg.role == "video" else "image"
        self.vq_path = vq_path
        self.vq_sha256 = file_sha256(vq_path / "diffusion_pytorch_model.safetensors")  # recorded with the model
        self.tokens = token_cache(Path(cfg.run_dir), vq_path, cfg.num_images, cfg.eval_images, cfg.seed, kind,
                                  cfg.extra.get("glyph_style", "varied"))
        make_vocab = video_vocab if kind == "video" else default_vocab
        self.vocab = make_vocab(num_codes=self.tokens["vq"].config.num_vq_embeddings)
        self.model = build_image_lm(cfg.role, self.vocab)
        if cfg.init_from:
            start_from(self.model, Path(cfg.init_from))
        # Condition ids per distinct prompt and class string, computed once.
        self._cond = {s: self.vocab.prompt_ids(s).tolist() for s in set(self.tokens["train_prompts"].tolist())
                      | set(self.tokens["train_classes"].tolist()) | set(self.tokens["val_prompts"].tolist())}
        self.eval_batch = self._sequences(self.tokens["val_codes"], self.tokens["val_prompts"].tolist())
        self.glyph_batches = self._glyph_eval(self.tokens["val_codes"], self.tokens["val_prompts"].tolist())

    def _sequences(self, codes, conditions: list):
        """int64 [B, prompt_length + 256]; a condition of None means the unconditional prefix."""
        import numpy as np
        import torch

        v = self.vocab
        prefix = [v.uncond_ids().tolist() if c is None else self._cond[c] for c in conditions]
        return torch.from_numpy(np.concatenate([np.array(prefix, np.int64), codes.astype(np.int64)], axis=1))

    def batch(self, step: int):
        import numpy as np

        cfg = self.cfg
        rng = np.random.default_rng((cfg.seed, step))
        idx = rng.integers(0, len(self.tokens["train_codes"]), size=cfg.batch_size)
        r = rng.random(cfg.batch_size)
        conds = [None if u < cfg.cond_dropout else
                 str(self.tokens["train_classes"][i]) if u < cfg.cond_dropout + cfg.class_prompt else
                 str(self.tokens["train_prompts"][i]) for i, u in zip(idx, r)]
        return self._sequences(self.tokens["train_codes"][idx], conds)

    def loss(self, ids, step: int = 0):
        return code_loss(self.model, self.vocab, ids)

    def _glyph_eval(self, codes, prompts: list):
        """The held-out glyph images under their own prompts and under `swap_characters`' (None for clips, or with
        under two glyph prompts): the loss gap between the two is what the model has learnt of letter shapes."""
        glyphs, swapped = swap_characters(prompts)
        if len(glyphs) < 2 or self.vocab.frames > 1:
            return None
        for prompt in swapped:
            self._cond.setdefault(prompt, self.vocab.prompt_ids(prompt).tolist())
        return (self._sequences(codes[glyphs], [prompts[i] for i in glyphs]), self._sequences(codes[glyphs], swapped))

    def _mean_loss(self, batch) -> float:
        return mean_code_loss(self.model, self.vocab, batch, self.cfg.batch_size)

    def evaluate(self) -> dict:
        """The held-out loss (nats per code) and, for images, `char_gain`: how much lower the held-out glyphs' loss is
        under their own character than under another's in the same colours (0: the model ignores the character)."""
        import torch

        self.model.eval()
        with torch.no_grad():
            out = {"eval_loss": round(self._mean_loss(self.eval_batch), 4)}
            if self.glyph_batches is not None:
                own, other = (self._mean_loss(batch) for batch in self.glyph_batches)
                out["char_gain"] = round(other - own, 4)
        self.model.train()
        return out

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def export(self, out: Path) -> None:
        """The model in fp16 with its vocabulary, and a copy of its VQ in out/vq where that is not the shipped VQ
        (a model folder then decodes with the tokenizer it was trained on wherever it goes)."""
        import shutil

        from specgen.modalities.image.models import default_paths

        shipped = default_paths()["vq"] / "diffusion_pytorch_model.safetensors"
        own = not shipped.exists() or file_sha256(shipped) != self.vq_sha256

        def add_files(tmp: Path) -> None:
            self.vocab.save(tmp / "vocab.json")
            if own:
                shutil.copytree(self.vq_path, tmp / "vq", ignore=shutil.ignore_patterns("*.tmp"))

        export_fp16(self.model, out, add_files)
