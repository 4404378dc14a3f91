"""Hot-path ops of verification, behind one dispatch setting.

Each op has exactly one torch implementation (`kernels.reference`, the specification). Triton kernels join
them with the same signatures; `set_backend("torch" | "triton" | "auto")` (or SPECGEN_KERNELS) chooses.
Samplers call these names and never keep private copies of the math.
"""

from __future__ import annotations

import os

from specgen.kernels import reference

OPS = ("rejection_sample", "greedy_verify", "sample_categorical", "accept_probability", "residual_probs", "ancestor_mask",
       "sibling_step", "tree_children", "tree_rejection_sample")
_BACKENDS = {"torch": reference}
_backend = os.environ.get("SPECGEN_KERNELS", "torch")


def set_backend(name: str) -> None:
    """Choose the implementation for every op ("auto" = the fastest available, today torch)."""
    global _backend
    if name not in (*_BACKENDS, "auto"):
        from specgen.errors import InvalidRequest

        raise InvalidRequest(f"unknown kernel backend {name!r}; available: {', '.join(_BACKENDS)}, auto")
    _backend = name


def backend() -> str:
    return "torch" if _backend == "auto" or _backend not in _BACKENDS else _backend


def _op(name: str):
    def dispatched(*args, **kwargs):
        return getattr(_BACKENDS[backend()], name)(*args, **kwargs)

    dispatched.__name__ = name
    dispatched.__doc__ = getattr(reference, name).__doc__
    return dispatched


rejection_sample = _op("rejection_sample")
greedy_verify = _op("greedy_verify")
sample_categorical = _op("sample_categorical")
accept_probability = _op("accept_probability")
residual_probs = _op("residual_probs")
ancestor_mask = _op("ancestor_mask")
sibling_step = _op("sibling_step")
tree_children = _op("tree_children")
tree_rejection_sample = _op("tree_rejection_sample")
PLACEHOLDER = reference.PLACEHOLDER
