"""Online speculative decoding (OSD, arXiv 2310.07177) on a domain shift: does updating the draft while serving
raise its acceptance?

    python benchmarks/distill_osd.py [--prompts 300] [--max-new-tokens 48] [--arms frozen,wrong,all]
                                     [--threads 1] [--out-dir benchmarks]

The shipped code pair (assets/code) was trained on Python standard-library code; the stream is English prose
(fortune cookies from /usr/share/games/fortunes, else paragraphs of /usr/share/common-licenses). Every arm serves
the same prompts in the same order, greedy, starting from a fresh copy of the shipped draft:
  frozen    the draft as shipped
  wrong     OSD: every 8 requests, one AdamW step of forward KL at the target-emitted positions
  all       the ablation: the same at every generated position
  wrong-i1  OSD updating after every request
Reports the mean per-request α̂ over the last 100 prompts, its difference vs frozen with a paired bootstrap 95 %
interval over prompts, updates and wall time. Writes distill-osd-<UTC>.{json,md,png} and distill-osd-latest.*.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# this folder holds kernels.py, which would shadow the `kernels` package transformers looks for
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import json
import platform
import random
import re
import shlex
import shutil
import time
from datetime import datetime, timezone

import numpy as np
import torch

ARMS = {  # name: OnlineDistiller settings (None: frozen draft)
    "frozen": None,
    "wrong": {"positions": "wrong", "interval": 8},
    "all": {"positions": "all", "interval": 8},
    "wrong-i1": {"positions": "wrong", "interval": 1},
}
FORTUNES, LICENSES = Path("/usr/share/games/fortunes"), Path("/usr/share/common-licenses")
PROMPT_TOKENS, LAST, WINDOW, TARGET_GAIN, RESAMPLES, SEED = 24, 100, 25, 0.05, 10000, 0


# ---- the prompt stream ---------------------------------------------------------------------------------------------

def _prose(text: str) -> str | None:
    """One passage as a single line of prose, or None for art, tables, non-ASCII or a length outside 40-300."""
    text = " ".join(text.split())
    if not 40 <= len(text) <= 300 or not text.isascii():
        return None
    letters = sum(c.isalpha() or c == " " for c in text)
    return text if letters >= 0.8 * len(text) else None


def load_passages() -> tuple[list[str], str]:
    """Every usable passage (sorted files, file order) and a note on the source."""
    if FORTUNES.is_dir():
        files, separator = sorted(f for f in FORTUNES.iterdir() if f.is_file() and not f.suffix), r"^%$"
        source = f"fortune cookies from {FORTUNES}"
    else:
        files, separator = sorted(f for f in LICENSES.iterdir() if f.is_file()), r"\n\s*\n"
        source = f"{FORTUNES} is missing: FALLBACK to paragraphs of {LICENSES}"
    passages, seen = [], set()
    for path in files:
        for chunk in re.split(separator, path.read_text(encoding="utf-8", errors="replace"), flags=re.MULTILINE):
            text = _prose(chunk)
            if text and text not in seen:
                seen.add(text)
                passages.append(text)
    return passages, source


def make_prompts(tokenizer, count: int) -> tuple[list[str], str, int]:
    """`count` prompts: the first PROMPT_TOKENS tokens of passages in a seeded shuffled order."""
    passages, source = load_passages()
    random.Random(SEED).shuffle(passages)
    if len(passages) < count:
        raise SystemExit(f"only {len(passages)} passages in {source}; ask for fewer --prompts")
    prompts = [tokenizer.decode(tokenizer(p, add_special_tokens=False)["input_ids"][:PROMPT_TOKENS]).strip()
               for p in passages[:count]]
    return prompts, source, len(passages)


# ---- statistics ----------------------------------------------------------------------------------------------------

def _alphas(items: list[dict]) -> np.ndarray:
    """[requests] per-request α̂ (nan where nothing was tested)."""
    return np.array([np.nan if i["alpha_hat"] is None else i["alpha_hat"] for i in items], dtype=float)


def paired_gain(arm: np.ndarray, frozen: np.ndarray) -> tuple[float, list[float]]:
    """Mean of arm - frozen over the prompts both tested, and a bootstrap 95 % interval resampling prompts."""
    diff = (arm - frozen)[~(np.isnan(arm) | np.isnan(frozen))]
    rng = np.random.default_rng(SEED)
    means = diff[rng.integers(0, len(diff), size=(RESAMPLES, len(diff)))].mean(1)
    return float(diff.mean()), [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` requests (fewer at the start), ignoring nan."""
    return np.array([np.nanmean(values[max(0, i + 1 - window):i + 1]) for i in range(len(values))])


def summarise(arms: dict[str, dict]) -> None:
    """Adds a summary to every arm (in place)."""
    frozen = _alphas(arms["frozen"]["requests"]) if "frozen" in arms else None
    for name, arm in arms.items():
        alphas, items = _alphas(arm["requests"]), arm["requests"]
        last = slice(-LAST, None)
        summary = {"alpha_last": float(np.nanmean(alphas[last])), "alpha_first": float(np.nanmean(alphas[:LAST])),
                   "alpha_all": float(np.nanmean(alphas)),
                   "tau_last": float(np.mean([i["tau"] for i in items[last]])),
                   "gain_vs_frozen": None, "gain_ci95": None, "target_met": None}
        if frozen is not None and name != "frozen":
            gain, ci = paired_gain(alphas[last], frozen[last])
            summary.update(gain_vs_frozen=gain, gain_ci95=ci, target_met=gain >= TARGET_GAIN)
        arm["summary"] = summary


# ---- outputs -------------------------------------------------------------------------------------------------------

def render_markdown(result: dict, plot_name: str) -> str:
    s = result["setting"]
    lines = ["# Online speculative decoding on a domain shift", "",
             f"Command: `{result['command']}`", "",
             f"Setting: shipped code pair (target {s['target']}, draft {s['draft']}); stream: {s['prompt_source']} "
             f"({s['prompts']} of {s['passages']} passages of 40-300 characters, seeded shuffle {SEED}, first "
             f"{PROMPT_TOKENS} tokens as the prompt); greedy, {s['max_new_tokens']} new tokens, γ = "
             f"{s['num_draft_tokens']}; updates: one AdamW step (lr {s['lr']}, weight decay 0) of forward "
             f"KL(target‖draft) on the buffered positions, on the logits predicting each trained token; every arm "
             f"starts from a fresh copy of the shipped draft; {s['threads']} thread(s) on {s['cpu']}.", "",
             f"α̂ per request = accepted / (accepted + rejections); means over requests. Gain = α̂(arm) − α̂(frozen) "
             f"over the last {LAST} prompts, paired bootstrap 95 % interval ({RESAMPLES} resamples of prompts).", "",
             f"| arm | α̂ first {LAST} | α̂ last {LAST} | gain vs frozen (95 % CI) | τ last {LAST} | updates | "
             f"last loss | update time | wall |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, arm in result["arms"].items():
        m = arm["summary"]
        gain = "—" if m["gain_vs_frozen"] is None else \
            f"{m['gain_vs_frozen']:+.3f} [{m['gain_ci95'][0]:+.3f}, {m['gain_ci95'][1]:+.3f}]"
        loss = "—" if arm["last_loss"] is None else f"{arm['last_loss']:.3f}"
        lines.append(f"| {name} | {m['alpha_first']:.3f} | {m['alpha_last']:.3f} | {gain} | {m['tau_last']:.2f} | "
                     f"{arm['updates']} | {loss} | {arm['update_s']:.1f} s | {arm['wall_s']:.0f} s |")
    same = "the same" if result["same_outputs"] else "NOT the same"
    lines += ["", f"Lossless check (greedy output does not depend on the draft): every arm generated {same} tokens "
              "for every prompt.", "",
              f"Target: α̂ over the last {LAST} prompts ≥ frozen + {TARGET_GAIN}."]
    for name, arm in result["arms"].items():
        m = arm["summary"]
        if m["target_met"] is not None:
            excludes = "excludes" if m["gain_ci95"][0] > 0 else "does not exclude"
            lines.append(f"- `{name}`: {'**met**' if m['target_met'] else '**not met**'} (gain "
                         f"{m['gain_vs_frozen']:+.3f}; the interval {excludes} 0)")
    lines += ["", f"![moving average of α̂ (window {WINDOW})]({plot_name})", ""]
    return "\n".join(lines)


def plot_png(path: Path, arms: dict[str, dict]) -> None:
    """Moving average (window WINDOW) of α̂ over the stream, one line per arm. Pillow: matplotlib is no dependency."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=15)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        font = ImageFont.load_default()
    curves = {name: moving_average(_alphas(arm["requests"]), WINDOW) for name, arm in arms.items()}
    width, height, left, right, top, bottom = 1000, 560, 70, 160, 50, 60
    low = np.floor(min(np.nanmin(c) for c in curves.values()) * 20) / 20
    high = np.ceil(max(np.nanmax(c) for c in curves.values()) * 20) / 20
    count = max(len(c) for c in curves.values())
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)

    def xy(i: float, value: float) -> tuple[float, float]:
        return (left + i / max(count - 1, 1) * (width - left - right),
                height - bottom - (value - low) / max(high - low, 1e-9) * (height - top - bottom))

    draw.text((10, 12), f"alpha-hat per request, trailing mean over {WINDOW} requests", fill="black", font=font)
    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    for tick in np.arange(low, high + 1e-9, 0.05):
        y = xy(0, tick)[1]
        draw.line([left - 4, y, width - right, y], fill=(225, 225, 225))
        draw.text((10, y - 8), f"{tick:.2f}", fill="black", font=font)
    for tick in range(0, count + 1, 50):
        x = xy(tick, low)[0]
        draw.text((x - 10, height - bottom + 8), str(tick), fill="black", font=font)
    draw.text(((width - right) / 2, height - 25), "request", fill="black", font=font)
    palette = [(60, 60, 60), (31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]
    for k, (name, curve) in enumerate(curves.items()):
        points = [xy(i, v) for i, v in enumerate(curve) if not np.isnan(v)]
        draw.line(points, fill=palette[k % len(palette)], width=2)
        draw.text((width - right + 12, top + 10 + 22 * k), name, fill=palette[k % len(palette)], font=font)
    draw.line([xy(count - LAST, low)[0], top, xy(count - LAST, low)[0], height - bottom], fill=(180, 180, 180))
    image.save(path)


# ---- the run -------------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--arms", default="frozen,wrong,all", help=f"comma-separated, from {', '.join(ARMS)}")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--out-dir", type=Path, default=HERE)
    args = parser.parse_args()
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not names or any(n not in ARMS for n in names):
        parser.error(f"--arms takes names from {', '.join(ARMS)}")
    if args.prompts < LAST:
        parser.error(f"--prompts must be at least {LAST}")
    from specgen.modalities.text.training.distill.online import OnlineDistiller, run_stream
    from specgen.modalities.text.generator import TextGenerator

    torch.manual_seed(SEED)
    generator = TextGenerator(threads=args.threads)
    shipped = {k: v.clone() for k, v in generator.draft_model.state_dict().items()}
    prompts, source, passages = make_prompts(generator.tokenizer, args.prompts)
    print(f"{len(prompts)} prompts from {source}", file=sys.stderr)

    arms = {}
    for name in names:
        generator.draft_model.load_state_dict(shipped)  # every arm starts from the shipped draft
        online = None if ARMS[name] is None else OnlineDistiller(generator.draft_model, generator.model,
                                                                 lr=args.lr, **ARMS[name])
        started = time.perf_counter()
        requests = run_stream(generator, prompts, online=online, max_new_tokens=args.max_new_tokens,
                              num_draft_tokens=args.num_draft_tokens, desc=name)
        arms[name] = {"settings": ARMS[name], "requests": requests, "wall_s": time.perf_counter() - started,
                      "updates": online.updates if online else 0, "update_s": online.update_s if online else 0.0,
                      "last_loss": online.loss if online else None}
    generator.draft_model.load_state_dict(shipped)
    summarise(arms)

    count = lambda model: sum(p.numel() for p in model.parameters())
    result = {
        "command": shlex.join(["python", "benchmarks/distill_osd.py", *sys.argv[1:]]),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "setting": {"target": f"assets/code/target ({count(generator.model) / 1e6:.1f}M)",
                    "draft": f"assets/code/draft ({count(generator.draft_model) / 1e6:.2f}M)",
                    "prompt_source": source, "passages": passages, "prompts": len(prompts),
                    "prompt_tokens": PROMPT_TOKENS, "max_new_tokens": args.max_new_tokens,
                    "num_draft_tokens": args.num_draft_tokens, "temperature": 0.0, "lr": args.lr,
                    "threads": args.threads, "cpu": platform.processor() or platform.machine(),
                    "torch": torch.__version__, "last": LAST, "window": WINDOW, "target_gain": TARGET_GAIN},
        "same_outputs": len({tuple(i["output_sha256"] for i in arm["requests"]) for arm in arms.values()}) == 1,
        "prompts": prompts,
        "arms": arms,
    }
    out_dir = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    stem = out_dir / f"distill-osd-{stamp}"
    plot_png(stem.with_suffix(".png"), arms)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(render_markdown(result, stem.with_suffix(".png").name))
    for ext in ("json", "png"):
        shutil.copyfile(stem.with_suffix(f".{ext}"), out_dir / f"distill-osd-latest.{ext}")
    (out_dir / "distill-osd-latest.md").write_text(render_markdown(result, "distill-osd-latest.png"))
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
