"""Compare image token models (pilots) by what they have learnt of letters: the held-out glyphs' loss under their own
character against another's (`char_gain`, nats per code; 0 = the model ignores the letter), and the independent
judge (modalities/image/judge.py) on plain samples of the quality prompts beside its ceilings for the model's glyph
style (true renders as drawn, and through the model's VQ).

    python benchmarks/token_model_pilots.py --model assets/image/target runs/pilot-a/export runs/pilot-b/export \\
        --out benchmarks/image-token-model/pilots-latest

Each model decodes with its own VQ (the one its folder carries, else the shipped one) and is judged on renders in
the glyph style it was trained on (its training.json). Samples are `ar` at the defaults (temperature 1, top-k 50,
guidance 3), seeds 0 .. --seeds - 1. Writes OUT.md and OUT.json. Needs Tesseract (the image-eval extra and
tesseract-ocr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tokenizer_ceiling import write_outputs  # the sibling script (run from benchmarks/)


def char_gain(generator, style: str, items: int) -> dict:
    """Teacher-forced loss of the glyphs among `items` held-out items (val split, the model's glyph style, encoded
    with its VQ) under their own prompts and under swapped characters."""
    import torch

    from specgen.modalities.image.training.images import make_dataset
    from specgen.modalities.image.training.token_models import mean_code_loss, swap_characters
    from specgen.modalities.image.vq import encode

    data = make_dataset(items, split="val", style=style)
    glyphs, swapped = swap_characters(data.prompts)
    codes = encode(generator.vq, data.images[glyphs]).reshape(len(glyphs), -1).long()

    def loss(prompts):
        prefix = torch.stack([generator.vocab.prompt_ids(p) for p in prompts])
        with torch.no_grad():
            return mean_code_loss(generator.model, generator.vocab, torch.cat([prefix, codes], 1))

    own, other = loss([data.prompts[i] for i in glyphs]), loss(swapped)
    return {"glyphs": len(glyphs), "own": round(own, 4), "swapped": round(other, 4), "char_gain": round(other - own, 4)}


def judge_model(generator, style: str, prompts: list[str], seeds: int, renders: int) -> dict:
    """The judge on `ar` samples of every prompt, and its ceilings (`bench image --quality`'s true renders in the
    model's style, as drawn and through its VQ)."""
    import numpy as np

    from specgen.app.bench.image import ceiling_scores
    from specgen.modalities.image import judge

    samples = []
    for prompt in prompts:
        for seed in range(seeds):
            image = np.asarray(generator.generate(prompt, method="ar", seed=seed).image)
            samples.append(judge.score_image(judge.judge_image(image), judge.parse_prompt(prompt)))
    ceiling, coded = ceiling_scores(prompts, 1, generator.vq, style, renders)
    return {"ar": judge.summarise(samples), "true renders": judge.summarise(ceiling),
            "through the VQ": judge.summarise(coded)}


def compare(models: list[str], prompts_path: Path, seeds: int, renders: int, items: int) -> dict:
    from tqdm import tqdm

    from specgen.modalities.image import judge
    from specgen.modalities.image.generator import ImageGenerator
    from specgen.modalities.image.models import glyph_style_of, training_record

    judge.require_tesseract()
    prompts = [json.loads(line)["prompt"] for line in prompts_path.read_text().splitlines() if line.strip()]
    rows = {}
    for folder in tqdm(models, desc="models", file=sys.stderr):
        generator = ImageGenerator(folder, threads=None)
        style = glyph_style_of(folder)
        record = training_record(folder)
        rows[folder] = {"style": style, "vq": str(generator.vq_path), "steps": record.get("steps"),
                        "batch_size": record.get("batch_size"), "eval_loss": record.get("eval", {}).get("eval_loss"),
                        **char_gain(generator, style, items), **judge_model(generator, style, prompts, seeds, renders)}
    return {"prompts": str(prompts_path), "seeds": seeds, "renders_per_prompt": renders, "held_out_items": items,
            "rows": rows}


def markdown(result: dict, command: str) -> str:
    lines = ["# Image token model pilots", "", f"`{command}`", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. `char_gain`: held-out glyphs' loss under another "
             "character minus under their own (nats per code; 0 = the letter is ignored). The judge on `ar` samples "
             f"of `{result['prompts']}` (seeds 0–{result['seeds'] - 1}, temperature 1, top-k 50, guidance 3), beside "
             f"its ceilings on {result['renders_per_prompt']} true renders per prompt in the model's glyph style.", "",
             "| model | style | steps × batch | eval loss | char_gain | OCR case-folded (strict) | glyph colour | "
             "background | ceiling: true renders / through the VQ (OCR; glyph colour) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        ar, true, coded = row["ar"], row["true renders"], row["through the VQ"]
        lines.append(f"| `{name}` | {row['style']} | {row['steps']} × {row['batch_size']} | {row['eval_loss']} | "
                     f"{row['char_gain']:.3f} | {ar['ocr_folded']:.2f} ({ar['ocr_strict']:.2f}) | {ar['fg']:.2f} | "
                     f"{ar['bg']:.2f} | {true['ocr_folded']:.2f} / {coded['ocr_folded']:.2f}; "
                     f"{true['fg']:.2f} / {coded['fg']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", required=True, help="image token model folders")
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/image-quality.jsonl"))
    parser.add_argument("--seeds", type=int, default=2, help="ar samples per prompt (default 2)")
    parser.add_argument("--renders", type=int, default=4, help="true renders per glyph prompt (default 4)")
    parser.add_argument("--items", type=int, default=200, help="held-out items for char_gain (default 200)")
    parser.add_argument("--out", type=Path, required=True, help="OUT.md and OUT.json are written")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    write_outputs(args.out, compare(args.model, args.prompts, args.seeds, args.renders, args.items), markdown,
                  "token_model_pilots.py", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
