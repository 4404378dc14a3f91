"""What the server has served, as plain numbers that add up across replicas, rendered in Prometheus' text format.

The speculative-decoding counters carry vLLM's names under our prefix (`specgen:spec_decode_num_drafts_total`,
`..._num_draft_tokens_total`, `..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total`), so a
dashboard built for vLLM needs only the prefix changed. Ours beside them, per method: τ, α̂, the ideal and measured
predicted speedups (the formulas of `specgen.samplers.stats`) and the measured one: committed tokens per second of
decoding against one plain decoding step at a time. Standard library only.
"""

from __future__ import annotations

import threading
from collections import defaultdict

PREFIX = "specgen:"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
HISTOGRAMS = {  # name -> (buckets, help)
    "e2e_request_latency_seconds": (LATENCY_BUCKETS, "a choice's latency: its arrival to its last token"),
    "time_to_first_token_seconds": (LATENCY_BUCKETS, "a choice's arrival to its first committed token"),
    "time_per_output_token_seconds": (TOKEN_BUCKETS, "per request: (latency - time to first token) / (tokens - 1)"),
}
COUNTERS = {
    "spec_decode_num_drafts": "row steps that verified at least one drafted token",
    "spec_decode_num_draft_tokens": "drafted tokens",
    "spec_decode_num_accepted_tokens": "accepted drafted tokens",
    "spec_decode_num_accepted_tokens_per_pos": "accepted drafted tokens at each draft position (0 = first)",
    "prompt_tokens": "prompt tokens admitted",
    "generation_tokens": "completion tokens sent",
    "request_success": "finished requests (choices) by finish reason",
    "request_cancelled": "requests (choices) cancelled before they finished",
}
# per method: the sums the gauges are computed from
STAT_FIELDS = ("row_steps", "drafted", "accepted", "rejections", "committed", "steps", "draft_s", "verify_s")


class Metrics:
    """Updated by the decode thread, read by the HTTP front (`snapshot`)."""

    def __init__(self, ar_step_s: float | None = None):
        self.lock = threading.Lock()
        self.ar_step_s = ar_step_s  # one plain decoding step of the served model, measured at start-up
        self.counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self.histograms = {name: ([0] * (len(buckets) + 1), [0.0]) for name, (buckets, _) in HISTOGRAMS.items()}
        self.stats: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(STAT_FIELDS, 0.0))

    def count(self, name: str, value: float = 1.0, **labels) -> None:
        with self.lock:
            self.counters[name][tuple(sorted(labels.items()))] += value

    def observe(self, name: str, value: float) -> None:
        buckets = HISTOGRAMS[name][0]
        with self.lock:
            counts, total = self.histograms[name]
            counts[sum(1 for b in buckets if value > b)] += 1
            total[0] += value

    def row_step(self, method: str, drafted: int, accepted: int, committed: int) -> None:
        """One row's share of one step."""
        with self.lock:
            s = self.stats[method]
            s["row_steps"] += 1
            s["drafted"] += drafted
            s["accepted"] += accepted
            s["rejections"] += accepted < drafted
            s["committed"] += committed
            if drafted:
                self.counters["spec_decode_num_drafts"][(("method", method),)] += 1
                self.counters["spec_decode_num_draft_tokens"][(("method", method),)] += drafted
                self.counters["spec_decode_num_accepted_tokens"][(("method", method),)] += accepted
                for position in range(accepted):
                    self.counters["spec_decode_num_accepted_tokens_per_pos"][
                        (("method", method), ("position", str(position)))] += 1

    def step(self, method: str, draft_s: float, verify_s: float) -> None:
        """One batch step's timings (a step serves all of its lane's rows)."""
        with self.lock:
            s = self.stats[method]
            s["steps"] += 1
            s["draft_s"] += draft_s
            s["verify_s"] += verify_s

    def snapshot(self) -> dict:
        with self.lock:
            return {"counters": {n: dict(v) for n, v in self.counters.items()},
                    "histograms": {n: (list(c), t[0]) for n, (c, t) in self.histograms.items()},
                    "stats": {m: dict(s) for m, s in self.stats.items()}, "ar_step_s": self.ar_step_s}


def merge(snapshots: list[dict]) -> dict:
    """Replicas' snapshots added up (their plain step times averaged)."""
    counters: dict = defaultdict(lambda: defaultdict(float))
    histograms: dict = {}
    stats: dict = defaultdict(lambda: dict.fromkeys(STAT_FIELDS, 0.0))
    for snap in snapshots:
        for name, series in snap["counters"].items():
            for labels, value in series.items():
                counters[name][labels] += value
        for name, (counts, total) in snap["histograms"].items():
            old = histograms.get(name, ([0] * len(counts), 0.0))
            histograms[name] = ([a + b for a, b in zip(old[0], counts)], old[1] + total)
        for method, sums in snap["stats"].items():
            for key, value in sums.items():
                stats[method][key] += value
    steps = [s["ar_step_s"] for s in snapshots if s.get("ar_step_s")]
    return {"counters": counters, "histograms": histograms, "stats": stats,
            "ar_step_s": sum(steps) / len(steps) if steps else None}


def gauges(sums: dict, ar_step_s: float | None) -> dict:
    """τ, α̂ and the speedups of one method's sums (None where undefined)."""
    from specgen.samplers.stats import expected_tokens_per_step

    tested = sums["accepted"] + sums["rejections"]
    alpha = sums["accepted"] / tested if tested else None
    gamma = sums["drafted"] / sums["row_steps"] if sums["row_steps"] else 0.0
    step_s = sums["verify_s"] / sums["steps"] if sums["steps"] else None
    draft_token_s = sums["draft_s"] / sums["drafted"] if sums["drafted"] else 0.0
    out = {"tau": sums["committed"] / sums["row_steps"] if sums["row_steps"] else None, "alpha_hat": alpha,
           "predicted_speedup_ideal": None, "predicted_speedup_measured": None, "speedup_measured": None}
    if alpha is not None and step_s:
        expected = expected_tokens_per_step(alpha, gamma)
        out["predicted_speedup_ideal"] = expected / (gamma * draft_token_s / (ar_step_s or step_s) + 1.0)
        if ar_step_s:
            out["predicted_speedup_measured"] = expected * ar_step_s / (gamma * draft_token_s + step_s)
    busy = sums["draft_s"] + sums["verify_s"]
    if ar_step_s and busy:
        out["speedup_measured"] = sums["committed"] * ar_step_s / busy
    return out


GAUGES = {
    "tau": "mean accepted length: committed tokens per row step",
    "alpha_hat": "per-token acceptance estimate: accepted / (accepted + rejections)",
    "predicted_speedup_ideal": "Leviathan's formula from alpha_hat, the mean draft length and the draft/plain cost "
                               "ratio",
    "predicted_speedup_measured": "E(alpha_hat, gamma) * T_plain / (gamma * T_draft + T_verify), measured times",
    "speedup_measured": "committed tokens per second of decoding x one plain step's time (batching included)",
}


def render(snap: dict) -> str:
    lines: list[str] = []

    def header(name: str, kind: str, help_text: str) -> None:
        lines.extend([f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"])

    for name, help_text in COUNTERS.items():
        header(name, "counter", help_text)
        for labels, value in sorted(snap["counters"].get(name, {}).items(), key=lambda kv: _label_order(kv[0])):
            lines.append(f"{PREFIX}{name}_total{_labels(labels)} {_number(value)}")
    for name, help_text in GAUGES.items():
        header(name, "gauge", help_text)
        for method, sums in sorted(snap["stats"].items()):
            value = gauges(sums, snap.get("ar_step_s"))[name]
            if value is not None:
                lines.append(f"{PREFIX}{name}{_labels((('method', method),))} {_number(value)}")
    for name, (buckets, help_text) in HISTOGRAMS.items():
        header(name, "histogram", help_text)
        counts, total = snap["histograms"].get(name, ([0] * (len(buckets) + 1), 0.0))
        running = 0
        for bound, count in zip(list(buckets) + ["+Inf"], counts):
            running += count
            lines.append(f'{PREFIX}{name}_bucket{{le="{bound}"}} {running}')
        lines += [f"{PREFIX}{name}_sum {_number(total)}", f"{PREFIX}{name}_count {running}"]
    return "\n".join(lines) + "\n"


def _label_order(labels: tuple) -> tuple:
    return tuple((k, int(v) if k == "position" else v) for k, v in labels)


def _labels(labels: tuple) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels)
    return "{" + ",".join(escaped) + "}"


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))
