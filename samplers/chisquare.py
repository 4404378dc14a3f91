"""Goodness of fit of sampled sequences against an exact distribution (core.md section 11, layer 2).

Pearson's chi-square with pooled cells (cells expected below `min_expected` are merged into one) and the
total-variation distance. The p-value uses the regularised upper incomplete gamma function from torch, so
the core needs no scipy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FitResult:
    chi2: float
    dof: int
    p_value: float
    tv: float
    samples: int


def goodness_of_fit(samples: list[tuple], expected: dict[tuple, float], min_expected: float = 5.0) -> FitResult:
    counts = Counter(samples)
    n = len(samples)
    cells = set(expected) | set(counts)
    tv = 0.5 * sum(abs(counts.get(c, 0) / n - expected.get(c, 0.0)) for c in cells)
    observed, predicted, pooled_obs, pooled_exp = [], [], 0.0, 0.0
    for cell in cells:
        e = expected.get(cell, 0.0) * n
        if e < min_expected:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += e
        else:
            observed.append(counts.get(cell, 0))
            predicted.append(e)
    if pooled_exp > 0 or pooled_obs > 0:
        observed.append(pooled_obs)
        predicted.append(max(pooled_exp, 1e-12))  # an observed count where nothing was expected is a huge chi2
    obs, exp = torch.tensor(observed, dtype=torch.float64), torch.tensor(predicted, dtype=torch.float64)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = max(len(observed) - 1, 1)
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(chi2 / 2, dtype=torch.float64)))
    return FitResult(chi2, dof, p_value, tv, n)
