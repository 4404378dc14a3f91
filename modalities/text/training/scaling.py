"""Scylla (S18): how a draft's acceptance grows with its size N and its pretraining tokens D, on the code pair.

    python -m specgen.modalities.text.training.scaling --run-dir runs/scaling      # train, evaluate, fit, report

Drafts of the shipped shape (2 layers, heads of 32, MLP 3x, tied embeddings) at several widths N are pretrained on
the standard-library corpus the target learnt from, one run from scratch per (N, D) with the shipped draft's
recipe (AdamW, peak lr 2e-3, linear warm-up, cosine to 10 %, windows of 8 x 256 tokens), D = steps x 2,048 tokens.
(One run per width with checkpoints at each D is cheaper, but at a constant peak lr the wider drafts' later
checkpoints got worse, and a checkpoint mid-schedule is not a draft trained to D.)

Each point is the draft's acceptance against the target on held-out target samples (validation prompts,
8,192 positions, `distill.agreement`): α = Σ min(target, draft) at temperature 1 and the greedy agreement. The
fitted law is Scylla's log-linear form, α ≈ a + b·ln N + c·ln D, fitted on the `widths` and judged on the
`heldout_widths`, which it never saw. Every run folder checkpoints every few minutes and a killed sweep resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

QUANTITIES = ("alpha", "greedy_agreement")


@dataclass(frozen=True)
class SweepConfig:
    run_dir: str | Path
    widths: tuple[int, ...] = (32, 64, 128, 192)  # fitted
    heldout_widths: tuple[int, ...] = (48, 96)  # predicted by the fit, never fitted
    layers: int = 2
    checkpoints: tuple[int, ...] = (100, 200, 400, 800)  # optimizer steps of the runs: D = steps x batch x seq
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 50
    seed: int = 0
    threads: int = 1
    checkpoint_minutes: float = 5.0

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


def draft_fields(width: int, layers: int) -> dict:
    """LlamaConfig fields of a draft of the shipped shape `width` wide: heads of 32 (one for narrower), MLP 3x."""
    heads = max(1, width // 32)
    if width % heads or (width // heads) % 2:
        raise ValueError(f"width {width} does not split into heads of an even size")
    return dict(hidden_size=width, intermediate_size=3 * width, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=heads, head_dim=width // heads, tie_word_embeddings=True)


# ---- training ----------------------------------------------------------------------------------------------------

def train_point(cfg: SweepConfig, width: int, steps: int, data: dict, heldout) -> dict:
    """One draft `width` wide trained for `steps` steps from scratch (resumed from its folder), measured."""
    import torch

    from specgen.modalities.text.models import build_model
    from specgen.modalities.text.training.code_models import _batch, _loss, _optimizer
    from specgen.modalities.text.training.distill.agreement import teacher_forced
    from specgen.modalities.training import LoopSettings, RunFolder, progress_bar, run_steps

    run = RunFolder(Path(cfg.run_dir) / f"width-{width}-steps-{steps}")
    done = run.path / "point.json"
    if done.exists():
        return json.loads(done.read_text())
    torch.manual_seed(cfg.seed)
    model = build_model("draft", data["tokenizer"], **draft_fields(width, cfg.layers))
    opt = _optimizer(model, cfg.lr)
    fresh = {"step": 0, "elapsed_s": 0.0, "recent_losses": [], "resumed_from": []}
    # what the run computes; a folder made with other settings is not resumed into this one
    settings = json.loads(json.dumps({"width": width, "steps": steps, **{k: v for k, v in asdict(cfg).items() if k in (
        "layers", "batch_size", "seq_len", "lr", "seed")}}))

    def same_settings(saved: dict) -> None:
        if saved["settings"] != settings:
            raise ValueError(f"{run.checkpoint} was made with other settings; use another --run-dir")

    state, _ = run.resume(model, opt, fresh, check=same_settings)

    def loss_at(step: int):
        return _loss(model, _batch(data["train"], cfg.seed, step, cfg.batch_size, cfg.seq_len))

    def checkpoint() -> None:
        run.save_checkpoint({"model": model.state_dict(), "optimizer": opt.state_dict(),
                             "torch_rng": torch.get_rng_state(), "settings": settings, "state": state})

    bar = progress_bar(steps, state["step"], f"width {width}, {steps} steps")
    loop = LoopSettings(f"scaling width {width}", steps, cfg.lr, min(cfg.warmup, max(1, steps // 10)), log_every=50,
                        eval_every=steps, checkpoint_minutes=cfg.checkpoint_minutes)
    run_steps(loop, state, model, opt, loss_at, log=lambda result: None, evaluate=lambda result: None,
              checkpoint=checkpoint, bar=bar)
    bar.close()
    measured = teacher_forced(model, heldout)
    point = {"width": width, "params": sum(p.numel() for p in model.parameters()), "steps": steps,
             "tokens": steps * cfg.tokens_per_step, "alpha": measured["alpha"],
             "greedy_agreement": measured["greedy_agreement"], "fkl": measured["fkl"],
             "final_train_loss": sum(state["recent_losses"]) / max(1, len(state["recent_losses"])),
             "wall_s": state["elapsed_s"]}
    done.write_text(json.dumps(point))
    print(f"width {width} ({point['params']:,} parameters), D {point['tokens']:,}: α {point['alpha']:.4f}, "
          f"greedy {point['greedy_agreement']:.4f}", file=sys.stderr)
    return point


def run_sweep(cfg: SweepConfig, say=print) -> list[dict]:
    """Every width's points (fitted widths first), training what is not trained yet."""
    from specgen.modalities.text.generator import load_causal_lm
    from specgen.modalities.text.models import ASSETS_CODE, VOCAB_SIZE
    from specgen.modalities.text.training.code_models import _prepare_tokenizer, _token_cache
    from specgen.modalities.text.training.distill import windows as window_data
    from specgen.modalities.text.training.distill.agreement import heldout_set
    from specgen.modalities.text.training.stdlib_corpus import load_corpus
    from specgen.settings import use_threads

    use_threads(cfg.threads)
    root = Path(cfg.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus()
    tokenizer = _prepare_tokenizer(root, ASSETS_CODE, corpus, VOCAB_SIZE)
    data = {"tokenizer": tokenizer, **_token_cache(root, corpus, tokenizer)}
    target_path = str(ASSETS_CODE / "target")
    cache = window_data.cache_folder(target_path, None)
    cache.mkdir(parents=True, exist_ok=True)
    say(f"held-out target samples (cached in {cache})")
    heldout = heldout_set(load_causal_lm(target_path), tokenizer, cache, temperature=1.0)
    return [train_point(cfg, width, steps, data, heldout)
            for width in (*cfg.widths, *cfg.heldout_widths) for steps in cfg.checkpoints]


# ---- the law ----------------------------------------------------------------------------------------------------

@dataclass
class ScalingLaw:
    """quantity ≈ intercept + per_log_params·ln N + per_log_tokens·ln D, fitted by least squares."""

    quantity: str
    intercept: float
    per_log_params: float
    per_log_tokens: float
    r2: float
    residuals: list[float] = field(default_factory=list)

    def predict(self, params: float, tokens: float) -> float:
        return self.intercept + self.per_log_params * math.log(params) + self.per_log_tokens * math.log(tokens)


def fit_law(points: list[dict], quantity: str = "alpha") -> ScalingLaw:
    import numpy as np

    if len(points) < 3:
        raise ValueError("a law over ln N and ln D needs at least three points")
    design = np.array([[1.0, math.log(p["params"]), math.log(p["tokens"])] for p in points])
    observed = np.array([p[quantity] for p in points])
    coef, *_ = np.linalg.lstsq(design, observed, rcond=None)
    residuals = observed - design @ coef
    total = float(((observed - observed.mean()) ** 2).sum())
    r2 = 1 - float((residuals ** 2).sum()) / total if total > 0 else 1.0
    return ScalingLaw(quantity, *(float(c) for c in coef), r2, [float(r) for r in residuals])


def judge(law: ScalingLaw, points: list[dict]) -> dict:
    """The law's predictions for points it was not fitted on: each error and the largest."""
    errors = [law.predict(p["params"], p["tokens"]) - p[law.quantity] for p in points]
    return {"errors": errors, "max_abs_error": max((abs(e) for e in errors), default=None)}


# ---- the cost model's recommendation ------------------------------------------------------------------------------

def forward_ms(model, window: int, context: int = 64, repeats: int = 50) -> float:
    """Milliseconds of one `window`-token forward after `context` cached tokens (the compact runner): the fastest
    of `repeats`, which a busy machine disturbs least."""
    import time

    import torch

    from specgen.modalities.runtime.transformers_adapter import TransformersTarget

    runner = TransformersTarget(model, capacity=context + window + 1)
    runner.prefill([torch.arange(context + 1) % 97 + 3])
    rows = torch.arange(1)
    tokens = torch.full((1, window), 5)
    positions = torch.arange(context, context + window)[None]
    samples = []
    for _ in range(repeats + 3):
        start = time.perf_counter()
        runner.score(tokens, positions, rows)  # never committed: every repeat scores the same slots
        samples.append(time.perf_counter() - start)
    return 1000 * min(samples[3:])


def recommend(law: ScalingLaw, tokens: float, draft_ms: dict[int, float], params: dict[int, int],
              verify_ms: dict[int, float], gammas=range(1, 9)) -> dict:
    """The draft width (and draft length) the law and the measured costs predict fastest for this target, with
    the predicted speedup of every width: E[tokens](α, γ) · T(1) / (γ·c(width) + T(γ + 1)), α from the law at
    `tokens` pretraining tokens (the loop's own overhead left out)."""
    from specgen.samplers.stats import expected_tokens_per_step

    table = {}
    for width, per_token in sorted(draft_ms.items()):
        alpha = min(max(law.predict(params[width], tokens), 0.0), 0.999)
        speeds = {g: expected_tokens_per_step(alpha, g) * verify_ms[1] / (g * per_token + verify_ms[g + 1])
                  for g in gammas if g + 1 in verify_ms}
        best = max(speeds, key=speeds.get)
        table[width] = {"params": params[width], "alpha": alpha, "draft_ms": per_token, "gamma": best,
                        "speedup": speeds[best]}
    width = max(table, key=lambda w: table[w]["speedup"])
    return {"tokens": tokens, "quantity": law.quantity, "width": width, **table[width], "table": table}


def measure_costs(widths, layers: int, target_path: str | None = None, say=print) -> dict:
    """Draft ms per token by width (fresh models of each shape: the cost does not depend on the weights) and the
    target's verify ms by window (default: the shipped code target)."""
    import torch

    from specgen.modalities.text.generator import load_causal_lm
    from specgen.modalities.text.models import ASSETS_CODE, build_model, load_tokenizer

    tokenizer = load_tokenizer(ASSETS_CODE)
    target = load_causal_lm(target_path or str(ASSETS_CODE / "target"))
    verify = {n: forward_ms(target, n) for n in range(1, 10)}
    draft, params = {}, {}
    for width in widths:
        torch.manual_seed(0)
        model = build_model("draft", tokenizer, **draft_fields(width, layers)).eval()
        draft[width], params[width] = forward_ms(model, 1), sum(p.numel() for p in model.parameters())
        say(f"width {width}: {draft[width]:.2f} ms per draft token")
    return {"verify_ms": verify, "draft_ms": draft, "params": params}


# ---- report -----------------------------------------------------------------------------------------------------

SHIPPED = {"width": 128, "tokens": 4_915_200, "source": "assets/code/draft/distillation.json heldout_before"}


def analyse(cfg: SweepConfig, points: list[dict], costs: dict) -> dict:
    """The law fitted on the fitted widths and judged on the held-out ones, over every D and over the D below the
    target's own training tokens (past them a draft stops matching the target better), the shipped draft's
    pretraining against the law, and the recommendation at the sweep's largest D."""
    fitted = [p for p in points if p["width"] in cfg.widths]
    heldout = [p for p in points if p["width"] in cfg.heldout_widths]
    target_tokens = _target_tokens()
    laws, judged = {}, {}
    for scope, keep in (("all", lambda p: True), ("below_target", lambda p: p["tokens"] < target_tokens)):
        mine = [p for p in fitted if keep(p)]
        if len({p["tokens"] for p in mine}) < 2:
            continue
        laws[scope] = {q: fit_law(mine, q) for q in QUANTITIES}
        judged[scope] = {q: judge(laws[scope][q], [p for p in heldout if keep(p)]) for q in QUANTITIES}
    result = {"config": {k: v for k, v in asdict(cfg).items() if k != "run_dir"}, "points": points,
              "target_tokens": target_tokens, "laws": {q: asdict(law) for q, law in laws["all"].items()},
              "heldout": judged["all"], "costs": costs,
              "laws_below_target": {q: asdict(law) for q, law in laws.get("below_target", {}).items()},
              "heldout_below_target": judged.get("below_target", {})}
    shipped = _shipped_draft(costs)
    if shipped:
        result["shipped"] = {**shipped, **{
            f"predicted_{q}": laws["all"][q].predict(shipped["params"], shipped["tokens"]) for q in QUANTITIES}}
    largest = max(p["tokens"] for p in points)
    result["recommend"] = {f"{q}@{largest}": recommend(laws["all"][q], largest, costs["draft_ms"], costs["params"],
                                                       costs["verify_ms"]) for q in QUANTITIES}
    return result


def _target_tokens() -> float:
    from specgen.modalities.text.models import ASSETS_CODE

    path = ASSETS_CODE / "target" / "training.json"
    return json.loads(path.read_text())["tokens_seen"] if path.exists() else float("inf")


def _shipped_draft(costs: dict) -> dict | None:
    from specgen.modalities.text.models import ASSETS_CODE

    path = ASSETS_CODE / "draft" / "distillation.json"
    if not path.exists() or SHIPPED["width"] not in costs["params"]:
        return None
    before = json.loads(path.read_text())["heldout_before"]
    return {**SHIPPED, "params": costs["params"][SHIPPED["width"]], "alpha": before["alpha"],
            "greedy_agreement": before["greedy_agreement"]}


def render_markdown(result: dict, command: str, plot_name: str) -> str:
    cfg, laws = result["config"], result["laws"]
    lines = ["# Draft acceptance against draft size and pretraining tokens (code pair)", "",
             f"`{command}`", "",
             f"Drafts {cfg['layers']} layers deep, widths {', '.join(map(str, cfg['widths']))} fitted and "
             f"{', '.join(map(str, cfg['heldout_widths']))} held out; one run from scratch per (width, D) (peak lr "
             f"{cfg['lr']:g}, warm-up, cosine to 10 %, {cfg['batch_size']} x {cfg['seq_len']} tokens a step). "
             "α = Σ min(target, draft) at temperature 1 "
             "and greedy agreement, teacher-forced on 8,192 positions of the target's own samples on validation "
             "prompts.", "", f"![α against D and N]({plot_name})", "",
             "| width | parameters N | tokens D | α | greedy agreement |", "|---:|---:|---:|---:|---:|"]
    for p in sorted(result["points"], key=lambda p: (p["width"], p["tokens"])):
        held = " (held out)" if p["width"] in cfg["heldout_widths"] else ""
        lines.append(f"| {p['width']}{held} | {p['params']:,} | {p['tokens']:,} | {p['alpha']:.4f} | "
                     f"{p['greedy_agreement']:.4f} |")
    lines += ["", "## The fitted law", "", "| quantity | a | b (ln N) | c (ln D) | R² | largest fit residual | "
              "held-out widths: largest error |", "|---|---:|---:|---:|---:|---:|---:|"]
    scopes = [("every D", laws, result["heldout"]),
              (f"D below the target's own {result['target_tokens']:,} training tokens",
               result.get("laws_below_target") or {}, result.get("heldout_below_target") or {})]
    for scope, scope_laws, scope_judged in scopes:
        for q, law in scope_laws.items():
            lines.append(f"| {q}, {scope} | {law['intercept']:.4f} | {law['per_log_params']:.4f} | "
                         f"{law['per_log_tokens']:.4f} | {law['r2']:.3f} | {max(abs(r) for r in law['residuals']):.4f} "
                         f"| {scope_judged[q]['max_abs_error']:.4f} |")
    shipped = result.get("shipped")
    if shipped:
        lines += ["", f"Extrapolated to the shipped draft's pretraining (width {shipped['width']}, "
                  f"{shipped['tokens']:,} tokens, three times the target's own): predicted α "
                  f"{shipped['predicted_alpha']:.4f} against the measured {shipped['alpha']:.4f}, greedy agreement "
                  f"{shipped['predicted_greedy_agreement']:.4f} against {shipped['greedy_agreement']:.4f} "
                  f"({shipped['source']})."]
    lines += ["", "## Recommended draft width for the shipped target", "",
              "Predicted speedup over plain decoding = E[tokens](α, γ) · T(1) / (γ·c(N) + T(γ + 1)), with the "
              "target's verify time T by window and the draft's time per token c(N) measured here (one thread), "
              "α from the law, the best γ per width; the loop's own overhead is left out, so these are upper "
              "bounds that rank widths rather than promise speeds.", "",
              "| law | D | recommended width | γ | α | predicted speedup | by width (speedup) |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for key, rec in result["recommend"].items():
        others = ", ".join(f"{w}: {v['speedup']:.2f}" for w, v in sorted(rec["table"].items(), key=lambda x: int(x[0])))
        lines.append(f"| {rec['quantity']} | {rec['tokens']:,} | {rec['width']} | {rec['gamma']} | {rec['alpha']:.3f} "
                     f"| {rec['speedup']:.2f} | {others} |")
    costs = result["costs"]
    lines += ["", "Measured costs (ms): target verify by window " + ", ".join(
        f"{n}: {t:.2f}" for n, t in sorted(costs["verify_ms"].items(), key=lambda x: int(x[0]))) +
        "; draft per token by width " + ", ".join(
        f"{w}: {t:.2f}" for w, t in sorted(costs["draft_ms"].items(), key=lambda x: int(x[0]))) + "."]
    return "\n".join(lines) + "\n"


def plot_png(path: Path, result: dict) -> None:
    """Left: α against D (log axis) per width, measured points and the law's lines (held-out widths hollow,
    dashed). Right: the predicted speedup by draft size at each recommended D. Drawn with Pillow."""
    from PIL import Image, ImageDraw, ImageFont

    law = ScalingLaw(**result["laws"]["alpha"])
    held = set(result["config"]["heldout_widths"])
    try:
        label_font = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        label_font = ImageFont.load_default()
    panel_w, panel_h, left, top, gap = 430, 330, 60, 50, 80
    image = Image.new("RGB", (left + 2 * panel_w + gap + 170, top + panel_h + 60), "white")
    draw = ImageDraw.Draw(image)
    draw.text((left, 10), f"alpha ~ {law.intercept:.3f} + {law.per_log_params:.3f} ln N + {law.per_log_tokens:.3f} "
              f"ln D (R2 {law.r2:.3f}); held-out widths hollow, dashed", fill="black", font=label_font)
    widths = sorted({p["width"] for p in result["points"]})
    palette = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (200, 120, 30), (200, 40, 40)]
    tokens = [p["tokens"] for p in result["points"]]
    alphas = [p["alpha"] for p in result["points"]]
    box = _Axes(draw, label_font, (left, top, panel_w, panel_h), (min(tokens) / 1.2, max(tokens) * 1.2),
                (min(alphas) - 0.02, max(alphas) + 0.02), "pretraining tokens D", "alpha")
    for i, width in enumerate(widths):
        colour = palette[i % len(palette)]
        mine = sorted((p for p in result["points"] if p["width"] == width), key=lambda p: p["tokens"])
        grid = [mine[0]["tokens"] * (mine[-1]["tokens"] / mine[0]["tokens"]) ** (k / 20) for k in range(21)]
        box.line([(t, law.predict(mine[0]["params"], t)) for t in grid], colour, dashed=width in held)
        for p in mine:
            box.dot(p["tokens"], p["alpha"], colour, hollow=width in held)
        y = top + 18 * i
        draw.rectangle([left + 2 * panel_w + gap + 10, y + 3, left + 2 * panel_w + gap + 22, y + 15], fill=colour)
        draw.text((left + 2 * panel_w + gap + 28, y), f"width {width}{' (held out)' if width in held else ''}",
                  fill="black", font=label_font)
    recs = [rec for key, rec in result["recommend"].items() if key.startswith("alpha@")]
    speeds = [v["speedup"] for rec in recs for v in rec["table"].values()]
    params = [v["params"] for rec in recs for v in rec["table"].values()]
    right = _Axes(draw, label_font, (left + panel_w + gap, top, panel_w, panel_h), (min(params) / 1.2,
                  max(params) * 1.2), (min(speeds) - 0.05, max(speeds) + 0.05), "draft parameters N",
                  "predicted speedup")
    for i, rec in enumerate(recs):
        colour = palette[(2 * i + 1) % len(palette)]
        table = sorted(rec["table"].values(), key=lambda v: v["params"])
        right.line([(v["params"], v["speedup"]) for v in table], colour)
        for v in table:
            right.dot(v["params"], v["speedup"], colour)
        draw.text((left + panel_w + gap + 8, top + 6 + 18 * i), f"D = {rec['tokens'] / 1e6:.1f}M tokens",
                  fill=colour, font=label_font)
    image.save(path)


class _Axes:
    """A log-x, linear-y panel: data coordinates to pixels, a frame, ticks and labels."""

    def __init__(self, draw, font, box, x_range, y_range, x_label: str, y_label: str):
        self.draw, self.box, self.x_range, self.y_range = draw, box, x_range, y_range
        left, top, width, height = box
        draw.rectangle([left, top, left + width, top + height], outline="black")
        draw.text((left + width / 2 - 60, top + height + 24), x_label, fill="black", font=font)
        draw.text((left, top - 18), y_label, fill="black", font=font)
        low, high = (math.log10(v) for v in x_range)
        for exponent in range(math.floor(low), math.ceil(high) + 1):
            for mantissa in (1, 2, 5):
                value = mantissa * 10 ** exponent
                if x_range[0] <= value <= x_range[1]:
                    x = self.x(value)
                    draw.line([x, top + height, x, top + height + 4], fill="black")
                    draw.text((x - 12, top + height + 6), f"{value:.0e}".replace("e+0", "e"), fill="black", font=font)
        for k in range(6):
            value = y_range[0] + (y_range[1] - y_range[0]) * k / 5
            draw.line([left - 4, self.y(value), left, self.y(value)], fill="black")
            draw.text((left - 44, self.y(value) - 7), f"{value:.2f}", fill="black", font=font)

    def x(self, value: float) -> float:
        left, _, width, _ = self.box
        low, high = (math.log10(v) for v in self.x_range)
        return left + (math.log10(value) - low) / (high - low) * width

    def y(self, value: float) -> float:
        _, top, _, height = self.box
        return top + height - (value - self.y_range[0]) / (self.y_range[1] - self.y_range[0]) * height

    def line(self, points, colour, dashed: bool = False) -> None:
        pixels = [(self.x(a), self.y(b)) for a, b in points]
        for i, (start, end) in enumerate(zip(pixels, pixels[1:])):
            if not dashed or i % 2 == 0:
                self.draw.line([start, end], fill=colour, width=2)

    def dot(self, a: float, b: float, colour, hollow: bool = False) -> None:
        x, y = self.x(a), self.y(b)
        self.draw.ellipse([x - 4, y - 4, x + 4, y + 4], outline=colour, width=2, fill=None if hollow else colour)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, default=Path("runs/scaling"))
    p.add_argument("--widths", default="32,64,128,192", help="fitted widths")
    p.add_argument("--heldout-widths", default="48,96", help="widths the law predicts without fitting them")
    p.add_argument("--checkpoints", default="100,200,400,800",
                   help="optimizer steps of the runs, one run per (width, steps): D = steps x 2,048 tokens")
    p.add_argument("--cost-widths", default="32,48,64,96,128,192,256,384",
                   help="widths whose draft cost is measured for the recommendation")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("benchmarks/scaling/code-latest"), help="path without suffix")
    p.add_argument("--recommend", type=Path, metavar="RECORD.json",
                   help="train nothing: with this record's law, measure --target's costs and print the draft width "
                        "the cost model predicts fastest for --tokens of pretraining")
    p.add_argument("--target", help="with --recommend: the target folder (default: the shipped code target)")
    p.add_argument("--tokens", type=float, default=None, help="with --recommend: pretraining tokens D (default: the "
                   "record's largest)")
    args = p.parse_args(argv)
    ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    if args.recommend:
        from specgen.modalities.text.generator import resolve_model_path
        from specgen.settings import use_threads

        use_threads(args.threads)
        record = json.loads(args.recommend.read_text())
        tokens = args.tokens or max(point["tokens"] for point in record["points"])
        costs = measure_costs(ints(args.cost_widths), record["config"]["layers"],
                              args.target and resolve_model_path(args.target))
        for quantity in QUANTITIES:
            rec = recommend(ScalingLaw(**record["laws"][quantity]), tokens, costs["draft_ms"], costs["params"],
                            costs["verify_ms"])
            print(f"{quantity} law, D {tokens:,.0f}: width {rec['width']} (γ {rec['gamma']}, α {rec['alpha']:.3f}, "
                  f"predicted {rec['speedup']:.2f}x); by width: " + ", ".join(
                      f"{w}: {v['speedup']:.2f}x" for w, v in sorted(rec["table"].items())))
        return 0
    cfg = SweepConfig(args.run_dir, widths=ints(args.widths), heldout_widths=ints(args.heldout_widths),
                      checkpoints=ints(args.checkpoints), threads=args.threads)
    points = run_sweep(cfg)
    costs = measure_costs(sorted({*ints(args.cost_widths), *cfg.widths, *cfg.heldout_widths}), cfg.layers)
    result = analyse(cfg, points, costs)
    command = "python -m specgen.modalities.text.training.scaling " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("run_dir", "out"))
    result["command"] = command
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot_png(args.out.with_suffix(".png"), result)
    args.out.with_suffix(".md").write_text(render_markdown(result, command, args.out.with_suffix(".png").name))
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
