"""Hot-path ops of verification, behind one dispatch setting (re-exported as `specgen.kernels`).

Each op has exactly one torch implementation (`kernels.reference`, the specification and the CPU path) and,
where written, a Triton kernel with the same signature (`kernels.triton_ops`). `set_backend` (or the
SPECGEN_KERNELS environment variable) chooses: "auto" (default) runs Triton on CUDA tensors and torch
elsewhere; "torch" always torch; "triton" always Triton (on a CPU only under TRITON_INTERPRET=1, for tests).
Samplers call these names and never keep private copies of the math.
"""

from __future__ import annotations

from importlib.util import find_spec

from specgen import settings
from specgen.kernels import reference

OPS = ("rejection_sample", "greedy_verify", "sample_categorical", "accept_probability", "residual_probs",
       "ancestor_mask", "sibling_step", "tree_children", "tree_rejection_sample", "coupled_resample",
       "gumbel_argmax", "group_mass")
TRITON_OPS = ("rejection_sample", "greedy_verify", "ancestor_mask", "tree_rejection_sample", "coupled_resample",
              "gumbel_argmax", "group_mass")
HAS_TRITON = find_spec("triton") is not None
BACKENDS = ("auto", "torch", "triton")
__all__ = [*OPS, "OPS", "TRITON_OPS", "HAS_TRITON", "BACKENDS", "PLACEHOLDER", "set_backend", "backend"]
_backend: str | None = None  # set_backend's choice; else the SPECGEN_KERNELS setting, read when an op runs


def set_backend(name: str) -> None:
    global _backend
    if name not in BACKENDS:
        from specgen.errors import InvalidRequest

        raise InvalidRequest(f"unknown kernel backend {name!r}; choose from: {', '.join(BACKENDS)}")
    if name == "triton" and not HAS_TRITON:
        from specgen.errors import MissingExtra

        raise MissingExtra("the triton backend needs the triton package")
    _backend = name


def backend() -> str:
    return _backend or settings.get("SPECGEN_KERNELS")


def _triton_module():
    from specgen.kernels import triton_ops  # imported on first use: TRITON_INTERPRET is read at import

    return triton_ops


def _uses_triton(name: str, args) -> bool:
    chosen = backend()
    if name not in TRITON_OPS or not HAS_TRITON or chosen == "torch":
        return False
    if chosen == "triton":
        return True
    return any(getattr(a, "is_cuda", False) for a in args)  # auto: CUDA tensors go to Triton


def _op(name: str):
    def dispatched(*args, **kwargs):
        module = _triton_module() if _uses_triton(name, args) else reference
        return getattr(module, name)(*args, **kwargs)

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
coupled_resample = _op("coupled_resample")
gumbel_argmax = _op("gumbel_argmax")
group_mass = _op("group_mass")
PLACEHOLDER = reference.PLACEHOLDER
