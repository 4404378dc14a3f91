"""The recorded draft-training comparisons on the shipped code pair (results in `benchmarks/distill-*`).

    python -m specgen.modalities.text.training.distill.experiments divergences  # CE, FKL/RKL/JSD/TVD, AdaSPEC, data
    python -m specgen.modalities.text.training.distill.experiments prune        # pruned self-draft: self-data, corpus

Every arm starts from the same draft and trains the same number of steps on the same batch size, so arms see
equal tokens and do equal draft compute (the target's distributions are cached once and shared; on-policy arms
also pay the draft's sampling and the target's scoring each step, reported as wall time). AdaSPEC runs twice:
at equal steps (0.4 × the tokens with a gradient) and at steps / k (equal tokens with a gradient); its
reference is the forward-KL arm of the same seed. Each arm runs for several seeds (the seed orders the data and
draws the on-policy samples), α is measured teacher-forced on held-out target samples, and the first seed of
every arm also decodes the text bench prompts for the acceptance of real speculative runs. Runs resume.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

def _arm(loss, data, adaspec=None, step_multiplier=1.0, init=None, vocab_size=None) -> dict:
    return {"loss": loss, "data": data, "adaspec": adaspec, "step_multiplier": step_multiplier, "init": init,
            "vocab_size": vocab_size}


EXPERIMENTS = {
    "divergences": {  # every arm starts from the same draft (--init, default: the shipped one)
        "ce-corpus": _arm("ce", "corpus"),
        "fkl-corpus": _arm("fkl", "corpus"),
        "fkl-target": _arm("fkl", "target"),
        "rkl-target": _arm("rkl", "target"),
        "jsd-target": _arm("jsd", "target"),
        "tvd-target": _arm("tvd", "target"),
        "adaspec-target": _arm("fkl", "target", adaspec=0.4),
        "adaspec-target-equal-tokens": _arm("fkl", "target", adaspec=0.4, step_multiplier=2.5),
        "fkl-target-long": _arm("fkl", "target", step_multiplier=2.5),  # equal compute for the arm above
        "fkl-on-policy": _arm("fkl", "draft"),
        "fkl-mix": _arm("fkl", "mix"),
    },
    "prune": {  # the target less 4 of its 6 layers: the block of least angular distance (here the last four), or 1-4
        "pruned-sft-corpus": _arm("ce", "corpus", init="prune:4"),
        "pruned-sft-self-data": _arm("ce", "target", init="prune:4"),
        "pruned-fkl-self-data": _arm("fkl", "target", init="prune:4"),
        "pruned-layers1-4-sft-self-data": _arm("ce", "target", init="prune:4@1"),
    },
    "vocab": {  # reduced draft vocabularies (the most frequent tokens of target samples), forward KL on them
        "fkl-target-v2048": _arm("fkl", "target", vocab_size=2048),
        "fkl-target-v1024": _arm("fkl", "target", vocab_size=1024),
        "fkl-target-v512": _arm("fkl", "target", vocab_size=512),
    },
}


def _root() -> Path:
    return Path(__file__).resolve().parents[4]  # the checkout: benchmarks/ sits beside modalities/


def _speculative(target_path: str, draft_dir: Path, prompts: list[str]) -> dict:
    from specgen.modalities.text.training.distill.agreement import speculative_alpha
    from specgen.modalities.text.generator import TextGenerator

    gen = TextGenerator(target_path, str(draft_dir))
    return {f"t{t:g}": speculative_alpha(gen, prompts, temperature=t, num_draft_tokens=4, max_new_tokens=64)
            for t in (1.0, 0.0)}


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "values": values}


def run_experiment(args) -> dict:
    from specgen.modalities.text.training.distill.windows import cache_folder
    from specgen.modalities.text.training.distill.agreement import heldout_set, teacher_forced
    from specgen.modalities.text.training.distill.distiller import DistillConfig, train_draft
    from specgen.modalities.text.generator import default_models, load_causal_lm, load_tokenizer

    target_path, draft_path = default_models()
    arm_specs = EXPERIMENTS[args.experiment]
    prompts = [json.loads(line)["prompt"] for line in (_root() / "benchmarks/prompts/text.jsonl").read_text().splitlines()
               if line.strip()][:args.spec_prompts]
    start_path = args.init or draft_path  # the recorded runs started from the pre-distillation draft (docs/distill.md)
    base = DistillConfig(out="", steps=args.steps, threads=args.threads, windows=args.windows,
                         cache_dir=args.cache_dir)
    results: dict[str, dict] = {}
    started = time.time()
    arms = [a for a in arm_specs if a in args.arms.split(",")] if args.arms else list(arm_specs)
    for arm in arms:
        spec = arm_specs[arm]
        keep, steps = spec["adaspec"], round(args.steps * spec["step_multiplier"])
        results[arm] = {**spec, "steps": steps, "runs": []}
        for seed in args.seeds:
            out = Path(args.runs_dir) / f"{arm}-s{seed}"
            cfg = replace(base, out=str(out), loss=spec["loss"], data=spec["data"], adaspec=keep, seed=seed,
                          steps=steps, init=spec["init"] or args.init, vocab_size=spec["vocab_size"],
                          reference=str(Path(args.runs_dir) / f"fkl-target-s{seed}" / "export") if keep else None)
            done = out / "training.json"
            summary = json.loads(done.read_text()) if done.exists() else train_draft(cfg)
            run = {"seed": seed, **summary["heldout"], "wall_s": summary["wall_s"], "params": summary["params"],
                   "tokens_with_gradient": summary["tokens_with_gradient"] * (keep or 1.0)}
            for extra in ("prune", "coverage"):
                if extra in summary:
                    run[extra] = summary[extra]
            if seed == args.seeds[0] and prompts:
                spec_file = out / "speculative.json"
                if not spec_file.exists():
                    spec_file.write_text(json.dumps(_speculative(target_path, out / "export", prompts)))
                run["speculative"] = json.loads(spec_file.read_text())
            results[arm]["runs"].append(run)
            print(f"{arm} seed {seed}: alpha {run['alpha']:.4f}", file=sys.stderr, flush=True)
        for key in ("alpha", "greedy_agreement", "fkl", "wall_s"):
            if all(key in r for r in results[arm]["runs"]):
                results[arm][key] = _spread([r[key] for r in results[arm]["runs"]])
    # the starting draft, untrained further
    target = load_causal_lm(target_path)
    heldout = heldout_set(target, load_tokenizer(target_path), cache_folder(target_path, args.cache_dir),
                          count=base.eval_windows, prompt_len=base.prompt_len, new_tokens=base.new_tokens)
    initial = load_causal_lm(start_path)
    start = {**teacher_forced(initial, heldout), "params": sum(p.numel() for p in initial.parameters()),
             "path": start_path}
    if prompts:
        start["speculative"] = _speculative(target_path, Path(start_path), prompts)
    return {"experiment": args.experiment, "arms": results, "start": start, "seeds": args.seeds, "steps": args.steps,
            "settings": {k: v for k, v in vars(base).items() if k not in ("out", "cache_dir")},
            "spec_prompts": len(prompts), "wall_s": round(time.time() - started, 1),
            "command": "python -m specgen.modalities.text.training.distill.experiments " + " ".join(sys.argv[1:])}


def _verdicts(result: dict) -> list[str]:
    arms, lines = result["arms"], []
    ce = arms.get("ce-corpus")
    best = max((a for a in arms if a != "ce-corpus"), key=lambda a: arms[a]["alpha"]["mean"], default=None)
    if ce and best:
        beyond = arms[best]["alpha"]["min"] > ce["alpha"]["max"]
        lines.append(f"- Distillation vs cross-entropy only: best arm `{best}` α {arms[best]['alpha']['mean']:.4f} "
                     f"(seeds {arms[best]['alpha']['min']:.4f}–{arms[best]['alpha']['max']:.4f}) vs `ce-corpus` "
                     f"{ce['alpha']['mean']:.4f} ({ce['alpha']['min']:.4f}–{ce['alpha']['max']:.4f}): "
                     f"**{'beyond' if beyond else 'not beyond'} seed spread** (every seed of one above every seed of "
                     "the other).")
    for ada, control in (("adaspec-target", "fkl-target"), ("adaspec-target-equal-tokens", "fkl-target-long")):
        if ada in arms and control in arms:
            a, f = arms[ada]["alpha"], arms[control]["alpha"]
            diffs = [x - y for x, y in zip(a["values"], f["values"])]
            spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
            within = abs(statistics.fmean(diffs)) <= 2 * spread / max(len(diffs), 1) ** 0.5
            lines.append(f"- `{ada}` − `{control}` (equal steps, so equal draft compute; paired by seed): "
                         f"{statistics.fmean(diffs):+.4f} ± {spread:.4f} "
                         f"(sd over seeds) — **{'within noise' if within else 'beyond noise'}** "
                         "(within noise would mean |mean| ≤ 2 standard errors of the paired differences).")
    return lines


TITLES = {"divergences": "Draft distillation on the code pair: losses, data, AdaSPEC",
          "prune": "Pruned self-drafts on the code pair: self-data vs plain fine-tuning",
          "vocab": "Reduced-vocabulary drafts on the code pair"}


def render_markdown(result: dict, plot: str) -> str:
    arms, start = result["arms"], result["start"]
    coverage = any("coverage" in arm["runs"][0] for arm in arms.values())
    lines = [f"# {TITLES.get(result['experiment'], result['experiment'])}", "",
             f"Command: `{result['command']}` ({result['wall_s']} s). Target `assets/code/target`; arms start from "
             f"the initial draft ({start.get('path', 'assets/code/draft')}, α = {start['alpha']:.4f}) unless the "
             f"start column says otherwise. {result['steps']} steps × {result['settings']['batch_size']} windows (32-token prompts, "
             f"64 continuation tokens with a loss), lr {result['settings']['lr']:g}, temperature 1, "
             f"top-{result['settings']['top_k']} teacher cache, {result['settings']['windows']} fixed windows; "
             f"seeds {result['seeds']} (a seed orders the data and draws on-policy samples). α = Σ min(target, draft) "
             "teacher-forced on 128 held-out target samples (8,192 positions; validation-split prompts). "
             f"Speculative columns: real runs (γ = 4, 64 new tokens, {result['spec_prompts']} text bench prompts) "
             "with the first seed's draft — acceptance rate at T = 1 and T = 0, τ and tokens/s at T = 0 "
             "(tokens/s on a shared 2-core machine: indicative).", "",
             "| arm | loss | data | start | params | steps | tokens with a loss | α (mean ± sd) | α min–max | "
             "greedy agree | KL(t‖d) |" + (" coverage |" if coverage else "") + " accept T=1 | T=0 | τ T=0 | tok/s T=0 | "
             "train s |",
             "|" + "---|" * (16 + coverage)]
    spec0 = start.get("speculative", {})
    params = _count(start.get("params"))
    lines.append(f"| start (initial draft) | — | — | — | {params} | 0 | 0 | {start['alpha']:.4f} | — | "
                 f"{start['greedy_agreement']:.4f} | {start['fkl']:.4f} |" + (" 1 |" if coverage else "") +
                 f" {_acc(spec0, 't1')} | {_acc(spec0, 't0')} | {_tau(spec0)} | {_tps(spec0)} | — |")
    for name, arm in arms.items():
        first = arm["runs"][0]
        spec = first.get("speculative", {})
        loss = arm["loss"] + (f" + AdaSPEC k={arm['adaspec']:g}" if arm["adaspec"] else "")
        begin = arm.get("init") or "initial draft"
        if "prune" in first:
            removed = first["prune"]["layers_removed"]
            begin = f"target less layers {removed[0]}–{removed[-1]}"
        cov = f" {first['coverage']['heldout']:.4f} |" if coverage and "coverage" in first else (" 1 |" if coverage else "")
        lines.append(f"| {name} | {loss} | {arm['data']} | {begin} | {_count(first.get('params'))} | {arm['steps']} | "
                     f"{int(first['tokens_with_gradient']):,} | {arm['alpha']['mean']:.4f} ± {arm['alpha']['sd']:.4f} | "
                     f"{arm['alpha']['min']:.4f}–{arm['alpha']['max']:.4f} | {arm['greedy_agreement']['mean']:.4f} | "
                     f"{_kl(arm, first)} |{cov} {_acc(spec, 't1')} | {_acc(spec, 't0')} | {_tau(spec)} | "
                     f"{_tps(spec)} | {arm['wall_s']['mean']:.0f} |")
    verdicts = {"divergences": _verdicts, "prune": _prune_verdicts, "vocab": _vocab_verdicts}[result["experiment"]](result)
    lines += ["", "## Verdicts", "", *verdicts, "", f"![α per arm]({plot})", ""]
    return "\n".join(lines)


def _prune_verdicts(result: dict) -> list[str]:
    arms = result["arms"]
    pairs = [("pruned-sft-self-data", "pruned-sft-corpus", "self-data vs plain fine-tuning (same pruned start)"),
             ("pruned-sft-self-data", "pruned-layers1-4-sft-self-data", "least-angular-distance block vs layers 1–4")]
    lines = []
    for a, b, what in pairs:
        if a in arms and b in arms:
            diffs = [x - y for x, y in zip(arms[a]["alpha"]["values"], arms[b]["alpha"]["values"])]
            sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
            lines.append(f"- {what}: `{a}` − `{b}` = {statistics.fmean(diffs):+.4f} ± {sd:.4f} (sd over paired seeds).")
    return lines


def _kl(arm: dict, first: dict) -> str:
    # a reduced vocabulary puts no mass on the target's other tokens: KL(target || draft) is infinite
    return "∞" if "coverage" in first else f"{arm['fkl']['mean']:.4f}"


def _vocab_verdicts(result: dict) -> list[str]:
    lines = []
    for name, arm in result["arms"].items():
        first = arm["runs"][0]
        if "coverage" in first:
            cov = first["coverage"]
            lines.append(f"- `{name}`: {cov['vocab_size']} tokens cover {cov['heldout']:.1%} of the target's held-out "
                         f"mass (the ceiling on α); α = {arm['alpha']['mean']:.4f}, i.e. "
                         f"{arm['alpha']['mean'] / cov['heldout']:.1%} of that ceiling; {first.get('params', 0):,} "
                         "parameters.")
    return lines


def _count(value) -> str:
    return f"{value:,}" if value else "—"


def _tau(spec: dict) -> str:
    return f"{spec['t0']['tau']:.2f}" if "t0" in spec else "—"


def _tps(spec: dict) -> str:
    value = spec.get("t0", {}).get("tokens_per_s")
    return f"{value:.0f}" if value else "—"


def _acc(spec: dict, key: str) -> str:
    return f"{spec[key]['acceptance_rate']:.3f}" if key in spec else "—"


def plot_png(path: Path, result: dict) -> None:
    """α per arm: one dot per seed and a bar at the mean, the starting draft as a red line."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=15)
    except TypeError:
        font = ImageFont.load_default()
    arms = result["arms"]
    values = [v for a in arms.values() for v in a["alpha"]["values"]] + [result["start"]["alpha"]]
    low, high = min(values) - 0.01, max(values) + 0.01
    label_w, row_h, top, width = 300, 30, 50, 1000
    height = top + row_h * len(arms) + 40
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)

    def x(value: float) -> float:
        return label_w + (value - low) / (high - low) * (width - label_w - 40)

    draw.text((10, 12), "held-out alpha = sum min(target, draft), per seed (dots) and mean (bar)", fill="black", font=font)
    for i, (name, arm) in enumerate(arms.items()):
        y = top + i * row_h
        draw.text((10, y + 6), name, fill="black", font=font)
        draw.rectangle([x(low), y + 8, x(arm["alpha"]["mean"]), y + row_h - 8], fill=(170, 200, 230))
        for v in arm["alpha"]["values"]:
            draw.ellipse([x(v) - 4, y + row_h / 2 - 4, x(v) + 4, y + row_h / 2 + 4], fill=(30, 80, 150))
    bottom = top + row_h * len(arms)
    draw.line([x(result["start"]["alpha"]), top - 6, x(result["start"]["alpha"]), bottom], fill=(200, 0, 0))
    draw.text((x(result["start"]["alpha"]) + 4, bottom + 4), f"start {result['start']['alpha']:.3f}", fill=(200, 0, 0),
              font=font)
    draw.text((label_w, bottom + 20), f"axis {low:.3f} .. {high:.3f}", fill="black", font=font)
    image.save(path)


def write(result: dict, out_dir: Path, name: str) -> Path:
    import shutil

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{name}-{stamp}"
    plot_png(stem.with_suffix(".png"), result)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(render_markdown(result, stem.with_suffix(".png").name))
    for suffix in (".json", ".md", ".png"):
        shutil.copy(stem.with_suffix(suffix), out_dir / f"{name}-latest{suffix}")
    return stem.with_suffix(".md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specgen.modalities.text.training.distill.experiments")
    parser.add_argument("experiment", choices=(*EXPERIMENTS, "render"))
    parser.add_argument("json", nargs="?", type=Path, help="with `render`: a recorded result to draw again")
    parser.add_argument("--seeds", type=lambda text: [int(x) for x in text.split(",")], default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--windows", type=int, default=2048, help="fixed data set size")
    parser.add_argument("--arms", help="comma-separated subset of the experiment's arms")
    parser.add_argument("--spec-prompts", type=int, default=10, help="text bench prompts decoded per arm")
    parser.add_argument("--runs-dir", help="run folders (default: runs/distill-<experiment>)")
    parser.add_argument("--cache-dir")
    parser.add_argument("--init", help="the draft every arm starts from (default: the shipped one; the recorded "
                                       "runs used the pre-distillation draft, see docs/distill.md)")
    parser.add_argument("--out-dir", type=Path, default=_root() / "benchmarks")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.experiment == "render":  # redraw a recorded result's markdown and plot in place
        result = json.loads(args.json.read_text())
        plot_png(args.json.with_suffix(".png"), result)
        args.json.with_suffix(".md").write_text(render_markdown(result, args.json.with_suffix(".png").name))
        return 0
    args.runs_dir = args.runs_dir or f"runs/distill-{args.experiment}"
    from specgen.settings import use_threads

    use_threads(args.threads)
    name = "distill" if args.experiment == "divergences" else f"distill-{args.experiment}"
    print(write(run_experiment(args), args.out_dir, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
