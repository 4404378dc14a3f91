"""The statistics every benchmark reports: medians, and bootstrap 95 % intervals of a median.

A speedup is a ratio inside one round (a method against `ar` run beside it), so a slow moment of the machine hits
both. Over prompts the unit of resampling is the prompt: repeats of one prompt are summarised by their median
first (`prompt_medians`), then the median over prompts gets its interval (`median_ci`).
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def bootstrap_median_ci(values: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """(median, 2.5 %, 97.5 %) of the median, resampling the values (one per prompt) with replacement."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, len(data), size=(resamples, len(data)))], axis=1)
    return float(np.median(data)), float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def median_ci(values: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
              single: bool = False) -> tuple[float | None, list[float] | None]:
    """(median, [2.5 %, 97.5 %]); (None, None) for no values. One value has no interval unless `single` (then it
    is [value, value], as the text bench records it)."""
    if not values:
        return None, None
    median, low, high = bootstrap_median_ci(list(values), resamples)
    return median, [low, high] if single or len(values) > 1 else None


def prompt_medians(items: list[dict], key: str, prompt_key: str = "prompt_id") -> dict[str, float]:
    """prompt id -> median over repeats of items[key] (prompts where it is missing are left out)."""
    grouped: dict[str, list[float]] = {}
    for item in items:
        if item.get(key) is not None:
            grouped.setdefault(item[prompt_key], []).append(item[key])
    return {pid: float(np.median(v)) for pid, v in grouped.items()}


def median(values) -> float | None:
    """The median of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def slowdowns(per_prompt: list[float]) -> dict:
    """How often a method ran slower than plain decoding: prompts (medians over repeats) with a speedup below 1,
    out of all, and the worst and median per-prompt speedup."""
    values = [v for v in per_prompt if v is not None]
    return {"slower_than_ar": sum(v < 1.0 for v in values), "prompts": len(values),
            "worst_speedup": min(values) if values else None,
            "median_speedup": float(np.median(values)) if values else None}
