"""The image tokenizer's training step (role vq): a VQ autoencoder over the 64×64 images of `images.py`.

Each step reconstructs a batch through the codebook; codes left unused are restarted on encoder outputs, so the
whole codebook stays in use. The loop that runs it is `recipe.py`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specgen.modalities.image.training.recipe import TrainConfig


class VQTask:
    """Reconstruction (L1 + MSE in [-1, 1]) plus the VQ commitment/codebook loss, with dead-code resets."""

    def __init__(self, cfg: TrainConfig):
        from specgen.modalities.image.training.images import SOURCES, source_items
        from specgen.modalities.image.vq import build_vq

        self.cfg = cfg
        self.model = build_vq(**cfg.extra.get("vq_overrides", {}))
        self.num_codes = self.model.config.num_vq_embeddings
        self.usage = [0] * self.num_codes  # code counts since the last reset check
        self.eval_sets = {s: source_items(s, cfg.eval_images // 3 or 1, seed=cfg.seed) for s in SOURCES}

    def batch(self, step: int):
        from specgen.modalities.image.training.images import make_dataset
        from specgen.modalities.image.vq import to_tensor

        b = self.cfg.batch_size
        return to_tensor(make_dataset(b, seed=self.cfg.seed, start=step * b).images)

    def loss(self, x, step: int):
        import torch
        import torch.nn.functional as F

        vq = self.model
        h = vq.encode(x).latents
        if step == 0:  # start the codebook on encoder outputs: the default tiny init leaves most codes unused
            self._reset_dead_codes(h.detach(), step, codes=list(range(self.num_codes)))
        quant, commit, (_, _, idx) = vq.quantize(h)
        recon = vq.decode(quant, force_not_quantize=True).sample
        counts = torch.bincount(idx.reshape(-1), minlength=self.num_codes).tolist()
        self.usage = [u + c for u, c in zip(self.usage, counts)]
        if self.cfg.reset_every and (step + 1) % self.cfg.reset_every == 0:
            self._reset_dead_codes(h.detach(), step)
        return F.l1_loss(recon, x) + F.mse_loss(recon, x) + commit.mean()

    def _reset_dead_codes(self, h, step: int, codes: list[int] | None = None) -> None:
        """Codes unused since the last check restart on random encoder outputs, so the codebook stays in use."""
        import torch

        dead = [k for k, u in enumerate(self.usage) if u == 0] if codes is None else codes
        if codes is None:
            self.state_update = {"dead_codes_reset": len(dead)}
        if dead:
            flat = h.permute(0, 2, 3, 1).reshape(-1, h.shape[1])
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
            pick = torch.randint(0, len(flat), (len(dead),), generator=g)
            with torch.no_grad():
                self.model.quantize.embedding.weight[dead] = flat[pick]
        self.usage = [0] * self.num_codes

    def evaluate(self) -> dict:
        import numpy as np
        from specgen.modalities.image.vq import encode, psnr, reconstruct

        self.model.eval()
        out, used = {}, set()
        for source, items in self.eval_sets.items():
            out[f"psnr_{source}"] = round(psnr(reconstruct(self.model, items.images), items.images), 3)
            used |= set(np.unique(encode(self.model, items.images).numpy()).tolist())
        self.model.train()
        out["eval_codes_used"] = len(used)
        out["eval_psnr"] = round(float(np.mean([out[f"psnr_{s}"] for s in self.eval_sets])), 3)
        return out

    def state(self) -> dict:
        return {"usage": self.usage}

    def load_state(self, state: dict) -> None:
        self.usage = list(state["usage"])

    def export(self, out: Path) -> None:
        from specgen.modalities.image.vq import save_vq

        save_vq(self.model, out)
