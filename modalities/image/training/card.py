"""The image model card's figures: the VQ measured on held-out items (PSNR per source, codebook usage) with
`reconstructions.png`, and `samples.png` of the target's guided samples.

    python -m specgen.modalities.image.training.recipe --card assets/image
"""

from __future__ import annotations

from pathlib import Path


def _grid_png(rows: list, path: Path, scale: int = 2) -> None:
    """Rows of uint8 [N, 64, 64, 3] images as one PNG with 2 px gutters."""
    import numpy as np
    from PIL import Image

    gap = 2
    cols = max(len(r) for r in rows)
    h = len(rows) * (64 + gap) + gap
    w = cols * (64 + gap) + gap
    canvas = np.full((h, w, 3), 255, np.uint8)
    for i, row in enumerate(rows):
        for j, img in enumerate(row):
            y, x = gap + i * (64 + gap), gap + j * (64 + gap)
            canvas[y:y + 64, x:x + 64] = img
    Image.fromarray(canvas).resize((w * scale, h * scale), Image.NEAREST).save(path)
    path.chmod(0o644)


def card_figures(folder: Path, per_source: int = 64, sample_prompts: tuple[str, ...] | None = None,
                 seed: int = 0) -> dict:
    """Measure the VQ the target in folder/target reads (its own `vq/` where it carries one, else folder/vq) on
    held-out items (PSNR per source, codebook usage), write reconstructions.png, and, when folder/target exists,
    samples.png from plain guided ancestral sampling."""
    import numpy as np
    import torch
    from specgen.modalities.image.models import default_guidance, load_image_lm, load_image_vocab, sample_codes, vq_of
    from specgen.modalities.image.training.images import SOURCES, source_items
    from specgen.modalities.image.vq import decode, encode, load_vq, psnr

    folder = Path(folder)
    vq = load_vq(vq_of(folder / "target", default=folder / "vq"))
    report, used, rows = {}, set(), []
    for source in SOURCES:
        items = source_items(source, per_source, seed=seed, split="val")
        codes = encode(vq, items.images)
        recon = decode(vq, codes)
        used |= set(np.unique(codes.numpy()).tolist())
        report[f"psnr_{source}"] = round(psnr(recon, items.images), 2)
        rows += [items.images[:8], recon[:8]]
    report["codes_used"] = len(used)
    report["codes_used_of"] = vq.config.num_vq_embeddings
    report["held_out_items"] = per_source * len(SOURCES)
    _grid_png(rows, folder / "reconstructions.png")
    if (folder / "target" / "model.safetensors").exists():
        from specgen.modalities.image.conditions import EXAMPLE_PROMPTS

        from specgen.modalities.image.generator import DEFAULT_TOP_K

        prompts = list(sample_prompts or EXAMPLE_PROMPTS)
        model, vocab = load_image_lm(folder / "target"), load_image_vocab(folder / "target")
        g = torch.Generator().manual_seed(seed)
        guidance = default_guidance(folder / "target")  # the generator's defaults: what a user sees first
        images = [decode(vq, sample_codes(model, vocab, prompts, temperature=1.0, top_k=DEFAULT_TOP_K,
                                          guidance=guidance, generator=g)) for _ in range(4)]
        _grid_png([np.stack([im[k] for im in images]) for k in range(len(prompts))], folder / "samples.png")
        report["sample_prompts"] = prompts
    return report
