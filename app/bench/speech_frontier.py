"""The speed/quality frontier of relaxed speech verification, as `specgen bench speech` reports it: `pcg` over its
group threshold theta (and `ssd` over its tolerance beta) against plain decoding (`ar`) and exact speculative
decoding (`sd`) on the same prompts and seeds.

Per variant: tau, alpha_hat (and exact sampling's on the same drafts), the median per-prompt wall-clock speedup over
`ar` and over `sd` with bootstrap intervals, and the quality change against `ar`: pocketsphinx WER (pooled edits /
words) and the speaker-similarity proxy of `specgen.modalities.speech.training.quality`, paired by prompt and seed
and bootstrapped over prompts. Per theta, the token-swap stress test on held-out corpus utterances. A theta qualifies
for the default when both its generation and its swap test stay within `QualityBound`; the fastest one is chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specgen.app.bench.report import font
from specgen.app.bench.stats import median_ci, prompt_medians
from specgen.modalities.speech.training.quality import bootstrap_mean_ci

DEFAULT_THETAS = (0.5, 0.4, 0.3, 0.25)
SWEPT_KNOBS = {"pcg": "theta", "ssd": "beta"}
GREEK = {"theta": "θ", "beta": "β"}


@dataclass(frozen=True)
class QualityBound:
    """What a relaxation may cost against `ar`, judged on 95 % bootstrap bounds: WER may rise by at most
    `delta_wer_max` (absolute) and the speaker-similarity proxy may fall by at most -`delta_similarity_min`."""

    delta_wer_max: float = 0.03
    delta_similarity_min: float = -0.03

    def holds(self, delta_wer_ci, delta_similarity_ci) -> bool:
        """Whether the upper WER bound and the lower similarity bound stay inside (unknown bounds never do)."""
        if delta_wer_ci is None or delta_similarity_ci is None:
            return False
        return delta_wer_ci[1] <= self.delta_wer_max and delta_similarity_ci[0] >= self.delta_similarity_min

    def describe(self) -> str:
        return (f"ΔWER upper 95 % bound ≤ +{self.delta_wer_max:g} and Δ speaker similarity lower 95 % bound ≥ "
                f"{self.delta_similarity_min:g}, against `ar`")


@dataclass(frozen=True)
class Variant:
    """A method at one value of its swept knob (`knob` None: the method at its defaults)."""

    method: str
    knob: str | None = None
    value: float | None = None

    @property
    def key(self) -> str:
        return self.method if self.knob is None else f"{self.method} {self.knob}={self.value:g}"

    @property
    def label(self) -> str:
        return self.method if self.knob is None else f"{self.method} {GREEK.get(self.knob, self.knob)}={self.value:g}"

    @property
    def knobs(self) -> dict:
        return {} if self.knob is None else {self.knob: self.value}


def sweep_variants(methods: list[str], sweeps: dict[str, list[float]], defaults: dict[str, float]) -> list[Variant]:
    """Every method once, a swept one (pcg, ssd) once per value of its knob, its default value always among them
    (the plain method's summary is the one at its default). sweeps / defaults: method -> values / default value."""
    variants = []
    for method in methods:
        knob = SWEPT_KNOBS.get(method)
        if knob is None:
            variants.append(Variant(method))
            continue
        values = sorted({float(v) for v in sweeps.get(method, ())} | {float(defaults[method])}, reverse=True)
        variants += [Variant(method, knob, v) for v in values]
    return variants


def _by_prompt(pairs: list[tuple[str, float, float]]) -> tuple[list[float], list[float]]:
    """[(prompt id, value, weight)] -> per-prompt weighted means and total weights (repeats pooled)."""
    totals: dict[str, list[float]] = {}
    for pid, value, weight in pairs:
        acc = totals.setdefault(pid, [0.0, 0.0])
        acc[0] += value * weight
        acc[1] += weight
    return ([v / w if w else 0.0 for v, w in totals.values()], [w for _, w in totals.values()])


def _ci_triple(triple) -> dict:
    if triple is None:
        return {"value": None, "ci95": None}
    return {"value": triple[0], "ci95": [triple[1], triple[2]]}


def quality_deltas(items: list[dict], variant: str, reference: str = "ar") -> dict:
    """Absolute WER and similarity of a variant, and their change against `reference`, paired by (prompt, seed)
    and bootstrapped over prompts."""
    runs = {(i["id"], i["repeat"]): i for i in items if i.get("variant") == variant and "edits" in i}
    base = {(i["id"], i["repeat"]): i for i in items if i.get("variant") == reference and "edits" in i}
    if not runs:
        return {}
    words = sum(i["words"] for i in runs.values())
    out = {"wer": sum(i["edits"] for i in runs.values()) / words if words else None,
           "similarity": float(np.mean([i["similarity"] for i in runs.values()]))}
    paired = [(key, run, base[key]) for key, run in runs.items() if key in base]
    if variant == reference or not paired:
        return out
    wer_values, wer_weights = _by_prompt([(k[0], (r["edits"] - b["edits"]) / r["words"] if r["words"] else 0.0,
                                           r["words"]) for k, r, b in paired])
    sim_values, _ = _by_prompt([(k[0], r["similarity"] - b["similarity"], 1.0) for k, r, b in paired])
    delta_wer, delta_sim = _ci_triple(bootstrap_mean_ci(wer_values, wer_weights)), _ci_triple(
        bootstrap_mean_ci(sim_values))
    return {**out, "delta_wer": delta_wer["value"], "delta_wer_ci95": delta_wer["ci95"],
            "delta_similarity": delta_sim["value"], "delta_similarity_ci95": delta_sim["ci95"]}


def speedup(items: list[dict], variant: str, key: str) -> dict:
    """Median over prompts of the per-prompt median ratio `key` (speedup_vs_ar or speedup_vs_sd), with a bootstrap
    interval of that median."""
    value, ci = median_ci(list(prompt_medians([i for i in items if i.get("variant") == variant], key, "id").values()))
    return {key: value, f"{key}_ci95": ci}


def summarise_swaps(rows: list[dict]) -> list[dict]:
    """Per theta: share of tokens swapped, WER and similarity of the unswapped and swapped decodes, their change
    (bootstrapped over utterances) and the log-mel L1 between the two decodes."""
    out = []
    for theta in sorted({r["theta"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["theta"] == theta]
        words = sum(r["words"] for r in mine)
        wer_change = [(r["edits"] - r["base_edits"]) / r["words"] if r["words"] else 0.0 for r in mine]
        delta_wer = _ci_triple(bootstrap_mean_ci(wer_change, [r["words"] for r in mine]))
        delta_sim = _ci_triple(bootstrap_mean_ci([r["similarity"] - r["base_similarity"] for r in mine]))
        mel = _ci_triple(bootstrap_mean_ci([r["mel_l1"] for r in mine]))
        out.append({"theta": theta, "utterances": len(mine),
                    "swapped_fraction": sum(r["swapped"] for r in mine) / max(1, sum(r["tokens"] for r in mine)),
                    "base_wer": sum(r["base_edits"] for r in mine) / words if words else None,
                    "wer": sum(r["edits"] for r in mine) / words if words else None,
                    "delta_wer": delta_wer["value"], "delta_wer_ci95": delta_wer["ci95"],
                    "base_similarity": float(np.mean([r["base_similarity"] for r in mine])),
                    "delta_similarity": delta_sim["value"], "delta_similarity_ci95": delta_sim["ci95"],
                    "mel_l1": mel["value"], "mel_l1_ci95": mel["ci95"]})
    return out


def choose_theta(rows: list[dict], swaps: list[dict], bound: QualityBound) -> dict:
    """The fastest pcg theta (highest median speedup over ar) whose generation and swap test both hold `bound`;
    also which thetas the generation alone would admit, and the fastest of those."""
    swap_by_theta = {s["theta"]: s for s in swaps}
    pcg = [r for r in rows if r["method"] == "pcg" and r.get("speedup_vs_ar") is not None]

    def generation_holds(r):
        return bound.holds(r.get("delta_wer_ci95"), r.get("delta_similarity_ci95"))

    def swap_holds(r):
        s = swap_by_theta.get(r["value"])
        return s is not None and bound.holds(s["delta_wer_ci95"], s["delta_similarity_ci95"])

    def fastest(candidates):
        return max(candidates, key=lambda r: (r["speedup_vs_ar"], r["tau"] or 0))["value"] if candidates else None

    admitted = [r for r in pcg if generation_holds(r) and swap_holds(r)]
    by_generation = [r for r in pcg if generation_holds(r)]
    return {"bound": {"delta_wer_max": bound.delta_wer_max, "delta_similarity_min": bound.delta_similarity_min,
                      "rule": bound.describe() + ", in generation and in the token-swap stress test"},
            "theta": fastest(admitted), "admitted": sorted(r["value"] for r in admitted),
            "generation_only_admitted": sorted(r["value"] for r in by_generation),
            "generation_only_theta": fastest(by_generation)}


# ---- report ------------------------------------------------------------------------------------------------------


def _f(value, digits: int = 2, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _with_ci(value, ci, digits: int = 2, signed: bool = False, suffix: str = "") -> str:
    text = _f(value, digits, signed) + (suffix if value is not None else "")
    return text + (f" [{_f(ci[0], digits, signed)}, {_f(ci[1], digits, signed)}]" if ci else "")


def _values(values) -> str:
    return ", ".join(f"{v:g}" for v in values) or "none"


def render_frontier_markdown(frontier: dict, plot_name: str | None = None) -> str:
    proxy, choice, setup = frontier["speaker_proxy"], frontier["choice"], frontier["setup"]
    lines = ["## Speed/quality frontier", ""]
    if proxy is not None:
        identified = None if proxy.get("identified") is None else 100 * proxy["identified"]
        lines += [f"Quality against `ar` on the same prompts and seeds: WER from {setup['recogniser']}; speaker "
                  f"similarity is a **proxy**: {setup['speaker_proxy']}. On {proxy['utterances']} held-out corpus "
                  f"utterances decoded from their true tokens it scores {_f(proxy['same_voice'])} against the own "
                  f"voice's profile and {_f(proxy['other_voice'])} against the other {proxy['voices'] - 1} voices' profiles, "
                  "and "
                  f"picks the right voice for {_f(identified, 0)} % of them. Intervals: 95 % bootstrap over prompts "
                  "(ΔWER pooled over words).", ""]
    else:
        lines += ["Speed only (run without quality scoring).", ""]
    lines += ["| variant | τ | α̂ (exact on same drafts) | speedup vs ar | speedup vs sd | WER | ΔWER vs ar | "
              "similarity | Δ similarity vs ar |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in frontier["rows"]:
        alpha = _f(r.get("alpha_hat")) + (f" ({_f(r['exact_alpha_hat'])})" if r.get("exact_alpha_hat") is not None
                                          else "")
        lines.append(f"| `{r['label']}` | {_f(r.get('tau'))} | {alpha} | "
                     f"{_with_ci(r.get('speedup_vs_ar'), r.get('speedup_vs_ar_ci95'), suffix='×')} | "
                     f"{_with_ci(r.get('speedup_vs_sd'), r.get('speedup_vs_sd_ci95'), suffix='×')} | "
                     f"{_f(r.get('wer'), 3)} | {_with_ci(r.get('delta_wer'), r.get('delta_wer_ci95'), 3, True)} | "
                     f"{_f(r.get('similarity'), 3)} | "
                     f"{_with_ci(r.get('delta_similarity'), r.get('delta_similarity_ci95'), 3, True)} |")
    if frontier["swap_test"]:
        lines += ["", f"Token-swap stress test (rate {setup['swap_rate']:g}, {frontier['swap_test'][0]['utterances']} "
                      "held-out corpus utterances decoded from their true tokens; the swapped decode against the "
                      "unswapped one):", "",
                  "| θ | swapped | WER unswapped → swapped | ΔWER | Δ similarity | log-mel L1 |",
                  "|---|---|---|---|---|---|"]
        for s in frontier["swap_test"]:
            lines.append(f"| {s['theta']:g} | {_f(100 * s['swapped_fraction'], 1)} % | {_f(s['base_wer'], 3)} → "
                         f"{_f(s['wer'], 3)} | {_with_ci(s['delta_wer'], s['delta_wer_ci95'], 3, True)} | "
                         f"{_with_ci(s['delta_similarity'], s['delta_similarity_ci95'], 3, True)} | "
                         f"{_with_ci(s['mel_l1'], s['mel_l1_ci95'], 3)} |")
    if choice is not None:
        fastest = [choice["theta"]] if choice["theta"] is not None else []
        lines += ["", f"Quality bound: {choice['bound']['rule']}. θ within it: {_values(choice['admitted'])}; "
                      f"the fastest of them: {_values(fastest)}. Judged on generation alone: "
                      f"{_values(choice['generation_only_admitted'])}."]
    if plot_name:
        lines += ["", f"![speedup over ar against ΔWER]({plot_name})"]
    return "\n".join(lines) + "\n"


# ---- plot --------------------------------------------------------------------------------------------------------

COLOURS = {"pcg": (70, 130, 180), "sd": (60, 150, 80), "ssd": (200, 90, 40), "ar": (120, 120, 120)}
BOUND_COLOUR = (200, 40, 40)


def plot_frontier_png(path: Path, frontier: dict) -> None:
    """Two panels sharing the y axis, speedup over ar (median, 95 % bars): against ΔWER vs ar in generation (every
    variant), and against ΔWER of the token-swap stress test at the same theta (pcg only), with 95 % bars; pcg's
    points are joined in theta order, the dashed line is the WER bound. Drawn with Pillow (no matplotlib)."""
    from PIL import Image, ImageDraw

    label_font = font()
    rows = [r for r in frontier["rows"] if r.get("speedup_vs_ar") is not None]
    bound = frontier["choice"]["bound"]["delta_wer_max"]
    swaps = {s["theta"]: s for s in frontier.get("swap_test") or []}
    generation = [(r, r.get("delta_wer"), r.get("delta_wer_ci95")) for r in rows if r.get("delta_wer") is not None
                  or r["method"] == "ar"]
    swapped = [(r, swaps[r["value"]]["delta_wer"], swaps[r["value"]]["delta_wer_ci95"]) for r in rows
               if r["method"] == "pcg" and r["value"] in swaps]
    ys = [1.0] + [v for r in rows for v in [r["speedup_vs_ar"]] + list(r.get("speedup_vs_ar_ci95") or [])]
    y_range = _padded(min(ys), max(ys))
    panel_w, panel_h, left, top, gap = 440, 380, 70, 50, 60
    image = Image.new("RGB", (left + 2 * panel_w + gap + 30, top + panel_h + 60 + 22 * 4), "white")
    draw = ImageDraw.Draw(image)
    panels = ((generation, "generation: change in WER vs ar", left),
              (swapped, "token-swap stress test: change in WER", left + panel_w + gap))
    for points, title, x0 in panels:
        _draw_panel(draw, label_font, points, title, (x0, top, panel_w, panel_h), y_range, bound)
    draw.text((left, 12), "speedup over ar (median, 95% CI) against change in WER (95% CI); ASCII labels: "
                          "pcg points are its theta", fill="black", font=label_font)
    legend = [("pcg over theta", COLOURS["pcg"]), ("sd (exact)", COLOURS["sd"]), ("ssd", COLOURS["ssd"]),
              (f"WER bound +{bound:g}", BOUND_COLOUR)]
    legend_top = top + panel_h + 50
    for i, (name, colour) in enumerate(legend):
        draw.rectangle([left, legend_top + 22 * i, left + 14, legend_top + 12 + 22 * i], fill=colour)
        draw.text((left + 20, legend_top - 2 + 22 * i), name, fill="black", font=label_font)
    image.save(path)


def _draw_panel(draw, font, points, title, box, y_range, bound) -> None:
    """One scatter of (change in WER, speedup) with 95 % bars. points: [(row, delta, ci)]; box: left, top, w, h."""
    left, top, width, height = box
    xs = [0.0, bound] + [v for _, d, ci in points for v in [d, *(ci or [])] if v is not None]
    x_low, x_high = _padded(min(xs), max(xs))
    y_low, y_high = y_range

    def x(v):
        return left + (v - x_low) / (x_high - x_low) * width

    def y(v):
        return top + height - (v - y_low) / (y_high - y_low) * height

    draw.rectangle([left, top, left + width, top + height], outline="black")
    draw.text((left, top - 18), title, fill="black", font=font)
    for tick in _ticks(x_low, x_high):
        draw.line([x(tick), top + height, x(tick), top + height + 4], fill="black")
        draw.text((x(tick) - 16, top + height + 6), f"{tick:+.2f}", fill="black", font=font)
    for tick in _ticks(y_low, y_high):
        draw.line([left - 4, y(tick), left, y(tick)], fill="black")
        draw.text((left - 46, y(tick) - 7), f"{tick:.2f}x", fill="black", font=font)
    draw.line([left, y(1.0), left + width, y(1.0)], fill=(190, 190, 190))
    draw.line([x(0.0), top, x(0.0), top + height], fill=(190, 190, 190))
    for step in range(0, height, 8):  # the WER bound, dashed
        draw.line([x(bound), top + step, x(bound), top + min(height, step + 4)], fill=BOUND_COLOUR)
    pcg = sorted(((r, d) for r, d, _ in points if r["method"] == "pcg" and d is not None), key=lambda t: -t[0]["value"])
    if len(pcg) > 1:
        draw.line([(x(d), y(r["speedup_vs_ar"])) for r, d in pcg], fill=COLOURS["pcg"], width=1)
    for n, (r, delta, ci) in enumerate(points):
        colour = COLOURS.get(r["method"], (0, 0, 0))
        cx, cy = x(delta or 0.0), y(r["speedup_vs_ar"])
        if ci:
            draw.line([x(ci[0]), cy, x(ci[1]), cy], fill=colour)
            for end in ci:
                draw.line([x(end), cy - 4, x(end), cy + 4], fill=colour)
        if r.get("speedup_vs_ar_ci95"):
            low, high = r["speedup_vs_ar_ci95"]
            draw.line([cx, y(low), cx, y(high)], fill=colour)
        draw.ellipse([cx - 5, cy - 5, cx + 5, cy + 5], fill=colour)
        name = f"{r['value']:g}" if r["method"] == "pcg" else r["variant"]  # ASCII: the default font has no Greek
        draw.text((cx + 7, cy - 16 if n % 2 else cy + 2), name, fill=colour, font=font)


def _padded(low: float, high: float) -> tuple[float, float]:
    span = max(high - low, 1e-3)
    return low - 0.08 * span, high + 0.08 * span


def _ticks(low: float, high: float, count: int = 6) -> list[float]:
    """About `count` round tick values inside [low, high]."""
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if m * step >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]
