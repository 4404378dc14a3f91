"""The text bench's summary and report: per variant the design's stats pooled over its runs, the median speedup
over `ar` with a bootstrap interval over prompts, ours against the faster setting of each peer; the Markdown
report and the speedup plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specgen.app.bench.report import fmt, font
from specgen.app.bench.stats import BOOTSTRAP_RESAMPLES, median, median_ci, prompt_medians, slowdowns
from specgen.app.bench.text_runner import PEER_OF, PEERS, TIE_MARGIN, Variant
from specgen.samplers.stats import SpecStats


def summarise(items: list[dict], variants: list[Variant], stats: dict[str, SpecStats],
              resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, dict]:
    """One entry per variant: the design's stats keys, pooled over items, plus the bench's ratios."""
    methods: dict[str, dict] = {}
    for v in variants:
        mine = [item for item in items if item["name"] == v.name]
        pooled = stats[v.name]
        wall_s = sum(item["wall_s"] for item in mine)
        entry = pooled.summary(method=v.method, lossless=True, wall_s=wall_s)
        for key in ("draft_s", "verify_s", "verify_s_by_window", "mean_draft_length"):
            entry.pop(key, None)  # per-item quantities; a pooled value would mix windows and prompts
        per_prompt = prompt_medians(mine, "speedup_vs_ar")
        speedup, ci = median_ci(list(per_prompt.values()), resamples, single=True)
        divergences = [{"prompt_id": i["prompt_id"], "repeat": i["repeat"], "index": i["first_divergence"],
                        "margin": i["divergence_margin"], "tie_margin": i["divergence_tie_margin"]}
                       for i in mine if not i["identical_to_ar"]]
        by_category: dict[str, list[float]] = {}
        for pid, value in per_prompt.items():
            category = next(i["category"] for i in mine if i["prompt_id"] == pid)
            by_category.setdefault(category, []).append(value)
        entry.update({
            "name": v.name, "variant": v.variant, "config": v.config,
            "implementation": "specgen" if v.ours else "transformers",
            "lossless": all(i["lossless"] for i in mine),
            "tokens_per_s": median(i["tokens_per_s"] for i in mine),
            "predicted_speedup_ideal": median(i["predicted_speedup_ideal"] for i in mine),
            "predicted_speedup_measured": median(i["predicted_speedup_measured"] for i in mine),
            "measured_over_predicted": median(i.get("measured_over_predicted") for i in mine),
            "speedup_vs_ar": speedup, "speedup_vs_ar_ci95": ci,
            "slowdowns": slowdowns(list(per_prompt.values())),
            "speedup_by_category": {c: float(np.median(x)) for c, x in sorted(by_category.items())},
            "identical_to_ar": not divergences,
            "identical_items": sum(i["identical_to_ar"] for i in mine), "items": len(mine),
            "divergences": divergences,
            "divergence_above_tie_margin": any(d["margin"] is not None and d["margin"] > d["tie_margin"]
                                               for d in divergences),
        })
        methods[v.name] = entry
    _mark_faster_peer_settings(methods)
    _ours_vs_peers(methods, items, resamples)
    return methods


def _mark_faster_peer_settings(methods: dict[str, dict]) -> None:
    for peer in PEERS:
        runs = [m for m in methods.values() if m["method"] == peer and m["variant"] is not None]
        if len(runs) < 2:
            continue
        best = max(runs, key=lambda m: m["speedup_vs_ar"] if m["speedup_vs_ar"] is not None else -1)
        for m in runs:
            m["faster"] = m is best


def faster_setting(methods: dict[str, dict], peer: str) -> str | None:
    runs = [m for m in methods.values() if m["method"] == peer]
    for m in runs:
        if m.get("faster", len(runs) == 1):
            return m["name"]
    return None


def _ours_vs_peers(methods: dict[str, dict], items: list[dict], resamples: int) -> None:
    """ours tokens/s over the faster peer setting's tokens/s, per round, median per prompt, with a CI."""
    by_round = {(i["name"], i["prompt_id"], i["repeat"]): i for i in items}
    for ours, peer in PEER_OF.items():
        peer_name = faster_setting(methods, peer)
        if ours not in methods or peer_name is None:
            continue
        ratios = []
        for (name, pid, repeat), item in by_round.items():
            other = by_round.get((peer_name, pid, repeat))
            if name == ours and other and item["tokens_per_s"] and other["tokens_per_s"]:
                ratios.append({"prompt_id": pid, "ratio": item["tokens_per_s"] / other["tokens_per_s"]})
        speedup, ci = median_ci(list(prompt_medians(ratios, "ratio").values()), resamples, single=True)
        methods[ours]["vs_peer"] = {"peer": peer_name, "speedup": speedup, "speedup_ci95": ci}


# ---- reports -----------------------------------------------------------------------------------------------------

def _f(value, digits: int = 2, suffix: str = "") -> str:
    return fmt(value, digits, suffix, missing="–")


def _share_of_best(methods: dict, category: str) -> float | None:
    """auto's median speedup in `category` over the best of the other methods of ours (plain decoding and the
    Hugging Face peers left out)."""
    others = [m["speedup_by_category"].get(category) for name, m in methods.items()
              if name not in ("ar", "auto") and m["method"] not in PEERS]
    best = max((v for v in others if v is not None), default=None)
    mine = methods["auto"]["speedup_by_category"].get(category)
    return mine / best if mine is not None and best else None


def _slower_cell(slow: dict | None) -> str:
    if not slow or not slow["prompts"]:
        return "—"
    return f"{slow['slower_than_ar']}/{slow['prompts']}; {_f(slow['worst_speedup'])}×"


def _speedup_cell(value, ci) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{value:.2f}×"


def render_markdown(result: dict, plot_name: str | None) -> str:
    methods, items, env = result["methods"], result["items"], result["env"]
    load = env["load_before"], env["load_after"]
    lines = [
        f"# specgen bench text — {env['timestamp_utc']}", "",
        "Command:", "", "```", env["command"], "```", "",
        f"Greedy, {env['max_new_tokens']} new tokens at most, {env['prompts']['count']} prompts × "
        f"{env['repeats']} repeat(s), methods interleaved in rotated order in one process, "
        f"{env['threads']} torch thread(s), each method warmed up once. Speedup = tokens/s over our `ar` in the "
        f"same round; median over prompts with a bootstrap 95 % CI ({env['bootstrap']['resamples']} resamples "
        "of prompts). Peers with a draft length run at their default and at ours; comparisons use the faster.", "",
        f"- commit `{env['git_commit']}`{' (uncommitted changes)' if env['git_dirty'] else ''}; specgen "
        f"{env['specgen']}, torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}",
        f"- CPU: {env['cpu_model']} ({env['cpu_count']} cores); load average before {load[0]}, after {load[1]}, "
        f"highest 1-min {env['load_max_1min']}"
        + (f" — **above {env['load_flag_threshold']}: timings are contended**" if env["load_flag"] else ""),
    ]
    for role, record in env["models"].items():
        if record:
            lines.append(f"- {role}: `{record['path']}` ({record.get('weights', 'model.safetensors')} sha256 "
                         f"`{record['sha256']}`)")
    if env.get("int8_kernel"):
        lines.append(f"- served in the batch-invariant int8 mode, kernel `{env['int8_kernel']}`")
    lines += [f"- prompts: `{env['prompts']['path']}` (sha256 `{env['prompts']['sha256']}`)", ""]

    lines += ["## Methods", "",
              "| method | speedup vs ar [95 % CI] | tokens/s | τ | α̂ | acceptance | steps | predicted (ideal / "
              "measured) | measured ÷ predicted | identical to ar | slower than ar (prompts; worst) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods.values():
        name = f"`{m['name']}`" + (" (faster)" if m.get("faster") else "")
        lines.append(
            f"| {name} | {_speedup_cell(m['speedup_vs_ar'], m['speedup_vs_ar_ci95'])} | {_f(m['tokens_per_s'], 1)} "
            f"| {_f(m['tau'])} | {_f(m['alpha_hat'])} | {_f(m['acceptance_rate'])} | {m['steps']} "
            f"| {_f(m['predicted_speedup_ideal'])} / {_f(m['predicted_speedup_measured'])} "
            f"| {_f(m['measured_over_predicted'])} | {m['identical_items']}/{m['items']} "
            f"| {_slower_cell(m.get('slowdowns'))} |")
    peers = [(name, m["vs_peer"]) for name, m in methods.items() if "vs_peer" in m]
    if peers:
        lines += ["", "## Ours against the peers", "", "| ours | peer (faster setting) | speedup [95 % CI] |",
                  "|---|---|---|"]
        for name, vs in peers:
            lines.append(f"| `{name}` | `{vs['peer']}` | {_speedup_cell(vs['speedup'], vs['speedup_ci95'])} |")
    if plot_name:
        lines += ["", f"![speedup vs ar]({plot_name})"]

    categories = sorted({c for m in methods.values() for c in m["speedup_by_category"]})
    lines += ["", "## Speedup by category (median over prompts)", "",
              "| method | " + " | ".join(categories) + " |", "|---" * (len(categories) + 1) + "|"]
    for m in methods.values():
        lines.append(f"| `{m['name']}` | " + " | ".join(_f(m["speedup_by_category"].get(c)) for c in categories)
                     + " |")
    if "auto" in methods:  # auto against the best of our single methods, chosen with hindsight per category
        lines.append("| `auto` ÷ the best other method | " + " | ".join(_f(_share_of_best(methods, c))
                                                                         for c in categories) + " |")

    lines += _position_table(methods)
    prompt_ids = list(dict.fromkeys(i["prompt_id"] for i in items))
    lines += ["", "## Per prompt: speedup vs ar (median over repeats), τ in brackets", "",
              "| prompt | category | ar tokens/s | " + " | ".join(f"`{n}`" for n in methods if n != "ar") + " |",
              "|---" * (len(methods) + 2) + "|"]
    for pid in prompt_ids:
        mine = [i for i in items if i["prompt_id"] == pid]
        ar_rate = median(i["tokens_per_s"] for i in mine if i["name"] == "ar")
        cells = []
        for name in methods:
            if name == "ar":
                continue
            rows = [i for i in mine if i["name"] == name]
            cells.append(f"{_f(median(i['speedup_vs_ar'] for i in rows))} ({_f(median(i['tau'] for i in rows))})")
        lines.append(f"| {pid} | {mine[0]['category']} | {_f(ar_rate, 1)} | " + " | ".join(cells) + " |")

    diverged = [i for i in items if not i["identical_to_ar"]]
    lines += ["", "## Exactness", ""]
    if not diverged:
        lines.append("Every output equals our `ar` output token for token.")
    for i in diverged:
        margin = i["divergence_margin"]
        tie = i.get("divergence_tie_margin") or TIE_MARGIN
        verdict = ("expected: a lossy method" if not i.get("lossless", True) else "rounding between near-tied tokens"
                   if margin is not None and margin <= tie else "**a bug**")
        lines.append(f"- `{i['name']}` on {i['prompt_id']} (repeat {i['repeat']}): first divergence at token "
                     f"{i['first_divergence']}, target top-2 margin {_f(margin, 6)} (tie margin {_f(tie, 6)}) — {verdict}")
    return "\n".join(lines) + "\n"


def _position_table(methods: dict[str, dict], shown: int = 8) -> list[str]:
    """Our methods' acceptance at each drafted position given every earlier one was accepted (pooled over prompts;
    a chain's position k is tested only when 1..k-1 were accepted), where a method drafts more than one token."""
    rows = {name: m["per_position_acceptance"][:shown] for name, m in methods.items()
            if m.get("implementation") == "specgen" and len(m.get("per_position_acceptance") or ()) > 1}
    if not rows:
        return []
    depth = max(len(r) for r in rows.values())
    lines = ["", "## Acceptance by drafted position (given the earlier ones accepted; pooled)", "",
             "| method | " + " | ".join(str(d + 1) for d in range(depth)) + " |", "|---" * (depth + 1) + "|"]
    for name, values in rows.items():
        lines.append(f"| `{name}` | " + " | ".join(_f(v) for v in values) + " |" + " – |" * (depth - len(values)))
    return lines


def plot_png(path: Path, methods: dict[str, dict]) -> None:
    """Horizontal bars: median speedup vs ar per method with its 95 % CI as whiskers and a line at 1×.
    Drawn with Pillow (a dependency of gradio), since matplotlib is not a dependency."""
    from PIL import Image, ImageDraw

    rows = [m for m in methods.values() if m["speedup_vs_ar"] is not None]
    label_font = font(15)
    label_w, bar_h, gap, top, right = 260, 26, 12, 50, 60
    width, height = 1000, top + len(rows) * (bar_h + gap) + 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    high = max([1.0] + [max(m["speedup_vs_ar"], (m["speedup_vs_ar_ci95"] or [0, 0])[1]) for m in rows]) * 1.1
    scale = (width - label_w - right) / high

    def x(value: float) -> float:
        return label_w + value * scale

    draw.text((10, 12), "speedup vs ar (median over prompts, 95 % bootstrap CI)", fill="black", font=label_font)
    for i, m in enumerate(rows):
        y = top + i * (bar_h + gap)
        colour = (70, 130, 180) if m["implementation"] == "specgen" else (190, 120, 60)
        draw.text((10, y + 5), m["name"], fill="black", font=label_font)
        draw.rectangle([x(0), y, x(m["speedup_vs_ar"]), y + bar_h], fill=colour)
        if m["speedup_vs_ar_ci95"]:
            low, up = m["speedup_vs_ar_ci95"]
            mid = y + bar_h / 2
            draw.line([x(low), mid, x(up), mid], fill="black", width=2)
            for end in (low, up):
                draw.line([x(end), y + 5, x(end), y + bar_h - 5], fill="black", width=2)
        draw.text((x(max(m["speedup_vs_ar"], (m["speedup_vs_ar_ci95"] or [0, 0])[1])) + 6, y + 5),
                  f"{m['speedup_vs_ar']:.2f}x", fill="black", font=label_font)  # the bundled font has no "×"
    bottom = top + len(rows) * (bar_h + gap)
    draw.line([x(1.0), top - 8, x(1.0), bottom], fill=(200, 0, 0), width=1)
    draw.text((x(1.0) - 8, bottom + 4), "1x", fill=(200, 0, 0), font=label_font)
    draw.text((10, bottom + 24), "blue: specgen   orange: Hugging Face transformers", fill="black", font=label_font)
    image.save(path)
