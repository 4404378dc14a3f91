"""How legible an image token model can be at best, per VQ tokenizer: the judge (modalities/image/judge.py) on true
renders of the quality prompts, as they are and encoded to codes and decoded by each VQ given, with PSNR of the
held-out items per source. A token model that put every code right would show the decoded renders, so these are
the tokenizer's ceiling, the first thing to compare VQ pilots by.

    python benchmarks/tokenizer_ceiling.py --vq assets/image/vq runs/vq-pilot/export \\
        --out benchmarks/image-tokenizer/ceiling-latest

Writes OUT.md and OUT.json. Needs Tesseract (the image-eval extra and tesseract-ocr).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np


def ceiling(vq_folders: list[str], prompts_path: Path, renders: int) -> dict:
    from specgen.modalities.image import judge
    from specgen.modalities.image.training.images import SOURCES, source_items
    from specgen.modalities.image.vq import load_vq, psnr, reconstruct

    prompts = [json.loads(line).get("prompt") for line in prompts_path.read_text().splitlines() if line.strip()]
    images, for_ask = [], []
    for prompt in filter(None, prompts):
        ask = judge.parse_prompt(prompt)
        if ask.char is None:
            continue  # scanned digits and photos have no true render
        for sample in range(renders):  # the renders `bench image --quality` judges for its ceiling
            images.append(judge.true_image(ask, judge.render_rng(prompt, sample)))
            for_ask.append(ask)
    images = np.stack(images)

    def scores(batch):
        return judge.summarise([judge.score_image(judge.judge_image(im), a) for im, a in zip(batch, for_ask)])

    held_out = {s: source_items(s, 64, seed=0, split="val").images for s in SOURCES}
    rows = {"true renders": {"judge": scores(images)}}
    for folder in vq_folders:
        vq = load_vq(folder)
        params = sum(p.numel() for p in vq.parameters())
        rows[folder] = {"judge": scores(reconstruct(vq, images)), "params": params,
                        "codes": int(vq.config.num_vq_embeddings), "code_dim": int(vq.config.vq_embed_dim),
                        "psnr": {s: round(psnr(items, reconstruct(vq, items)), 2) for s, items in held_out.items()}}
    return {"prompts": str(prompts_path), "renders_per_prompt": renders, "images": len(images), "rows": rows}


def markdown(result: dict, command: str) -> str:
    lines = ["# Image tokenizer ceilings", "", f"`{command}`", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {result['images']} true renders "
             f"({result['renders_per_prompt']} per glyph prompt of `{result['prompts']}`), read by the judge as they "
             "are and after encoding to codes and decoding; PSNR on 64 held-out items per source (val split).", "",
             "| | codes × dim | params | OCR case-folded | OCR strict | glyph colour | background colour | "
             "PSNR glyph / digit / photo |", "|---|---|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        j = row["judge"]
        size = f"{row['codes']} × {row['code_dim']}" if "codes" in row else "—"
        params = f"{row['params']:,}" if "params" in row else "—"
        db = " / ".join(f"{v:.1f}" for v in row["psnr"].values()) + " dB" if "psnr" in row else "—"
        lines.append(f"| `{name}` | {size} | {params} | {j['ocr_folded']:.2f} | {j['ocr_strict']:.2f} | "
                     f"{j['fg']:.2f} | {j['bg']:.2f} | {db} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vq", nargs="+", required=True, help="VQ folders (config.json and weights)")
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/image-quality.jsonl"))
    parser.add_argument("--renders", type=int, default=4, help="true renders per glyph prompt (default 4)")
    parser.add_argument("--out", type=Path, required=True, help="OUT.md and OUT.json are written")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    write_outputs(args.out, ceiling(args.vq, args.prompts, args.renders), markdown, "tokenizer_ceiling.py", argv)
    return 0


def write_outputs(out: Path, result: dict, markdown, script: str, argv: list[str] | None) -> None:
    """OUT.json (the result and the command that made it) and OUT.md (`markdown(result, command)`), printed."""
    command = f"python benchmarks/{script} " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({**result, "command": command}, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result, command))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    sys.exit(main())
