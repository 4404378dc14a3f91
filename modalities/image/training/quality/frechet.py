"""Fréchet distance between two feature sets (as FID, over the shipped classifier's features instead of
Inception's): |mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a^1/2 S_b S_a^1/2)^1/2), the matrix roots taken by symmetric
eigendecomposition (no complex parts from round-off)."""

from __future__ import annotations

import numpy as np

from specgen.errors import InvalidRequest


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    return (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """a: [N, d], b: [M, d] features."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise InvalidRequest(f"feature sets must be [N, d] with one d, got {a.shape} and {b.shape}")
    if min(len(a), len(b)) < 2:
        raise InvalidRequest("a Fréchet distance needs at least two samples per set")
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root_a = _sqrt_psd(cov_a)
    cross = _sqrt_psd(root_a @ cov_b @ root_a)
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a) + np.trace(cov_b) - 2 * np.trace(cross))
